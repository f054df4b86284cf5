package lab

import (
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

const (
	unitV1 = "2026.11.01-001"
	unitV2 = "2026.11.02-001"
	unitD1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	unitD2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// The watcher's checks, fed by hand: each broken invariant is reported,
// naming the object versions, and a healthy fleet reports nothing. The
// lab scenarios depend on these checks being able to fail.
func TestWatcherChecks(t *testing.T) {
	cluster := func(maxUnavailable int, turns ...string) *likenv1.Cluster {
		mu := intstr.FromInt32(int32(maxUnavailable))
		c := &likenv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "lab"}, Spec: likenv1.ClusterSpec{
			Version:    unitV1,
			Releases:   likenv1.ReleasesSpec{Catalog: []likenv1.CatalogEntry{{Version: unitV1, Digest: unitD1}, {Version: unitV2, Digest: unitD2}}},
			Disruption: likenv1.DisruptionSpec{MaxUnavailable: &mu},
		}}
		for _, n := range turns {
			c.Status.RebootTurns = append(c.Status.RebootTurns, likenv1.RebootTurn{Machine: n, Reason: likenv1.TurnRelease})
		}
		return c
	}
	machine := func(name string, role likenv1.MachineRole, phase likenv1.MachinePhase, slots ...likenv1.SlotStatus) *likenv1.Machine {
		m := &likenv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: likenv1.MachineSpec{Cluster: "lab", Role: role}}
		m.Status = likenv1.MachineStatus{Phase: phase, Version: unitV1, Slot: "A", Slots: []likenv1.SlotStatus{{Name: "A", State: likenv1.SlotActive, Version: unitV1, Digest: unitD1}}}
		m.Status.Slots = append(m.Status.Slots, slots...)
		return m
	}
	node := func(name string, ready bool) *corev1.Node {
		s := corev1.ConditionTrue
		if !ready {
			s = corev1.ConditionUnknown
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
	}
	healthy := func() []runtime.Object {
		return []runtime.Object{
			cluster(1),
			machine("node-1", likenv1.RoleLeader, likenv1.MachineReady), machine("node-2", likenv1.RoleLeader, likenv1.MachineReady),
			machine("node-3", likenv1.RoleWorker, likenv1.MachineReady),
			node("node-1", true), node("node-2", true), node("node-3", true),
		}
	}
	for _, tc := range []struct {
		name   string
		after  []runtime.Object // applied in order after the healthy fleet
		corrup string
		want   string // "" for no problem
	}{
		{name: "healthy rollout step", after: []runtime.Object{cluster(1, "node-1"), machine("node-1", likenv1.RoleLeader, likenv1.MachineUpdating), node("node-1", false)}},
		{name: "two turns over a budget of one", after: []runtime.Object{cluster(1, "node-1", "node-3")}, want: "2 turns [node-1 node-3] + 0 machines"},
		{name: "a turn while another machine is NotReady", after: []runtime.Object{node("node-3", false), cluster(1, "node-1")}, want: "1 turns [node-1] + 1 machines Lost or NotReady without a turn [node-3]"},
		{name: "a turn while another machine is Lost", after: []runtime.Object{machine("node-3", likenv1.RoleWorker, likenv1.MachineLost), cluster(1, "node-1")}, want: "[node-3] > maxUnavailable 1"},
		{name: "two leaders down within the budget", after: []runtime.Object{cluster(2, "node-1"), node("node-2", false)}, want: "2 leaders down at once [node-1 node-2]"},
		{name: "uncatalogued version", after: []runtime.Object{func() runtime.Object {
			m := machine("node-3", likenv1.RoleWorker, likenv1.MachineReady)
			m.Status.Version = "2026.11.09-001"
			return m
		}()}, want: "runs 2026.11.09-001, which is not a verified catalogued release"},
		{name: "booted slot with another digest", after: []runtime.Object{func() runtime.Object {
			m := machine("node-3", likenv1.RoleWorker, likenv1.MachineReady)
			m.Status.Slots[0].Digest = unitD2
			return m
		}()}, want: "slot A is Active with " + unitV1 + " " + unitD2},
		{name: "corrupt release staged", corrup: unitV2, after: []runtime.Object{
			machine("node-3", likenv1.RoleWorker, likenv1.MachineUpdatePending, likenv1.SlotStatus{Name: "B", State: likenv1.SlotStaged, Version: unitV2, Digest: unitD2}),
		}, want: "slot B is Staged with " + unitV2},
		{name: "corrupt release downloading or failed is fine", corrup: unitV2, after: []runtime.Object{
			machine("node-3", likenv1.RoleWorker, likenv1.MachineDownloading, likenv1.SlotStatus{Name: "B", State: likenv1.SlotDownloading, Version: unitV2, Digest: unitD2}),
			machine("node-3", likenv1.RoleWorker, likenv1.MachineDownloading, likenv1.SlotStatus{Name: "B", State: likenv1.SlotFailed, Version: unitV2, Digest: unitD2}),
		}},
		{name: "catalog entry changes its digest", after: []runtime.Object{func() runtime.Object {
			c := cluster(1)
			c.Spec.Releases.Catalog[1].Digest = unitD1
			return c
		}()}, want: "pins " + unitV2 + " to " + unitD1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWatcher("lab")
			if tc.corrup != "" {
				w.markCorrupt(tc.corrup)
			}
			rv := int64(0)
			feed := func(o runtime.Object) {
				rv++
				o.(interface{ SetResourceVersion(string) }).SetResourceVersion(fmt.Sprint(rv))
				kind := "Machine"
				switch o.(type) {
				case *likenv1.Cluster:
					kind = "Cluster"
				case *corev1.Node:
					kind = "Node"
				}
				w.pending = append(w.pending, event{rv: rv, kind: kind, obj: o})
			}
			for _, o := range healthy() {
				feed(o)
			}
			for _, o := range tc.after {
				feed(o)
			}
			w.evaluate(rv)
			if tc.want == "" {
				assert.Equal(t, len(w.problems), 0, "%v", w.problems)
				return
			}
			all := strings.Join(w.problems, "\n")
			assert.Assert(t, strings.Contains(all, tc.want), "%s", all)
			for _, p := range w.problems {
				assert.Assert(t, strings.Contains(p, "@"), "the problem names no object version: %s", p)
			}
		})
	}
}
