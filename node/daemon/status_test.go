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
