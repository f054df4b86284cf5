package rules

import (
	"testing"

	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

func machine(name string, opts ...func(*likenv1.Machine)) *likenv1.Machine {
	m := &likenv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Spec:       likenv1.MachineSpec{Cluster: "lab", Role: likenv1.RoleWorker, RebootPolicy: likenv1.RebootManual},
		Status:     likenv1.MachineStatus{Phase: likenv1.MachineUpdatePending, Change: "c1"},
	}
	m.Status.Observed.BootID = "boot-1"
	for _, o := range opts {
		o(m)
	}
	return m
}

func leader(m *likenv1.Machine) { m.Spec.Role = likenv1.RoleLeader }
func auto(m *likenv1.Machine)   { m.Spec.RebootPolicy = likenv1.RebootAuto }
func approve(change string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationApprovedChange] = change }
}

func TestApproval(t *testing.T) {
	for _, tc := range []struct {
		name              string
		m                 *likenv1.Machine
		change            string
		approved, cleared bool
	}{
		{name: "Manual, not approved", m: machine("n"), change: "c1"},
		{name: "Manual, approved this change", m: machine("n", approve("c1")), change: "c1", approved: true, cleared: true},
		{name: "Manual, approved an earlier change", m: machine("n", approve("c0")), change: "c1"},
		{name: "Manual, nothing staged: an empty approval covers nothing", m: machine("n", approve("")), change: ""},
		{name: "policy left empty is Manual", m: machine("n", func(m *likenv1.Machine) { m.Spec.RebootPolicy = "" }), change: "c1"},
		{name: "Auto needs no approval", m: machine("n", auto), change: "c1", cleared: true},
		{name: "Auto, approved", m: machine("n", auto, approve("c1")), change: "c1", approved: true, cleared: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, Approved(tc.m, tc.change), tc.approved)
			assert.Equal(t, Cleared(tc.m, tc.change), tc.cleared)
		})
	}
}

func TestUnavailable(t *testing.T) {
	ready := Node{Joined: true, Ready: true, BootID: "boot-1"}
	for _, tc := range []struct {
		name   string
		m      *likenv1.Machine
		silent bool
		node   Node
		want   bool
	}{
		{name: "Ready Node of this boot", m: machine("n"), node: ready},
		{name: "Lost", m: machine("n", func(m *likenv1.Machine) { m.Status.Phase = likenv1.MachineLost }), node: ready, want: true},
		{name: "silent, not Lost yet", m: machine("n"), silent: true, node: ready, want: true},
		{name: "NotReady Node", m: machine("n"), node: Node{Joined: true, BootID: "boot-1"}, want: true},
		{name: "Ready only by an earlier boot's word", m: machine("n"), node: Node{Joined: true, Ready: true, BootID: "boot-0"}, want: true},
		{name: "kubelet reports no boot ID (simulated Node)", m: machine("n"), node: Node{Joined: true, Ready: true}},
		{name: "machine reports no boot ID yet", m: machine("n", func(m *likenv1.Machine) { m.Status.Observed.BootID = "" }), node: ready},
		{name: "no Node: the heartbeat decides", m: machine("n"), node: Node{}},
		{name: "a leader whose control plane is not ready", m: machine("n", leader, controlPlane(metav1.ConditionFalse)), node: ready, want: true},
		{name: "a leader whose control plane is ready", m: machine("n", leader, controlPlane(metav1.ConditionTrue)), node: ready},
		{name: "a leader that reports no control plane (the labs)", m: machine("n", leader), node: ready},
		{name: "a worker's condition counts for nothing", m: machine("n", controlPlane(metav1.ConditionFalse)), node: ready},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, Unavailable(tc.m, tc.silent, tc.node), tc.want)
		})
	}
}

// controlPlane sets the machine's ControlPlaneReady condition.
func controlPlane(status metav1.ConditionStatus) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) {
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: likenv1.ConditionControlPlaneReady, Status: status})
	}
}

func TestGrantOrder(t *testing.T) {
	names := func(ms []*likenv1.Machine) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []*likenv1.Machine
		want []string
	}{
		{name: "none"},
		{name: "leaders first, then by name", in: []*likenv1.Machine{machine("a"), machine("b", leader), machine("c"), machine("d", leader)}, want: []string{"b", "d", "a", "c"}},
		{name: "byte order within a group", in: []*likenv1.Machine{machine("node-1"), machine("node-10"), machine("node-2")}, want: []string{"node-1", "node-10", "node-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.DeepEqual(t, names(GrantOrder(tc.in)), tc.want)
		})
	}
}
