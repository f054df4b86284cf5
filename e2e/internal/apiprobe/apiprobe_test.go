package apiprobe

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
)

// t0 is the fake clock's time when a probe starts.
var t0 = time.Date(2026, 12, 4, 12, 4, 0, 0, time.UTC)

// errLeader is the API's answer while the reactors fail.
var errLeader = errors.New("etcdserver: leader changed")

// env is a probe running against a fake clientset and a fake clock the
// test steps; failing turns the reactors on.
type env struct {
	cs    *fake.Clientset
	clk   *testingclock.FakeClock
	p     *Probe
	stop  func()
	fails struct{ write, read, stale atomic.Bool }
}

// start runs a probe whose first round is done when it returns.
func start(t *testing.T) *env {
	t.Helper()
	e := &env{cs: fake.NewClientset(), clk: testingclock.NewFakeClock(t0)}
	e.cs.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return e.fails.write.Load(), nil, errLeader
	})
	e.cs.PrependReactor("get", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if e.fails.stale.Load() {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: a.GetNamespace(), Name: DefaultName}, Data: map[string]string{CounterKey: "1"}}
			return true, cm, nil
		}
		return e.fails.read.Load(), nil, errLeader
	})
	e.p = &Probe{Client: e.cs, Clock: e.clk}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.p.Run(ctx)
	}()
	e.stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(e.stop)
	e.waitRounds(t, 1)
	return e
}

// tick steps the clock by one interval n times, each time until the
// probe's round is recorded.
func (e *env) tick(t *testing.T, n int) {
	t.Helper()
	for range n {
		want := e.p.Report().Rounds + 1
		e.clk.Step(DefaultInterval)
		e.waitRounds(t, want)
	}
}

func (e *env) waitRounds(t *testing.T, n int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := e.p.Report().Rounds; got < n {
			return poll.Continue("%d rounds of %d", got, n)
		}
		return poll.Success()
	}, poll.WithDelay(time.Millisecond), poll.WithTimeout(10*time.Second))
}

// at is the time of round k (0 the first).
func at(k int) time.Time { return t0.Add(time.Duration(k) * DefaultInterval) }

// TestAllRoundsSucceed: every round writes the next counter and reads it
// back; no failure, no window.
func TestAllRoundsSucceed(t *testing.T) {
	e := start(t)
	e.tick(t, 10)

	r := e.p.Report()
	assert.Equal(t, r.Rounds, 11)
	assert.Equal(t, r.Requests, 22)
	assert.Check(t, is.Len(r.Failures, 0))
	assert.Equal(t, r.Longest, Window{})
	assert.Equal(t, r.Started, t0)
	assert.Equal(t, r.At, at(10))
	assert.Equal(t, r.String(), "11 rounds, 0 failed; the API answered every round")

	// The first round created the ConfigMap, the others updated it.
	cm, err := e.cs.CoreV1().ConfigMaps(DefaultNamespace).Get(context.Background(), DefaultName, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, cm.Data[CounterKey], "11")

	e.stop()
	assert.Equal(t, e.p.Report().Ended, at(10))
}

// TestFailingWindow: N rounds failing in a row are N failures with their
// operation and error, and the window runs from the last success before
// them to the next success; a later shorter window does not replace it.
func TestFailingWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(e *env) *atomic.Bool
		op   Op
		reqs int // requests of a failed round
	}{
		{name: "writes fail", fail: func(e *env) *atomic.Bool { return &e.fails.write }, op: OpWrite, reqs: 1},
		{name: "reads fail", fail: func(e *env) *atomic.Bool { return &e.fails.read }, op: OpRead, reqs: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 5
			e := start(t)
			e.tick(t, 3) // rounds 0 to 3 succeed
			tc.fail(e).Store(true)
			e.tick(t, n) // rounds 4 to 8 fail
			tc.fail(e).Store(false)
			e.tick(t, 1) // round 9 succeeds
			tc.fail(e).Store(true)
			e.tick(t, 1) // round 10 fails
			tc.fail(e).Store(false)
			e.tick(t, 1) // round 11 succeeds

			r := e.p.Report()
			assert.Equal(t, r.Rounds, 12)
			assert.Equal(t, r.Requests, 2*12-(n+1)*(2-tc.reqs))
			assert.Assert(t, is.Len(r.Failures, n+1))
			for i, k := range []int{4, 5, 6, 7, 8, 10} {
				assert.Check(t, is.Equal(exported(r.Failures[i]), Failure{At: at(k), Op: tc.op, Err: errLeader.Error()}), "failure %d", i)
			}
			assert.Equal(t, r.Longest, Window{From: at(3), To: at(9)})
			assert.Equal(t, r.Longest.Duration(), (n+1)*DefaultInterval)
			assert.Equal(t, r.String(), "12 rounds, 6 failed; longest window without the API 1.2s (12:04:00.6–12:04:01.8)")
		})
	}
}

