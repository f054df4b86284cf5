package leadership

import (
	"context"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	tu "liken.sh/liken/controllers/internal/testutil"
)

func TestLeaseFence(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "liken-system", Name: "cluster-operator"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: renewed}},
		}
	}
	cases := []struct {
		name  string
		lease *coordinationv1.Lease
		// renewed is when this copy's own last renewal started (zero:
		// none known), and read whether the fence reads the Lease.
		renewed time.Time
		noRead  bool
		err     string
		onLost  bool
	}{
		{name: "held and fresh", lease: lease("op-a", now.Add(-3*time.Second))},
		{name: "held by another copy", lease: lease("op-b", now), err: `held by "op-b"`, onLost: true},
		{name: "own renewal too old", lease: lease("op-a", now.Add(-15*time.Second)), err: "older than 15s"},
		{name: "no lease", err: "is gone"},
		{name: "renewed by this copy 2s ago: no request", lease: lease("op-b", now), renewed: now.Add(-2 * time.Second), noRead: true},
		{name: "renewed by this copy 9.9s ago: no request", lease: lease("op-b", now), renewed: now.Add(-9900 * time.Millisecond), noRead: true},
		{name: "renewed by this copy 10s ago: read (paused, perhaps)", lease: lease("op-b", now), renewed: now.Add(-10 * time.Second), err: `held by "op-b"`, onLost: true},
		{name: "renewed by this copy a minute ago: read", lease: lease("op-a", now.Add(-time.Minute)), renewed: now.Add(-time.Minute), err: "older than 15s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubefake.NewClientset()
			if tc.lease != nil {
				kube = kubefake.NewClientset(tc.lease)
			}
			lost := false
			f := &LeaseFence{
				Leases: kube.CoordinationV1(), Namespace: "liken-system", Name: "cluster-operator", Identity: "op-a",
				LeaseDuration: 15 * time.Second, Clock: clocktesting.NewFakePassiveClock(now), OnLost: func(string) { lost = true },
			}
			if !tc.renewed.IsZero() {
				f.Renewals = renewedAt(tc.renewed)
			}
			err := f.Confirm(context.Background(), "granting a turn")
			assert.Equal(t, len(kube.Actions()) == 0, tc.noRead, "requests: %v", kube.Actions())
			if tc.err == "" {
				assert.NilError(t, err)
			} else {
				assert.Assert(t, errors.Is(err, ErrNotLeader))
				assert.ErrorContains(t, err, tc.err)
			}
			assert.Equal(t, lost, tc.onLost)
		})
	}
}

type renewedAt time.Time

func (r renewedAt) Renewed() time.Time { return time.Time(r) }

// fakeLock is an election lock whose writes fail when err is set.
type fakeLock struct {
	resourcelock.Interface
	err error
}

func (l *fakeLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }
func (l *fakeLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }
func (l *fakeLock) Identity() string                                                { return "op-a" }

// TestRenewalTracker: only a write that kept the lock for this copy
// counts as a renewal, from when it started; a failed write or one that
// gives the lock up forgets the last one.
func TestRenewalTracker(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	lock := &fakeLock{}
	tr := &RenewalTracker{Interface: lock, Clock: clk}
	assert.Assert(t, tr.Renewed().IsZero())

	start := clk.Now()
	assert.NilError(t, tr.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "op-a"}))
	assert.Equal(t, tr.Renewed(), start)
	clk.Step(2 * time.Second)
	start = clk.Now()
	assert.NilError(t, tr.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "op-a"}))
	assert.Equal(t, tr.Renewed(), start)

	lock.err = errors.New("the API server is unreachable")
	clk.Step(2 * time.Second)
	assert.ErrorContains(t, tr.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "op-a"}), "unreachable")
	assert.Assert(t, tr.Renewed().IsZero(), "a failed renewal leaves no renewal to trust")

	lock.err = nil
	assert.NilError(t, tr.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "op-a"}))
	assert.NilError(t, tr.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: ""}))
	assert.Assert(t, tr.Renewed().IsZero(), "giving the lock up is no renewal")
}

// Release clears the Lease only when the Lease read from the API server
// names this copy, and only with the resourceVersion of that read: a copy
// that was paused while another took over must not clear the new
// leader's Lease.
func TestRelease(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	lease := func(holder, rv string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "liken-system", Name: "cluster-operator", ResourceVersion: rv},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime: &metav1.MicroTime{Time: now.Add(-time.Second)}},
		}
	}
	cases := []struct {
		name string
		// stored is the Lease the API server holds; read, when set, is
		// what the Get returns (the Lease changed right after the read).
		stored, read *coordinationv1.Lease
		released     bool
		err          string
		holder       string // of the stored Lease afterwards; "-" when there is none
	}{
		{name: "held by this copy", stored: lease("op-a", "5"), released: true, holder: ""},
		{name: "held by another copy", stored: lease("op-b", "9"), holder: "op-b"},
		{name: "taken by another copy after the read", stored: lease("op-b", "9"), read: lease("op-a", "5"), err: "releasing lease", holder: "op-b"},
		{name: "no lease", holder: "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubefake.NewClientset()
			if tc.stored != nil {
				kube = kubefake.NewClientset(tc.stored)
			}
			tu.OptimisticUpdates(kube, "leases")
			if tc.read != nil {
				kube.PrependReactor("get", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, tc.read.DeepCopy(), nil
				})
			}
			released, err := Release(context.Background(), kube.CoordinationV1(), "liken-system", "cluster-operator", "op-a", now)
			if tc.err == "" {
				assert.NilError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.err)
			}
			assert.Equal(t, released, tc.released)
			obj, err := kube.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "liken-system", "cluster-operator")
			if tc.holder == "-" {
				assert.Assert(t, apierrors.IsNotFound(err))
				return
			}
			assert.NilError(t, err)
			l := obj.(*coordinationv1.Lease)
			assert.Equal(t, *l.Spec.HolderIdentity, tc.holder)
			if tc.released {
				assert.Equal(t, *l.Spec.LeaseDurationSeconds, int32(1))
			}
		})
	}
}
