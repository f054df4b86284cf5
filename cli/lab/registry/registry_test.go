package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"liken.sh/liken/image/oci"
)

// TestPullFromLayout: a client pulls, as containerd does, an image that
// oci.WriteLayout wrote into the folder while the registry ran: its
// manifest by tag and by digest, each blob the manifest names, every body
// matching its digest; a name the layout lacks is a 404 that names it, and
// a push is refused.
func TestPullFromLayout(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewServer(Handler{Dir: dir})
	t.Cleanup(srv.Close)
	get := func(method, path string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		assert.NilError(t, err)
		resp, err := srv.Client().Do(req)
		assert.NilError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		assert.NilError(t, err)
		return resp, b
	}
	sum := func(b []byte) string {
		s := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(s[:])
	}

	resp, _ := get(http.MethodGet, "/v2/")
	assert.Equal(t, resp.StatusCode, http.StatusOK)
	resp, b := get(http.MethodGet, "/v2/e2e-test-images/agnhost/manifests/2.66.1")
	assert.Equal(t, resp.StatusCode, http.StatusNotFound, "an empty folder serves nothing")
	assert.Assert(t, strings.Contains(string(b), "e2e-test-images/agnhost:2.66.1 is not in the lab's registry"), string(b))

	base := []byte("a base layer's bytes")
	assert.NilError(t, oci.WriteLayout(dir, []oci.Image{
		{Name: "e2e-test-images/agnhost:2.66.1", Base: base, Files: map[string][]byte{"agnhost": []byte("binary")}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		{Name: "pause:3.10.2", Files: map[string][]byte{"pause": []byte("pause")}, Entrypoint: []string{"/pause"}},
	}))

	resp, manifest := get(http.MethodGet, "/v2/e2e-test-images/agnhost/manifests/2.66.1")
	assert.Equal(t, resp.StatusCode, http.StatusOK)
	assert.Equal(t, resp.Header.Get("Content-Type"), "application/vnd.oci.image.manifest.v1+json")
	d := resp.Header.Get("Docker-Content-Digest")
	assert.Equal(t, d, sum(manifest))
	resp, byDigest := get(http.MethodGet, "/v2/e2e-test-images/agnhost/manifests/"+d)
	assert.Equal(t, resp.StatusCode, http.StatusOK)
	assert.DeepEqual(t, byDigest, manifest)
	resp, _ = get(http.MethodHead, "/v2/e2e-test-images/agnhost/manifests/2.66.1")
	assert.Equal(t, resp.StatusCode, http.StatusOK)
	assert.Equal(t, resp.ContentLength, int64(len(manifest)))

	var m struct {
		Config struct{ Digest string }
		Layers []struct {
			Digest string
			Size   int
		}
	}
	assert.NilError(t, json.Unmarshal(manifest, &m))
	assert.Equal(t, len(m.Layers), 2)
	assert.Equal(t, m.Layers[0].Digest, sum(base), "the base layer comes first")
	var config struct {
		Config struct{ Entrypoint, Cmd []string }
	}
	for _, want := range []string{m.Config.Digest, m.Layers[0].Digest, m.Layers[1].Digest} {
		resp, b := get(http.MethodGet, "/v2/e2e-test-images/agnhost/blobs/"+want)
		assert.Equal(t, resp.StatusCode, http.StatusOK)
		assert.Equal(t, sum(b), want)
		if want == m.Config.Digest {
			assert.NilError(t, json.Unmarshal(b, &config))
		}
	}
	assert.DeepEqual(t, config.Config.Entrypoint, []string{"/agnhost"})
	assert.DeepEqual(t, config.Config.Cmd, []string{"pause"})

	resp, _ = get(http.MethodGet, "/v2/pause/manifests/3.10.2")
	assert.Equal(t, resp.StatusCode, http.StatusOK, "a repository without a folder")
	resp, _ = get(http.MethodGet, "/v2/e2e-test-images/agnhost/manifests/2.55")
	assert.Equal(t, resp.StatusCode, http.StatusNotFound, "another tag")
	resp, _ = get(http.MethodGet, "/v2/other/manifests/"+d)
	assert.Equal(t, resp.StatusCode, http.StatusNotFound, "the digest under another repository")
	resp, b = get(http.MethodGet, "/v2/e2e-test-images/agnhost/blobs/sha256:../../index.json")
	assert.Equal(t, resp.StatusCode, http.StatusBadRequest, "not a digest: %s", b)
	resp, b = get(http.MethodPut, "/v2/e2e-test-images/agnhost/manifests/2.66.1")
	assert.Equal(t, resp.StatusCode, http.StatusMethodNotAllowed)
	assert.Assert(t, strings.Contains(string(b), "read-only"), string(b))
}
