package apiprobe

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/node/controlplane"
)

// gateway serves etcd's member list and /health as a member answers
// them.
func gateway(t *testing.T, members string, healthCode int, health string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/cluster/member/list", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, members)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(healthCode)
		fmt.Fprint(w, health)
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// TestDatastore: one line per member, sorted by URL, with the members it
// lists (voter, learner, not started) and its health, or its errors.
func TestDatastore(t *testing.T) {
	// The third member's ID is 0x8e9e05c52164694d.
	list := `{"members":[
		{"ID":"11","name":"vm-1","peerURLs":["https://10.0.2.15:2380"],"clientURLs":["https://10.0.2.15:2379"]},
		{"ID":"12","name":"vm-2","peerURLs":["https://10.0.2.16:2380"],"clientURLs":["https://10.0.2.16:2379"],"isLearner":true},
		{"ID":"10276657743932975437","peerURLs":["https://10.0.2.17:2380"],"isLearner":true}]}`
	healthy := gateway(t, list, http.StatusOK, `{"health":"true","reason":""}`)
	noLeader := gateway(t, list, http.StatusServiceUnavailable, `{"health":"false","reason":"RAFT NO LEADER"}`)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()

	c := &controlplane.EtcdClient{HTTP: http.DefaultClient}
	got := Datastore(context.Background(), map[string]*controlplane.EtcdClient{healthy.URL: c, noLeader.URL: c, gone.URL: c})

	want := map[string]string{
		healthy.URL:  healthy.URL + ": 3 members: vm-1 voter, vm-2 learner, 8e9e05c52164694d learner (not started); healthy",
		noLeader.URL: noLeader.URL + ": 3 members: vm-1 voter, vm-2 learner, 8e9e05c52164694d learner (not started); unhealthy: etcd at " + noLeader.URL + " is unhealthy (HTTP 503): RAFT NO LEADER",
	}
	lines := strings.Split(got, "\n")
	assert.Assert(t, is.Len(lines, 3), got)
	for i, l := range lines {
		if i > 0 {
			assert.Check(t, lines[i-1] < l, "lines sorted by URL:\n%s", got)
		}
		u, _, _ := strings.Cut(l, ": ")
		if w, ok := want[u]; ok {
			assert.Check(t, is.Equal(l, w))
			continue
		}
		assert.Equal(t, u, gone.URL)
		assert.Check(t, is.Contains(l, ": members: etcd at "+gone.URL+"/v3/cluster/member/list"))
		assert.Check(t, is.Contains(l, "; unhealthy: etcd health at "+gone.URL+"/health"))
		assert.Check(t, is.Contains(l, "connection refused"))
	}
}
