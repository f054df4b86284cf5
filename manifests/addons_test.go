package manifests

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// TestDNSObjects: the cluster DNS add-on is CoreDNS's objects with the
// Service at the address given, its pods run the image the OS image
// preloads as a user that is not root, and a bad address is refused.
func TestDNSObjects(t *testing.T) {
	objs, err := DNSObjects("10.43.0.10")
	assert.NilError(t, err)
	var kinds []string
	for _, o := range objs {
		m, err := meta.Accessor(o)
		assert.NilError(t, err)
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind+" "+m.GetNamespace()+"/"+m.GetName())
		switch o := o.(type) {
		case *corev1.Service:
			assert.Check(t, is.Equal(o.Spec.ClusterIP, "10.43.0.10"))
			assert.Check(t, is.DeepEqual(o.Spec.ClusterIPs, []string{"10.43.0.10"}))
		case *appsv1.Deployment:
			c := o.Spec.Template.Spec.Containers[0]
			assert.Check(t, is.Equal(c.Image, "liken.sh/coredns:preloaded"))
			assert.Check(t, is.Equal(c.ImagePullPolicy, corev1.PullNever))
			assert.Check(t, *c.SecurityContext.RunAsNonRoot)
			assert.Check(t, is.Equal(o.Spec.Template.Spec.DNSPolicy, corev1.DNSDefault), "CoreDNS forwards to the machine's resolver")
		}
	}
	assert.DeepEqual(t, kinds, []string{
		"ServiceAccount kube-system/coredns",
		"ClusterRole /liken:coredns",
		"ClusterRoleBinding /liken:coredns",
		"ConfigMap kube-system/coredns",
		"Deployment kube-system/coredns",
		"Service kube-system/kube-dns",
	})
	d, err := DNSDeployment()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(d.Name, "coredns"))

	_, err = DNSObjects("10.43.0.10\nclusterIP: x")
	assert.ErrorContains(t, err, "is not an IP address")
}
