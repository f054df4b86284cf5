// Package leadership tells the controllers since when this copy of
// cluster-operator leads, and lets them confirm it still does before a
// write that only the leader may make.
package leadership

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Term is one period of leadership of this process.
type Term struct {
	// Identity is this copy's name in the Lease.
	Identity string
	// Since is when this copy started leading, on its own clock.
	Since time.Time
	// Fence confirms leadership before a grant or a Lost verdict.
	Fence Fence
	// Token names the term ("<lease transitions>/<identity>"): it grows
	// with each new holder of the lease. The turn controller writes it in
	// each Cluster's status before its first decision of the term.
	Token string
}

// TermToken is the token of the term an election record starts.
func TermToken(ler resourcelock.LeaderElectionRecord) string {
	return fmt.Sprintf("%d/%s", ler.LeaderTransitions, ler.HolderIdentity)
}

// Fence confirms that this copy still leads.
type Fence interface {
	// Confirm returns nil only while this copy holds the lease. what
	// names the write about to be made, for logs.
	Confirm(ctx context.Context, what string) error
}

// ErrNotLeader means the lease is held by another copy, or this copy's
// hold on it expired: a copy that was paused must not act on what it saw
// before the pause.
var ErrNotLeader = errors.New("this copy of cluster-operator no longer holds the lease")

// FenceFunc adapts a function to Fence.
type FenceFunc func(ctx context.Context, what string) error

// Confirm calls f.
func (f FenceFunc) Confirm(ctx context.Context, what string) error { return f(ctx, what) }

// Always is a Fence that always confirms (for tests and single-copy use).
var Always Fence = FenceFunc(func(context.Context, string) error { return nil })

// LeaseFence confirms that this copy still holds the election Lease: from
// its own recent renewal with no request, else from the Lease read from the
// API server (docs/design/protocol.md#cluster-operator-grants-a-turn).
type LeaseFence struct {
	Leases        coordinationv1client.LeasesGetter
	Namespace     string
	Name          string
	Identity      string
	LeaseDuration time.Duration
	Clock         clock.PassiveClock
	// Renewals, when set, tells when this copy's last renewal that
	// succeeded started.
	Renewals interface{ Renewed() time.Time }
	// OnLost is called when the fence finds the lease held by another
	// copy, with the write it stopped.
	OnLost func(what string)
}

// RenewalMargin is the part of the lease duration a confirmed write may
// take to reach the API server: a renewal younger than the rest confirms.
const RenewalMargin = 5 * time.Second

// Confirm implements Fence.
func (f *LeaseFence) Confirm(ctx context.Context, what string) error {
	if f.Renewals != nil {
		if r := f.Renewals.Renewed(); !r.IsZero() && f.Clock.Since(r) < f.LeaseDuration-RenewalMargin {
			return nil
		}
	}
	l, err := f.Leases.Leases(f.Namespace).Get(ctx, f.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: lease %s/%s is gone", ErrNotLeader, f.Namespace, f.Name)
	}
	if err != nil {
		return fmt.Errorf("confirming leadership: %w", err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder != f.Identity {
		if f.OnLost != nil {
			f.OnLost(what)
		}
		return fmt.Errorf("%w: lease %s/%s is held by %q", ErrNotLeader, f.Namespace, f.Name, holder)
	}
	if l.Spec.RenewTime == nil || f.Clock.Since(l.Spec.RenewTime.Time) >= f.LeaseDuration {
		return fmt.Errorf("%w: this copy's last renewal of %s/%s is older than %s", ErrNotLeader, f.Namespace, f.Name, f.LeaseDuration)
	}
	return nil
}

// RenewalTracker wraps the leader election's lock and remembers when the
// last write of the lock by this copy (an acquisition or a renewal) that
// succeeded started, for LeaseFence.Renewals. The start, not the end: the
// API server stored the renewal at some moment after it.
type RenewalTracker struct {
	resourcelock.Interface
	// Clock must carry a monotonic reading (the real clock does), so that
	// a change of the wall clock does not make an old renewal look young.
	Clock clock.PassiveClock

	mu      sync.Mutex
	renewed time.Time
	last    resourcelock.LeaderElectionRecord
}

// Create implements resourcelock.Interface.
func (t *RenewalTracker) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	start := t.Clock.Now()
	err := t.Interface.Create(ctx, ler)
	t.record(start, ler, err)
	return err
}

// Update implements resourcelock.Interface.
func (t *RenewalTracker) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	start := t.Clock.Now()
	err := t.Interface.Update(ctx, ler)
	t.record(start, ler, err)
	return err
}

func (t *RenewalTracker) record(start time.Time, ler resourcelock.LeaderElectionRecord, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && ler.HolderIdentity == t.Identity() {
		t.renewed = start
		t.last = ler
	} else {
		// A failed write, or a write that gives the lock up: whatever
		// the Lease holds now, it is not this copy's fresh renewal.
		t.renewed = time.Time{}
	}
}

// Token is the token of the term the last write that kept the lock for
// this copy belongs to (TermToken).
func (t *RenewalTracker) Token() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TermToken(t.last)
}

// Renewed returns when the last write that kept the lock for this copy
// started; zero when the last write failed or gave it up.
func (t *RenewalTracker) Renewed() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.renewed
}

// Release gives up the election Lease namespace/name on shutdown, only if
// the API server still names identity, so another copy takes over at once
// and a lease another copy took is never touched (docs/design/protocol.md#leader-election).
func Release(ctx context.Context, leases coordinationv1client.LeasesGetter, namespace, name, identity string, now time.Time) (released bool, err error) {
	l, err := leases.Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading lease %s/%s to release it: %w", namespace, name, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != identity {
		return false, nil
	}
	t := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity = ptr.To("")
	l.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	l.Spec.RenewTime, l.Spec.AcquireTime = &t, &t
	if _, err := leases.Leases(namespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("releasing lease %s/%s: %w", namespace, name, err)
	}
	return true, nil
}
