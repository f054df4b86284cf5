package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// apiStub serves /readyz over TLS with the API server certificate Setup
// made in setupDir, as the leader's kube-apiserver would: 200 when ready
// is true, else 500 with a failed check, in kube-apiserver's words.
func apiStub(t *testing.T, setupDir string) (string, *atomic.Bool) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(setupDir, APIServer.Cert()), filepath.Join(setupDir, APIServer.Key()))
	assert.NilError(t, err)
	ready := &atomic.Bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "[+]ping ok\n[-]etcd failed: reason withheld\n[+]informer-sync ok\nreadyz check failed\n")
			return
		}
		fmt.Fprint(w, "ok")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, ready
}

// health is leader l's control-plane check, its API server apiURL.
func (l *etcdLeader) health(apiURL string) *Health {
	return &Health{Machine: l.name, SetupDir: l.setupDir, Etcd: l.clientURL, APIServer: apiURL, Peers: l.others, Timeout: 2 * time.Second}
}

// TestHealthWithoutSetup: a leader whose setup has not run yet (liken-node
// starts beside it at boot) is not healthy, and the error says why.
func TestHealthWithoutSetup(t *testing.T) {
	h := &Health{Machine: "l1", SetupDir: t.TempDir()}
	assert.ErrorContains(t, h.Check(context.Background()), "the control plane's certificates are not ready (liken-control-plane-setup.service makes them at boot)")
}

func TestFailedChecks(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[+]ping ok\n[-]etcd failed: reason withheld\n[-]poststarthook/rbac failed: not finished\nreadyz check failed\n", "etcd failed: reason withheld; poststarthook/rbac failed: not finished"},
		{"shutting down", "shutting down"},
	} {
		assert.Equal(t, failedChecks([]byte(tc.body)), tc.want)
	}
}
