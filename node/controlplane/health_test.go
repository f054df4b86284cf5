package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// TestSafeToStopAlone: a fleet of one leader has no majority to keep: its
// leader may go down even while its etcd does not answer.
func TestSafeToStopAlone(t *testing.T) {
	h := &Health{Machine: "l1", SetupDir: t.TempDir(), Etcd: "https://127.0.0.1:1"}
	assert.NilError(t, h.SafeToStop(context.Background()))
}

func TestFailedChecks(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[+]ping ok\n[-]etcd failed: reason withheld\n[-]poststarthook/rbac failed: not finished\nreadyz check failed\n", "etcd failed: reason withheld; poststarthook/rbac failed: not finished"},
		{"shutting down", "shutting down"},
	} {
		assert.Equal(t, failedChecks([]byte(tc.body)), tc.want)
	}
}

// TestSplitFrom: only a peer answering for another datastore at least as
// large as this leader's (members l1) makes it unhealthy, and only a
// strictly larger one stops its API server; a peer of the same datastore,
// a smaller one, a silent one or one that does not say its ID prove
// nothing.
func TestSplitFrom(t *testing.T) {
	gateway := func(cluster string, names ...string) string {
		var ms []string
		for i, n := range names {
			ms = append(ms, fmt.Sprintf(`{"ID":"%d","name":%q,"peerURLs":["https://%s:2380"],"clientURLs":["https://%s:2379"]}`, i+1, n, n, n))
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `{"header":{"cluster_id":%q},"members":[%s]}`, cluster, strings.Join(ms, ","))
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	silent := httptest.NewServer(http.NotFoundHandler())
	silent.Close()
	ours := []Member{{ID: 1, Name: "l1"}}
	for _, tc := range []struct {
		name   string
		peer   string
		peers  []string // instead of peer
		want   string   // "" for healthy
		fenced bool
	}{
		{name: "same datastore", peer: gateway("100", "l1", "l2", "l3")},
		{name: "a smaller other datastore", peer: gateway("200")},
		{name: "a silent peer", peer: silent.URL},
		{name: "no cluster ID", peer: gateway("", "l1", "l2", "l3")},
		{name: "a larger other datastore", peer: gateway("200", "l1", "l2", "l3"), fenced: true,
			want: "two datastores: this leader's etcd member belongs to datastore 64 (members: l1), but the leader at PEER answers for datastore c8 (members: l1, l2, l3). This leader started a new one alone"},
		{name: "a majority of the fleet's leaders answer for this one: a larger other datastore is not the fleet's", peers: []string{gateway("100", "l1", "l2"), gateway("200", "l1", "l2", "l3", "l4")}},
		{name: "as large, but a majority of the fleet's leaders answer for the other", peers: func() []string { p := gateway("200", "l2"); return []string{p, p} }(), fenced: true,
			want: "two datastores: this leader's etcd member belongs to datastore 64 (members: l1), but the leaders at PEER, PEER answer for datastore c8 (members: l2). This leader started a new one alone"},
		{name: "as large as this one", peer: gateway("200", "l2"),
			want: "two datastores: this leader's etcd member belongs to datastore 64 (members: l1), but the leader at PEER answers for datastore c8 (members: l2). The two are as large, so neither leader stops its API server. Install again the leaders whose datastore is not the fleet's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fenced := false
			peers := tc.peers
			if peers == nil {
				peers = []string{tc.peer}
			}
			h := &Health{Peers: peers, Fence: func(context.Context) error { fenced = true; return nil }}
			err := h.splitFrom(context.Background(), &EtcdClient{HTTP: http.DefaultClient, Timeout: time.Second}, 100, ours)
			if tc.want == "" {
				assert.NilError(t, err)
			} else {
				assert.ErrorContains(t, err, strings.ReplaceAll(tc.want, "PEER", peers[0]))
				// Only a split off the fleet's keeps the API server from
				// starting (SplitCheck); a tie stops neither.
				assert.Equal(t, errors.Is(err, ErrSplit), tc.fenced)
			}
			assert.Equal(t, fenced, tc.fenced)
		})
	}
}
