package oci

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
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

// TestWriteLayoutSharesTheBase: images over one base layer hold it once in
// the layout folder, each manifest names it first, and index.json names
// each image as REPOSITORY:TAG; an image without a tag is refused before
// anything is written.
func TestWriteLayoutSharesTheBase(t *testing.T) {
	dir := t.TempDir()
	base := bytes.Repeat([]byte("debian"), 1000)
	assert.NilError(t, WriteLayout(dir, []Image{
		{Name: "e2e-test-images/agnhost:2.66.1", Base: base, Files: map[string][]byte{"agnhost": []byte("a")}, Dirs: []string{"uploads"}},
		{Name: "e2e-test-images/nginx:1.27.0-2", Base: base, Cmd: []string{"nginx", "-g", "daemon off;"}},
	}))
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &index))
	var names []string
	for _, m := range index.Manifests {
		names = append(names, m.Annotations["org.opencontainers.image.ref.name"])
		mb, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(m.Digest, "sha256:")))
		assert.NilError(t, err)
		var manifest struct{ Layers []struct{ Digest string } }
		assert.NilError(t, json.Unmarshal(mb, &manifest))
		assert.Equal(t, manifest.Layers[0].Digest, digest(base), "%s's first layer", names[len(names)-1])
	}
	assert.DeepEqual(t, names, []string{"e2e-test-images/agnhost:2.66.1", "e2e-test-images/nginx:1.27.0-2"})
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	assert.NilError(t, err)
	// The base once, then per image a manifest, a configuration and a
	// layer of its own.
	assert.Equal(t, len(blobs), 1+2*3)

	empty := t.TempDir()
	err = WriteLayout(empty, []Image{{Name: "pause:3.10.2"}, {Name: "e2e-test-images/agnhost"}})
	assert.ErrorContains(t, err, `image name "e2e-test-images/agnhost" has no tag`)
	left, _ := os.ReadDir(empty)
	assert.Equal(t, len(left), 0, "a refused image writes nothing")
}