// TestStaleReadIsAFailure: a read that answers another counter than the
// one written fails the round.
func TestStaleReadIsAFailure(t *testing.T) {
	e := start(t)
	e.tick(t, 2)
	e.fails.stale.Store(true)
	e.tick(t, 1) // round 3 writes 4, reads 1
	e.fails.stale.Store(false)
	e.tick(t, 1)

	r := e.p.Report()
	assert.Assert(t, is.Len(r.Failures, 1))
	assert.Equal(t, exported(r.Failures[0]), Failure{At: at(3), Op: OpRead, Err: "read counter 1, wrote 4"})
	assert.Equal(t, r.Longest, Window{From: at(2), To: at(4)})
}

// TestOngoingFailure: a window still open at the report runs to the
// report's time, flagged ongoing, and is the longest only once it is longer
// than the closed ones; once the run ends it stops at the run's end.
func TestOngoingFailure(t *testing.T) {
	e := start(t)
	e.fails.write.Store(true)
	e.tick(t, 1) // round 1 fails
	e.fails.write.Store(false)
	e.tick(t, 1) // round 2 succeeds: a window of 2 intervals
	e.fails.read.Store(true)
	e.tick(t, 1) // round 3 fails: a window from round 2, ongoing

	r := e.p.Report()
	assert.Equal(t, r.Longest, Window{From: at(0), To: at(2)}, "a 1-interval ongoing window is shorter than the closed one")

	e.tick(t, 2)
	r = e.p.Report()
	assert.Equal(t, r.Longest, Window{From: at(2), To: at(5), Ongoing: true})
	assert.Equal(t, r.String(), "6 rounds, 4 failed; longest window without the API 600ms (12:04:00.4–12:04:01.0, ongoing)")

	// The clock goes on without a round: the window grows to the report.
	e.clk.Step(DefaultInterval / 2)
	assert.Equal(t, e.p.Report().Longest, Window{From: at(2), To: at(5).Add(DefaultInterval / 2), Ongoing: true})

	e.stop()
	e.clk.Step(time.Minute)
	assert.Equal(t, e.p.Report().Longest, Window{From: at(2), To: at(5).Add(DefaultInterval / 2), Ongoing: true}, "the run's end closes the report")
}

// TestMarksInOrder: marks are kept in order with their text, and the
// timeline puts them among the failures as they happened.
func TestMarksInOrder(t *testing.T) {
	e := start(t)
	e.p.Mark("vm-1 took its turn")
	e.fails.write.Store(true)
	e.tick(t, 3)
	e.fails.write.Store(false)
	e.tick(t, 1)
	e.p.Mark("vm-1 left its turn", "https://127.0.0.1:1: 3 members\nhttps://127.0.0.1:2: 3 members")
	e.fails.read.Store(true)
	e.tick(t, 1)
	e.fails.read.Store(false)
	e.fails.stale.Store(true)
	e.tick(t, 1)
	e.fails.stale.Store(false)
	e.p.Mark("vm-2 left its turn")

	r := e.p.Report()
	labels := make([]string, 0, len(r.Marks))
	for _, m := range r.Marks {
		labels = append(labels, m.Label)
	}
	assert.DeepEqual(t, labels, []string{"vm-1 took its turn", "vm-1 left its turn", "vm-2 left its turn"})
	assert.Equal(t, r.Marks[0].At, at(0))
	assert.Equal(t, r.Marks[1].At, at(4))
	assert.Equal(t, r.Marks[1].Text, "https://127.0.0.1:1: 3 members\nhttps://127.0.0.1:2: 3 members")
	assert.Equal(t, r.Marks[2].Text, "")

	want := `7 rounds, 5 failed; longest window without the API 800ms (12:04:00.0–12:04:00.8)
12:04:00.0 mark: vm-1 took its turn
12:04:00.2–12:04:00.6 write failed 3 times: etcdserver: leader changed
12:04:00.8 mark: vm-1 left its turn
    https://127.0.0.1:1: 3 members
    https://127.0.0.1:2: 3 members
12:04:01.0 read failed: etcdserver: leader changed
12:04:01.2 read failed: read counter 1, wrote 7
12:04:01.2 mark: vm-2 left its turn
`
	assert.Equal(t, r.Timeline(), want)
}

// exported is f as a test writes it: its exported fields.
func exported(f Failure) Failure {
	f.seq = 0
	return f
}

// TestRequestTimeout: a request the API server never answers fails after
// the probe's Timeout, as a failure of its operation.
func TestRequestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for the handlers
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	assert.NilError(t, err)
	p := &Probe{Client: cs, Clock: testingclock.NewFakeClock(t0), Timeout: 50 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r := p.Report(); r.Rounds == 0 {
			return poll.Continue("no round yet")
		}
		return poll.Success()
	}, poll.WithDelay(5*time.Millisecond), poll.WithTimeout(10*time.Second))

	r := p.Report()
	assert.Assert(t, is.Len(r.Failures, 1))
	assert.Equal(t, r.Failures[0].Op, OpWrite)
	assert.Check(t, is.Contains(r.Failures[0].Err, "context deadline exceeded"))
	assert.Equal(t, r.Longest, Window{From: t0, To: t0, Ongoing: true})
}
