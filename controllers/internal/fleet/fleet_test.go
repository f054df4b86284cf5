package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

func TestStateOf(t *testing.T) {
	node := func(conds ...corev1.NodeCondition) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: conds}}
	}
	for name, tc := range map[string]struct {
		node *corev1.Node
		want NodeState
	}{
		"ready":   {node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}), NodeReady},
		"down":    {node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse}), NodeNotReady},
		"unknown": {node(corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}), NodeNotReady},
		"new":     {node(), NodeNotReady},
		"absent":  {nil, NodeMissing},
	} {
		assert.Equal(t, StateOf(tc.node), tc.want, name)
	}
}

// TestRosterOrder: whatever order the index returns them in, and however
// the membership changes between calls, the machines come out in byte
// order of their names, as the current objects of the cache.
func TestRosterOrder(t *testing.T) {
	f := likeninformers.NewSharedInformerFactory(likenfake.NewSimpleClientset(), 0)
	inf := f.Liken().V1alpha1().Machines().Informer()
	assert.NilError(t, AddIndexers(inf))
	idx := inf.GetIndexer()
	machine := func(name, cluster, version string) *likenv1.Machine {
		return &likenv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: likenv1.MachineSpec{Cluster: cluster},
			Status: likenv1.MachineStatus{Version: version}}
	}
	var want []string
	for i := range 300 {
		want = append(want, fmt.Sprintf("node-%d", i))
	}
	want = append(want, "Node-3", "node-", "node-1-a")
	for _, i := range rand.Perm(len(want)) {
		assert.NilError(t, idx.Add(machine(want[i], "lab", "v1")))
	}
	assert.NilError(t, idx.Add(machine("other", "elsewhere", "v1")))
	r := &Roster{}
	names := func(ms []*likenv1.Machine) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	check := func(what string) []*likenv1.Machine {
		t.Helper()
		got, err := r.MachinesOf(idx, "lab")
		assert.NilError(t, err)
		sorted := slices.Clone(want)
		slices.Sort(sorted)
		assert.Assert(t, is.DeepEqual(names(got), sorted), what)
		return got
	}
	first := check("first call")
	assert.DeepEqual(t, names(first)[:6], []string{"Node-3", "node-", "node-0", "node-1", "node-1-a", "node-10"})
	check("same membership")

	// An update: the new object comes out, in its place.
	assert.NilError(t, idx.Update(machine("node-42", "lab", "v2")))
	got := check("after an update")
	i, _ := slices.BinarySearchFunc(got, "node-42", func(m *likenv1.Machine, n string) int { return strings.Compare(m.Name, n) })
	assert.Equal(t, got[i].Status.Version, "v2")

	// One machine leaves and another joins between two calls: same count.
	assert.NilError(t, idx.Delete(machine("node-7", "lab", "v1")))
	assert.NilError(t, idx.Add(machine("node-07", "lab", "v1")))
	want = slices.DeleteFunc(want, func(n string) bool { return n == "node-7" })
	want = append(want, "node-07")
	check("after a swap")

	// A machine moves to another cluster; one joins.
	assert.NilError(t, idx.Update(machine("node-1", "elsewhere", "v1")))
	want = slices.DeleteFunc(want, func(n string) bool { return n == "node-1" })
	check("after a move")
	assert.NilError(t, idx.Add(machine("aaa", "lab", "v1")))
	want = append(want, "aaa")
	check("after an add")

	r.Forget("lab")
	check("after Forget")
	none, err := r.MachinesOf(idx, "nobody")
	assert.NilError(t, err)
	assert.Equal(t, len(none), 0)
}

func TestSmallFacts(t *testing.T) {
	assert.Equal(t, NewestVersion([]string{"2026.11.01-001", "2026.11.20-001", "2026.11.05-002"}), "2026.11.20-001")
	assert.Equal(t, NewestVersion(nil), "")
	assert.Equal(t, TurnsString([]likenv1.RebootTurn{{Machine: "b"}, {Machine: "a"}}), "b,a")
}

func TestCordonedByLiken(t *testing.T) {
	for name, tc := range map[string]struct {
		unschedulable bool
		annotated     bool
		want          bool
	}{
		"liken's cordon":              {true, true, true},
		"a person's cordon":           {true, false, false},
		"uncordoned":                  {false, false, false},
		"uncordoned, annotation left": {false, true, false},
	} {
		n := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: tc.unschedulable}}
		if tc.annotated {
			n.Annotations = map[string]string{likenv1.AnnotationCordoned: "change-1"}
		}
		assert.Equal(t, CordonedByLiken(n), tc.want, name)
	}
}
