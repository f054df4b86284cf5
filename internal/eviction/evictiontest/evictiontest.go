// Package evictiontest builds the pods the drain's rule is tested with, for the tests of internal/eviction and node/drain.
package evictiontest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is a running pod of namespace app on node-1, labelled app=name,
// changed by each mut.
func Pod(name string, mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app", UID: types.UID("uid-" + name), Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

// WithClaim gives the pod a DRA ResourceClaim.
func WithClaim(p *corev1.Pod) {
	n := "gpu"
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &n}}
}

// OwnedBy makes the pod controlled by an object of kind.
func OwnedBy(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		t := true
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: "x", Controller: &t, APIVersion: "apps/v1"}}
	}
}

// HostPath mounts path from the host into the pod.
func HostPath(path string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}})
	}
}
