package fleet

import (
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

func TestNodeStateOf(t *testing.T) {
	f := kubeinformers.NewSharedInformerFactory(kubefake.NewClientset(), 0)
	idx := f.Core().V1().Nodes().Informer().GetIndexer()
	node := func(name string, conds ...corev1.NodeCondition) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: conds}}
	}
	assert.NilError(t, idx.Add(node("ready", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})))
	assert.NilError(t, idx.Add(node("down", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse})))
	assert.NilError(t, idx.Add(node("unknown", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown})))
	assert.NilError(t, idx.Add(node("new")))
	for name, want := range map[string]NodeState{"ready": NodeReady, "down": NodeNotReady, "unknown": NodeNotReady, "new": NodeNotReady, "absent": NodeMissing} {
		got, _, err := NodeStateOf(f.Core().V1().Nodes().Lister(), name)
		assert.NilError(t, err)
		assert.Equal(t, got, want, name)
	}
}

func TestSmallFacts(t *testing.T) {
	assert.Equal(t, NewestVersion([]string{"2026.11.01-001", "2026.11.20-001", "2026.11.05-002"}), "2026.11.20-001")
	assert.Equal(t, NewestVersion(nil), "")
	assert.Equal(t, TurnsString([]likenv1.RebootTurn{{Machine: "b"}, {Machine: "a"}}), "b,a")
	m := &likenv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{likenv1.AnnotationApprovedChange: "x"}}}
	assert.Assert(t, IsManual(m), "Manual is the default")
	assert.Assert(t, Approved(m, "x"))
	assert.Assert(t, !Approved(m, "y"))
	assert.Assert(t, !Approved(&likenv1.Machine{}, ""), "an empty change is never approved")
}
