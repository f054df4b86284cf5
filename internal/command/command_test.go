package command

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestRESTConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "kubeconfig")
	assert.NilError(t, os.WriteFile(good, []byte(kubeconfig), 0o600))
	bad := filepath.Join(dir, "bad")
	assert.NilError(t, os.WriteFile(bad, []byte("clusters: [\n"), 0o600))

	for _, tc := range []struct {
		name, path, env string
		wantHost        string
		wantErr         string
	}{
		{name: "the file given", path: good, wantHost: "https://10.0.0.1:6443"},
		{name: "the file KUBECONFIG names", env: good, wantHost: "https://10.0.0.1:6443"},
		{name: "nothing outside a pod", wantErr: "no kubeconfig given and not running in a pod: pass --kubeconfig"},
		{name: "a file that is not there", path: filepath.Join(dir, "nope"), wantErr: "loading the kubeconfig " + filepath.Join(dir, "nope")},
		{name: "a damaged file", path: bad, wantErr: "loading the kubeconfig " + bad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("HOME", dir)
			cfg, err := RESTConfig(tc.path, "test/1")
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, cfg.Host, tc.wantHost)
			assert.Equal(t, cfg.UserAgent, "test/1")
			assert.Equal(t, cfg.BearerToken, "secret")
		})
	}
}
