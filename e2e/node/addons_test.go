package node

import (
	"context"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/manifests"
	nodecp "liken.sh/liken/node/controlplane"
)

// TestAddonsAtEveryLeaderBoot runs a leader's creation of the cluster's
// add-ons against the real API server as every boot of a leader runs it:
// the first creates them; the next, with the objects there (the DNS
// Service holding its address), succeeds and leaves what a person
// changed alone.
func TestAddonsAtEveryLeaderBoot(t *testing.T) {
	cp := controlplanetest.Start(t, controlplane.Options{})
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	ctx := context.Background()
	var network likenv1.NetworkSpec
	dns, err := network.ClusterDNSOrDefault()
	assert.NilError(t, err)
	addons, err := manifests.DNSObjects(dns)
	assert.NilError(t, err)

	assert.NilError(t, nodecp.EnsureObjects(ctx, kube, addons))
	svc, err := kube.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(svc.Spec.ClusterIP, dns))

	// A person scales CoreDNS; the next boot's run leaves it so.
	dep, err := kube.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	three := int32(3)
	dep.Spec.Replicas = &three
	_, err = kube.AppsV1().Deployments("kube-system").Update(ctx, dep, metav1.UpdateOptions{})
	assert.NilError(t, err)

	assert.NilError(t, nodecp.EnsureObjects(ctx, kube, addons), "the add-ons at a leader's next boot")
	dep, err = kube.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(*dep.Spec.Replicas, three))
}
