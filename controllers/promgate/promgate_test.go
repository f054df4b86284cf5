package promgate

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
)

// server answers /api/v1/alerts with what its answer field holds, in
// Prometheus's format.
type server struct {
	mu     sync.Mutex
	status int
	answer string
	block  bool // never answer (until the request ends)
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/alerts" {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	status, answer, block := s.status, s.answer, s.block
	s.mu.Unlock()
	if block {
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(answer))
}

func (s *server) set(status int, answer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.answer, s.block = status, answer, false
}

const (
	noAlerts = `{"status":"success","data":{"alerts":[]}}`
	firing   = `{"status":"success","data":{"alerts":[` +
		`{"labels":{"alertname":"KubeNodeNotReady","node":"a"},"annotations":{},"state":"firing","activeAt":"2026-12-01T00:00:00Z","value":"1e+00"},` +
		`{"labels":{"alertname":"KubeNodeNotReady","node":"b"},"annotations":{},"state":"firing","activeAt":"2026-12-01T00:00:00Z","value":"1e+00"},` +
		`{"labels":{"alertname":"EtcdMembersDown"},"annotations":{},"state":"pending","activeAt":"2026-12-01T00:00:00Z","value":"1e+00"},` +
		`{"labels":{"alertname":"Watchdog"},"annotations":{},"state":"firing","activeAt":"2026-12-01T00:00:00Z","value":"1e+00"}]}}`
)

func clusterWith(gates ...likenv1.Gate) *likenv1.Cluster {
	return &likenv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "lab"}, Spec: likenv1.ClusterSpec{Disruption: likenv1.DisruptionSpec{Gates: gates}}}
}

func promGate(url, alerts string) likenv1.Gate {
	return likenv1.Gate{Prometheus: &likenv1.PrometheusGate{URL: url, Alerts: alerts, Timeout: &metav1.Duration{Duration: 200 * time.Millisecond}}}
}

func newProber(t *testing.T, c *likenv1.Cluster, clk *clocktesting.FakeClock, changed func(string)) *Prober {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	assert.NilError(t, idx.Add(c))
	return New(likenlisters.NewClusterLister(idx), nil, clk, changed)
}

func TestProbe(t *testing.T) {
	srv := &server{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	cases := []struct {
		name   string
		alerts string
		status int
		answer string
		block  bool
		want   string // "" when open
	}{
		{name: "no alert fires", answer: noAlerts, status: 200},
		{name: "any firing alert shuts a gate without a pattern", answer: firing, status: 200,
			want: "alerts fire on " + ts.URL + ": KubeNodeNotReady, Watchdog"},
		{name: "only alerts whose whole name matches shut it; pending ones do not", alerts: "Kube.*|Etcd.*", answer: firing, status: 200,
			want: "alerts fire on " + ts.URL + ": KubeNodeNotReady"},
		{name: "a pattern that matches only part of a name does not", alerts: "Kube", answer: firing, status: 200},
		{name: "a server that does not answer in time shuts it", block: true,
			want: "Prometheus did not answer at " + ts.URL + "/api/v1/alerts within 200ms"},
		{name: "an error answer shuts it", status: 503, answer: `{"status":"error","error":"rule manager not ready"}`,
			want: ts.URL + "/api/v1/alerts answered 503 Service Unavailable, not Prometheus's list of alerts: rule manager not ready"},
		{name: "something that is not Prometheus shuts it", status: 200, answer: `<html>hello</html>`,
			want: "not Prometheus's list of alerts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.set(tc.status, tc.answer)
			srv.mu.Lock()
			srv.block = tc.block
			srv.mu.Unlock()
			c := clusterWith(promGate(ts.URL, tc.alerts))
			p := newProber(t, c, clocktesting.NewFakeClock(time.Now()), nil)
			p.ProbeAll(context.Background())
			closed := p.Closed(c)
			if tc.want == "" {
				assert.Check(t, is.Len(closed, 0), "%v", closed)
				return
			}
			assert.Assert(t, is.Len(closed, 1))
			assert.Check(t, is.Equal(closed[0].Gate, 0))
			assert.Check(t, is.Contains(closed[0].Why, tc.want))
		})
	}
}

func TestClosedBeforeTheFirstReadAndWhenStale(t *testing.T) {
	srv := &server{status: 200, answer: noAlerts}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	clk := clocktesting.NewFakeClock(time.Now())
	c := clusterWith(likenv1.Gate{BlockingPods: &likenv1.BlockingPodsGate{}}, promGate(ts.URL, ""))
	var changes []string
	p := newProber(t, c, clk, func(cluster string) { changes = append(changes, cluster) })

	closed := p.Closed(c)
	assert.Assert(t, is.Len(closed, 1))
	assert.Check(t, is.Equal(closed[0].Gate, 1))
	assert.Check(t, is.Contains(closed[0].Why, "has not read "+ts.URL+" yet"))

	p.ProbeAll(context.Background())
	assert.Check(t, is.Len(p.Closed(c), 0))
	assert.Check(t, is.DeepEqual(changes, []string{"lab"}))
	p.ProbeAll(context.Background())
	assert.Check(t, is.DeepEqual(changes, []string{"lab"}), "no change, no new decision")

	srv.set(200, firing)
	p.ProbeAll(context.Background())
	assert.Check(t, is.Len(p.Closed(c), 1))
	assert.Check(t, is.DeepEqual(changes, []string{"lab", "lab"}))

	srv.set(200, noAlerts)
	p.ProbeAll(context.Background())
	clk.Step(2*Interval + time.Minute + time.Second)
	closed = p.Closed(c)
	assert.Assert(t, is.Len(closed, 1), "a read older than two intervals and the longest timeout is not trusted")
	assert.Check(t, is.Contains(closed[0].Why, "last read "+ts.URL+" at"))

	// An edited gate is read anew, not judged by the old one's answer.
	edited := clusterWith(likenv1.Gate{BlockingPods: &likenv1.BlockingPodsGate{}}, promGate(ts.URL, "Kube.*"))
	assert.Check(t, is.Contains(p.Closed(edited)[0].Why, "has not read"))
}

// TestRunReadsEveryInterval: the prober reads at once, then at each tick
// of its clock.
func TestRunReadsEveryInterval(t *testing.T) {
	var mu sync.Mutex
	reads := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reads++
		mu.Unlock()
		_, _ = w.Write([]byte(noAlerts))
	}))
	defer ts.Close()
	clk := clocktesting.NewFakeClock(time.Now())
	p := newProber(t, clusterWith(promGate(ts.URL, "")), clk, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	count := func() int { mu.Lock(); defer mu.Unlock(); return reads }
	waitFor(t, func() bool { return count() == 1 && clk.HasWaiters() })
	clk.Step(Interval)
	waitFor(t, func() bool { return count() == 2 })
	cancel()
	<-done
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("waiting")
	}, poll.WithDelay(time.Millisecond), poll.WithTimeout(10*time.Second))
}
