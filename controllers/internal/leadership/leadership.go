// Package leadership tells the controllers since when this copy of
// cluster-operator leads, and lets them confirm it still does before a
// write that only the leader may make.
package leadership

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
)

// Term is one period of leadership of this process.
type Term struct {
	// Identity is this copy's name in the Lease.
	Identity string
	// Since is when this copy started leading, on its own clock.
	Since time.Time
	// Fence confirms leadership before a grant or a Lost verdict.
	Fence Fence
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

// LeaseFence reads the election Lease from the API server (never from a
// cache) and confirms that it names this copy and that this copy's last
// renewal, on its own clock, is younger than the lease duration.
type LeaseFence struct {
	Leases        coordinationv1client.LeasesGetter
	Namespace     string
	Name          string
	Identity      string
	LeaseDuration time.Duration
	Clock         clock.PassiveClock
	// OnLost is called when the fence finds the lease held by another
	// copy, with the write it stopped.
	OnLost func(what string)
}

// Confirm implements Fence.
func (f *LeaseFence) Confirm(ctx context.Context, what string) error {
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
