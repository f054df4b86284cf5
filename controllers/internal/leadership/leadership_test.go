package leadership

import (
	"context"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
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
