package oci

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gotest.tools/v3/assert"
)

// TestWriteImportableLayout: the archive is an OCI image layout whose
// index names the image as containerd's import reads it, and every
// descriptor's digest and size match the blob it points at.
func TestWriteImportableLayout(t *testing.T) {
	var buf bytes.Buffer
	img := Image{Name: "liken.sh/pause:3.10", Files: map[string][]byte{"pause": []byte("binary")}, Entrypoint: []string{"/pause"}, User: "65532:65532"}
	assert.NilError(t, img.Write(&buf))

	files := map[string][]byte{}
	for _, e := range readTar(t, buf.Bytes()) {
		files[e.name] = []byte(e.body)
	}
	assert.Equal(t, string(files["oci-layout"]), `{"imageLayoutVersion":"1.0.0"}`)

	type desc struct {
		MediaType   string
		Digest      string
		Size        int
		Annotations map[string]string
	}
	blob := func(d desc) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+d.Digest[len("sha256:"):]]
		assert.Assert(t, ok, "no blob for %s", d.Digest)
		assert.Equal(t, len(b), d.Size)
		assert.Equal(t, digest(b), d.Digest)
		return b
	}
	var index struct{ Manifests []desc }
	assert.NilError(t, json.Unmarshal(files["index.json"], &index))
	assert.Equal(t, len(index.Manifests), 1)
	assert.Equal(t, index.Manifests[0].Annotations["io.containerd.image.name"], "liken.sh/pause:3.10")
	assert.Equal(t, index.Manifests[0].Annotations["org.opencontainers.image.ref.name"], "3.10")

	var manifest struct {
		Config desc
		Layers []desc
	}
	assert.NilError(t, json.Unmarshal(blob(index.Manifests[0]), &manifest))
	var config struct {
		Config struct {
			Entrypoint []string
			User       string
		}
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	assert.NilError(t, json.Unmarshal(blob(manifest.Config), &config))
	assert.DeepEqual(t, config.Config.Entrypoint, []string{"/pause"})
	assert.Equal(t, config.Config.User, "65532:65532")
	assert.Equal(t, len(manifest.Layers), 1)
	layer := blob(manifest.Layers[0])
	assert.DeepEqual(t, config.RootFS.DiffIDs, []string{manifest.Layers[0].Digest})

	lr := tar.NewReader(bytes.NewReader(layer))
	h, err := lr.Next()
	assert.NilError(t, err)
	assert.Equal(t, h.Name, "pause")
	assert.Equal(t, h.Mode, int64(0o755))
	b, err := io.ReadAll(lr)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "binary")
}

func TestWriteRefusesNameWithoutTag(t *testing.T) {
	err := Image{Name: "localhost:5000/pause", Files: map[string][]byte{"p": nil}}.Write(io.Discard)
	assert.ErrorContains(t, err, `image name "localhost:5000/pause" has no tag`)
}

// TestWriteDataFiles: a data file lands readable and not executable, under
// folders of its own, next to the executable entry point.
func TestWriteDataFiles(t *testing.T) {
	var buf bytes.Buffer
	img := Image{Name: "liken.sh/op:1", Files: map[string][]byte{"op": []byte("binary")},
		Data: map[string][]byte{"etc/ssl/certs/ca-certificates.crt": []byte("CAs")}, Entrypoint: []string{"/op"}}
	assert.NilError(t, img.Write(&buf))
	var layer []byte
	for _, e := range readTar(t, buf.Bytes()) {
		if strings.HasPrefix(e.name, "blobs/") && !strings.HasPrefix(e.body, "{") {
			layer = []byte(e.body)
		}
	}
	assert.Assert(t, layer != nil)
	got := map[string]tarEntry{}
	for _, e := range readTar(t, layer) {
		got[e.name] = tarEntry{mode: e.mode, dir: e.dir, body: e.body}
	}
	assert.DeepEqual(t, got, map[string]tarEntry{
		"etc/":                              {mode: 0o755, dir: true},
		"etc/ssl/":                          {mode: 0o755, dir: true},
		"etc/ssl/certs/":                    {mode: 0o755, dir: true},
		"etc/ssl/certs/ca-certificates.crt": {mode: 0o644, body: "CAs"},
		"op":                                {mode: 0o755, body: "binary"},
	}, cmp.AllowUnexported(tarEntry{}))
}

// tarEntry is one entry of a tar archive, as readTar reads it.
type tarEntry struct {
	name string
	mode int64
	dir  bool
	body string
}

// readTar reads every entry of the tar archive b, in order.
func readTar(t *testing.T, b []byte) []tarEntry {
	t.Helper()
	var out []tarEntry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		assert.NilError(t, err)
		body, err := io.ReadAll(tr)
		assert.NilError(t, err)
		out = append(out, tarEntry{name: h.Name, mode: h.Mode, dir: h.Typeflag == tar.TypeDir, body: string(body)})
	}
}
