// Package eviction holds the rule of liken's drain shared by the node
// daemon, which drains by it, and cluster-operator, which checks before a
// grant whether a drain would be blocked: which pods the drain evicts,
// which stay, and which PodDisruptionBudgets cover a pod.
package eviction

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Names that decide which pods stay on a draining node.
const (
	// LabelDRADriver marks a pod that runs a DRA driver when nothing else
	// tells (it mounts no kubelet plugin folder and no DaemonSet owns it).
	LabelDRADriver = "liken.sh/dra-driver"
	// KubeletPluginsRegistry is where kubelet plugins (DRA drivers, CSI
	// node plugins) register with the kubelet; a pod that mounts it, or a
	// folder that holds it or lies under it, talks to the kubelet as a
	// plugin.
	KubeletPluginsRegistry = "/var/lib/kubelet/plugins_registry"
	// KubeletPlugins holds the sockets of kubelet plugins.
	KubeletPlugins = "/var/lib/kubelet/plugins"
	// MirrorPodAnnotation marks the API copy of a static pod.
	MirrorPodAnnotation = "kubernetes.io/config.mirror"
)

// Kind is how the drain treats a pod.
type Kind int

// Pod kinds, in the order the drain handles them.
const (
	// Finished pods (Succeeded or Failed) hold nothing; the drain ignores them.
	Finished Kind = iota
	// Stays: DaemonSet pods, mirror pods and DRA driver pods are not evicted.
	Stays
	// ClaimHolder pods hold a DRA ResourceClaim: evicted first, and gone
	// before any other pod is evicted, so their drivers can still answer
	// the kubelet's unprepare calls.
	ClaimHolder
	// Other pods are evicted once every claim holder is gone.
	Other
)

// String names the kind.
func (k Kind) String() string {
	return [...]string{"finished", "stays", "claim holder", "other"}[k]
}

// Classify says how the drain treats pod, and why for a pod that stays.
func Classify(pod *corev1.Pod) (Kind, string) {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Finished, "finished"
	}
	if _, ok := pod.Annotations[MirrorPodAnnotation]; ok {
		return Stays, "mirror pod of a static pod"
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
		return Stays, "DaemonSet pod"
	}
	if IsDRADriver(pod) {
		return Stays, "DRA driver pod"
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		return ClaimHolder, "holds a ResourceClaim"
	}
	return Other, ""
}

// IsDRADriver tells whether pod runs a DRA driver: it carries the label
// liken.sh/dra-driver=true, or it mounts a host folder through which
// kubelet plugins register or serve (under /var/lib/kubelet/plugins or
// plugins_registry, or a folder above them). Every DRA kubelet plugin needs
// such a mount to be found by the kubelet.
func IsDRADriver(pod *corev1.Pod) bool {
	if pod.Labels[LabelDRADriver] == "true" {
		return true
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		p := strings.TrimRight(v.HostPath.Path, "/")
		for _, dir := range []string{KubeletPluginsRegistry, KubeletPlugins} {
			if p == dir || strings.HasPrefix(p, dir+"/") || (p != "" && strings.HasPrefix(dir, p+"/")) {
				return true
			}
		}
	}
	return false
}

// BudgetSelector is the selector of the pods, in the budget's namespace,
// whose eviction the PodDisruptionBudget b limits; ok is false when it
// covers no pod: the Eviction API ignores a budget whose selector is
// missing, empty or cannot be read.
func BudgetSelector(b *policyv1.PodDisruptionBudget) (sel labels.Selector, ok bool) {
	if b.Spec.Selector == nil {
		return nil, false
	}
	sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
	if err != nil || sel.Empty() {
		return nil, false
	}
	return sel, true
}

// Evicts tells whether the drain evicts pod (a claim holder or other), and
// whether that takes a disruption from its budgets: not for a Pending pod
// (the Eviction API lets it go) nor one already being deleted.
func Evicts(pod *corev1.Pod) (evicted, takesDisruption bool) {
	switch k, _ := Classify(pod); k {
	case ClaimHolder, Other:
		return true, pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodPending
	}
	return false, false
}
