package daemon_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// leaseLog records the daemon's requests on its Lease, and refuses the
// next update once when told to.
type leaseLog struct {
	e      *env
	mu     sync.Mutex
	verbs  []string
	refuse string // "conflict" or "gone" for the next update
}

func (l *leaseLog) react(a k8stesting.Action) (bool, runtime.Object, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	verb, refuse := a.GetVerb(), l.refuse
	if verb != "update" || refuse == "" {
		l.verbs = append(l.verbs, verb)
		return false, nil, nil
	}
	l.refuse = ""
	l.verbs = append(l.verbs, "update:"+refuse)
	gr := coordinationv1.Resource("leases")
	if refuse == "conflict" {
		return true, nil, apierrors.NewConflict(gr, "m1", errors.New("the object has been modified"))
	}
	if err := l.e.kube.Tracker().Delete(coordinationv1.SchemeGroupVersion.WithResource("leases"), likenv1.SystemNamespace, "m1"); err != nil {
		return true, nil, err
	}
	return true, nil, apierrors.NewNotFound(gr, "m1")
}

// after returns the requests after the last one named mark (all of them
// when mark is ""; none while there is no such request).
func (l *leaseLog) after(mark string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := -1
	if mark == "" {
		i = 0
	}
	for j, v := range l.verbs {
		if v == mark {
			i = j + 1
		}
	}
	if i < 0 {
		return nil
	}
	return append([]string(nil), l.verbs[i:]...)
}

func (l *leaseLog) refuseNext(kind string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refuse = kind
}

// waitUpdates waits until at least n updates followed mark, and returns
// the requests after mark.
func (l *leaseLog) waitUpdates(t *testing.T, mark string, n int) []string {
	t.Helper()
	var got []string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		got = l.after(mark)
		if strings.Count(" "+strings.Join(got, " ")+" ", " update ") >= n {
			return poll.Success()
		}
		return poll.Continue("Lease requests after %q: %v", mark, got)
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	return got
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestHeartbeatReadsTheLeaseOnlyWhenNeeded: a renewal at rest is one
// update of the Lease the last renewal returned; the Lease is read again
// only after an update was refused (a conflict, or the Lease is gone),
// and that renewal then goes through at once.
func TestHeartbeatReadsTheLeaseOnlyWhenNeeded(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	l := &leaseLog{e: e}
	e.kube.PrependReactor("*", "leases", l.react)
	e.start()

	got := l.waitUpdates(t, "", 6)
	assert.DeepEqual(t, got, append([]string{"get", "create"}, repeat("update", len(got)-2)...))

	l.refuseNext("conflict")
	got = l.waitUpdates(t, "update:conflict", 3)
	assert.DeepEqual(t, got, append([]string{"get"}, repeat("update", len(got)-1)...))

	l.refuseNext("gone")
	got = l.waitUpdates(t, "update:gone", 3)
	assert.DeepEqual(t, got, append([]string{"get", "create"}, repeat("update", len(got)-2)...))
}
