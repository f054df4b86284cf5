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
		name   string
		lease  *coordinationv1.Lease
		err    string
		onLost bool
	}{
		{name: "held and fresh", lease: lease("op-a", now.Add(-3*time.Second))},
		{name: "held by another copy", lease: lease("op-b", now), err: `held by "op-b"`, onLost: true},
		{name: "own renewal too old", lease: lease("op-a", now.Add(-15*time.Second)), err: "older than 15s"},
		{name: "no lease", err: "is gone"},
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
			err := f.Confirm(context.Background(), "granting a turn")
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
