package eviction

import (
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"liken.sh/liken/internal/eviction/evictiontest"
)

// The pods of the drain's rule (shared with the other package's tests).
var (
	pod       = evictiontest.Pod
	withClaim = evictiontest.WithClaim
	ownedBy   = evictiontest.OwnedBy
	hostPath  = evictiontest.HostPath
)

func TestClassify(t *testing.T) {
	cases := []struct {
		name string
		pod  *corev1.Pod
		kind Kind
	}{
		{"plain", pod("a"), Other},
		{"replicaset", pod("a", ownedBy("ReplicaSet")), Other},
		{"daemonset", pod("a", ownedBy("DaemonSet")), Stays},
		{"mirror", pod("a", func(p *corev1.Pod) { p.Annotations = map[string]string{MirrorPodAnnotation: "x"} }), Stays},
		{"claim", pod("a", withClaim), ClaimHolder},
		{"finished", pod("a", withClaim, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), Finished},
		{"driver label", pod("a", func(p *corev1.Pod) { p.Labels[LabelDRADriver] = "true" }), Stays},
		{"driver registry mount", pod("a", hostPath("/var/lib/kubelet/plugins_registry")), Stays},
		{"driver plugins mount", pod("a", hostPath("/var/lib/kubelet/plugins/gpu.example.com")), Stays},
		{"kubelet dir mount", pod("a", hostPath("/var/lib/kubelet/")), Stays},
		{"other host path", pod("a", hostPath("/var/log")), Other},
		{"similar prefix", pod("a", hostPath("/var/lib/kubelet/plugins_registry2")), Other},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, _ := Classify(tc.pod)
			assert.Equal(t, k, tc.kind)
		})
	}
}

func TestEvicts(t *testing.T) {
	cases := []struct {
		name           string
		pod            *corev1.Pod
		evicted, takes bool
	}{
		{"plain", pod("a"), true, true},
		{"claim holder", pod("a", withClaim), true, true},
		{"daemonset", pod("a", ownedBy("DaemonSet")), false, false},
		{"mirror", pod("a", func(p *corev1.Pod) { p.Annotations = map[string]string{MirrorPodAnnotation: "x"} }), false, false},
		{"dra driver", pod("a", func(p *corev1.Pod) { p.Labels[LabelDRADriver] = "true" }), false, false},
		{"finished", pod("a", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), false, false},
		{"pending: evicted without a budget", pod("a", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }), true, false},
		{"being deleted", pod("a", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }), true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			evicted, takes := Evicts(tc.pod)
			assert.Equal(t, evicted, tc.evicted)
			assert.Equal(t, takes, tc.takes)
		})
	}
}

func TestBudgetSelector(t *testing.T) {
	b := func(sel *metav1.LabelSelector) *policyv1.PodDisruptionBudget {
		return &policyv1.PodDisruptionBudget{Spec: policyv1.PodDisruptionBudgetSpec{Selector: sel}}
	}
	_, ok := BudgetSelector(b(nil))
	assert.Assert(t, !ok, "no selector covers nothing")
	_, ok = BudgetSelector(b(&metav1.LabelSelector{}))
	assert.Assert(t, !ok, "an empty selector covers nothing (as the Eviction API reads it)")
	_, ok = BudgetSelector(b(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}))
	assert.Assert(t, !ok, "an unreadable selector covers nothing")
	sel, ok := BudgetSelector(b(&metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}))
	assert.Assert(t, ok)
	assert.Assert(t, sel.Matches(labels.Set(pod("a").Labels)))
}
