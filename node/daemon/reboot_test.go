package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/node/daemon"
)

// busyAPI is an API server that answers every request 429 Too Many
// Requests (without Retry-After, so the client does not retry by itself)
// and counts the watch requests per resource.
type busyAPI struct {
	mu      sync.Mutex
	watches map[string]int
}

func (b *busyAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("watch") == "true" {
		b.mu.Lock()
		b.watches[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
		b.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","message":"the API server is busy","code":429}`))
}

// watched returns how many watch requests the least watched of resources got.
func (b *busyAPI) watched(resources ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	least := -1
	for _, r := range resources {
		if n := b.watches[r]; least < 0 || n < least {
			least = n
		}
	}
	return least
}

// timedRebooter notes when the daemon asked for the reboot.
type timedRebooter struct {
	mu sync.Mutex
	at time.Time
}

func (r *timedRebooter) Reboot(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = time.Now()
	return daemon.ErrRebooted
}

func (r *timedRebooter) when() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at
}

// TestTrialTimeoutRebootsPromptly: a trial boot whose API server answers
// every watch with 429 gives up when its trial timeout passes, and Run
// returns for the reboot at once. The client's informers back off between
// failed watch-list requests for seconds without looking at their stop
// channel; the reboot must not wait for them.
func TestTrialTimeoutRebootsPromptly(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) {
		c.Spec.Version = v2
		c.Spec.Disruption.TrialTimeout = &metav1.Duration{Duration: time.Hour}
	})
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	api := &busyAPI{watches: map[string]int{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL}
	o := e.options()
	var err error
	o.Kube, err = kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	o.Liken, err = versioned.NewForConfig(cfg)
	assert.NilError(t, err)
	clk := clocktesting.NewFakeClock(time.Now())
	o.Clock = clk
	rb := &timedRebooter{}
	o.Rebooter = rb
	r = e.m.Start(t, o)
	assert.Assert(t, r.Boot.Trial)

	// Two failed watch-list requests of each informer: each now waits
	// 1.6 s or more before its next one.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := api.watched("machines", "clusters", "nodes"); n < 2 {
			return poll.Continue("the least watched resource got %d watch requests", n)
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(10*time.Millisecond))

	clk.Step(2 * time.Hour) // past the trial timeout
	waitExit(t, r)
	took := time.Since(rb.when())
	t.Logf("Run returned %s after the reboot was asked for", took)
	assert.Assert(t, took < time.Second, "Run returned %s after the reboot was asked for: it waited for the informers", took)
}

// TestEventsBeforeTheRebootAreSent: the API server takes 20 ms to write
// each event; the events of the turn's last steps (Drained, TrialArmed,
// Rebooting) are written by the time the daemon stops for the reboot. After
// that, liken-node has exited (or the machine is down): an event still on
// its way is lost.
func TestEventsBeforeTheRebootAreSent(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	var mu sync.Mutex
	var written []string
	stopped := false
	e.kube.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		<-time.After(20 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return true, nil, errors.New("connection refused: liken-node has exited")
		}
		written = append(written, a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event).Reason)
		return false, nil, nil
	})
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	o := e.options()
	o.Rebooter = &timedRebooter{} // reboots at once, without a sync
	r := e.m.Start(t, o)
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)
	mu.Lock()
	stopped = true
	got := append([]string(nil), written...)
	mu.Unlock()
	for _, reason := range []string{daemon.ReasonDrained, daemon.ReasonTrialArmed, daemon.ReasonRebooting} {
		assert.Check(t, is.Contains(got, reason), "events written when the daemon stopped for the reboot: %v", got)
	}
}
