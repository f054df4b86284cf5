package daemon_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// opLog records, in order, each reconcile of the daemon (seen as the call
// of its Observer that every status report makes) and each status write.
type opLog struct {
	mu  sync.Mutex
	ops []string
}

func (l *opLog) add(op string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
}

// tail returns the last n operations (fewer when there are fewer).
func (l *opLog) tail(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ops[max(0, len(l.ops)-n):]...)
}

// countingObserver logs a "sync" for every Observe.
type countingObserver struct {
	changes.Observer
	log *opLog
}

func (o countingObserver) Observe(ctx context.Context, applied changes.Config) (likenv1.ObservedState, error) {
	o.log.add("sync")
	return o.Observer.Observe(ctx, applied)
}

// TestPendingStatusIsWrittenOnce: while a change waits for its turn, the
// daemon reconciles again and again (resyncs, its own write's echo); with
// the status stored as the API server stores it (times to the second), none
// of those reconciles writes the unchanged status again.
func TestPendingStatusIsWrittenOnce(t *testing.T) {
	e := newEnv(t, likenv1.RebootManual)
	log := &opLog{}
	e.lk.PrependReactor("update", "machines", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.UpdateAction).GetSubresource() == "status" {
			log.add("write")
		}
		return false, nil, nil
	})
	o := e.options()
	o.Observer = countingObserver{Observer: e.m.Recorder, log: log}
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	m := e.waitPhase(likenv1.MachineUpdatePending)
	assert.Assert(t, is.Len(m.Status.Pending, 1))

	// Resyncs come every 300 ms: four reconciles in a row that write
	// nothing show the status has settled.
	quiet := []string{"sync", "sync", "sync", "sync"}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := log.tail(len(quiet)); strings.Join(got, " ") != strings.Join(quiet, " ") {
			return poll.Continue("the last reconciles (%v) still write the unchanged status", got)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))

	m = e.machine()
	assert.Equal(t, m.Status.Phase, likenv1.MachineUpdatePending)
	since := m.Status.Pending[0].Since.Time
	assert.Assert(t, !since.IsZero())
	assert.Equal(t, since, since.Truncate(time.Second), "since is kept to the second")
}

// lateWatch delivers a watch's events late, as a busy API server does.
type lateWatch struct {
	w    watch.Interface
	ch   chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newLateWatch(w watch.Interface, delay time.Duration) *lateWatch {
	l := &lateWatch{w: w, ch: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(l.ch)
		for ev := range w.ResultChan() {
			select {
			case <-time.After(delay):
			case <-l.stop:
				return
			}
			select {
			case l.ch <- ev:
			case <-l.stop:
				return
			}
		}
	}()
	return l
}

func (l *lateWatch) ResultChan() <-chan watch.Event { return l.ch }

func (l *lateWatch) Stop() {
	l.once.Do(func() { close(l.stop) })
	l.w.Stop()
}

// TestOwnStatusWritesAreNotRefused: the daemon's informer shows its own
// status write only 200 ms later. The reconciles in between (a commit is
// reported at once, a download's steps follow each other) work from what
// the write returned: through a whole upgrade with a trial, no status write
// is refused as a conflict and none writes what is already stored.
func TestOwnStatusWritesAreNotRefused(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.lk.PrependWatchReactor("machines", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := e.lk.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		return true, newLateWatch(w, 200*time.Millisecond), nil
	})
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)
	r = e.start()
	assert.Assert(t, r.Boot.Trial)
	e.waitFor("Ready on the new release", func(m *likenv1.Machine) bool {
		return m.Status.Version == v2 && m.Status.Phase == likenv1.MachineReady
	})

	e.mu.Lock()
	defer e.mu.Unlock()
	t.Logf("%d status versions, %d writes refused as conflicts, %d writes that changed nothing", e.version, e.conflicts, e.unchanged)
	assert.Equal(t, e.conflicts, 0, "status writes refused as conflicts")
	assert.Equal(t, e.unchanged, 0, "status writes that changed nothing")
}
