package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/generated/clientset/versioned"
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

// TestLayerDocumentsAtEveryLeaderBoot runs a leader's creation of liken's
// resources and the layer's documents against the real API server: the
// first boot's creates the CRDs, cluster-operator and the Cluster and
// Machines (once the CRDs are served), so a fleet installed from its
// layers needs no kubectl apply; a later boot's leaves what a person
// changed since.
func TestLayerDocumentsAtEveryLeaderBoot(t *testing.T) {
	cp := controlplanetest.Start(t, controlplane.Options{})
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	liken, err := versioned.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	resources, err := manifests.Resources()
	assert.NilError(t, err)
	docs := filepath.Join(t.TempDir(), nodecp.DocumentsFile)
	var b []byte
	for _, f := range []string{"examples/cluster.yaml", "examples/machines.yaml"} {
		y, err := manifests.FS.ReadFile(f)
		assert.NilError(t, err)
		b = append(append(b, "---\n"...), y...)
	}
	assert.NilError(t, os.WriteFile(docs, b, 0o600))
	layerDocs, err := nodecp.ReadDocuments(docs)
	assert.NilError(t, err)
	objs := append(resources, layerDocs...)

	// As Init does: again until the CRDs are served.
	ensure := func(what string) {
		t.Helper()
		var last error
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if last = nodecp.EnsureResources(ctx, kube, dyn, objs); last != nil {
				return poll.Continue("%v", last)
			}
			return poll.Success()
		}, poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))
		t.Logf("%s: done", what)
	}
	ensure("the first leader's first boot")
	c, err := liken.LikenV1alpha1().Clusters().Get(ctx, "mycluster", metav1.GetOptions{})
	assert.NilError(t, err)
	ms, err := liken.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Check(t, len(ms.Items) > 0 && len(ms.Items) == len(layerDocs)-1, "%d Machines for %d documents", len(ms.Items), len(layerDocs))
	_, err = kube.AppsV1().Deployments("liken-system").Get(ctx, "cluster-operator", metav1.GetOptions{})
	assert.NilError(t, err)

	// A person changes the Cluster, takes a machine out of the fleet
	// (deletes its Machine) and deletes cluster-operator's Deployment (to
	// run it elsewhere); the next boot's run leaves all of it so.
	seven := intstr.FromInt32(7)
	c.Spec.Disruption.MaxUnavailable = &seven
	_, err = liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	gone := ms.Items[len(ms.Items)-1].Name
	assert.NilError(t, liken.LikenV1alpha1().Machines().Delete(ctx, gone, metav1.DeleteOptions{}))
	assert.NilError(t, kube.AppsV1().Deployments("liken-system").Delete(ctx, "cluster-operator", metav1.DeleteOptions{}))
	ensure("a leader's next boot")
	c, err = liken.LikenV1alpha1().Clusters().Get(ctx, "mycluster", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(c.Spec.Disruption.MaxUnavailable, &seven))
	assert.Check(t, is.Equal(c.ManagedFields[0].Manager, nodecp.InitFieldManager))
	_, err = liken.LikenV1alpha1().Machines().Get(ctx, gone, metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "Machine %s, deleted, came back: %v", gone, err)
	_, err = kube.AppsV1().Deployments("liken-system").Get(ctx, "cluster-operator", metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "cluster-operator's Deployment, deleted, came back: %v", err)

	// A run that fails on a later document (one the API refuses) has
	// recorded what it created before it: the next run, once the bad
	// document is gone from the layer, leaves deleted what a person
	// deleted in between.
	machine := func(name, role string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "liken.sh/v1alpha1", "kind": "Machine",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"cluster": "mycluster", "role": role}}}
	}
	late := machine("node-late", "Worker")
	err = nodecp.EnsureResources(ctx, kube, dyn, append(objs, late, machine("node-bad", "Captain")))
	assert.ErrorContains(t, err, "creating Machine node-bad")
	assert.NilError(t, liken.LikenV1alpha1().Machines().Delete(ctx, "node-late", metav1.DeleteOptions{}))
	assert.NilError(t, nodecp.EnsureResources(ctx, kube, dyn, append(objs, late)))
	_, err = liken.LikenV1alpha1().Machines().Get(ctx, "node-late", metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "Machine node-late, created before a failed document and deleted, came back: %v", err)

	// A cluster whose liken resources were applied by hand before the
	// record existed (its record is missing, liken's CRDs are there): a
	// leader installed into it creates nothing, not even what was deleted
	// there, and records it all.
	assert.NilError(t, kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Delete(ctx, nodecp.DocumentsRecord, metav1.DeleteOptions{}))
	assert.NilError(t, nodecp.EnsureResources(ctx, kube, dyn, append(objs, late)))
	_, err = liken.LikenV1alpha1().Machines().Get(ctx, gone, metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "Machine %s, deleted before the record existed, came back: %v", gone, err)
	_, err = kube.AppsV1().Deployments("liken-system").Get(ctx, "cluster-operator", metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "cluster-operator's Deployment, deleted before the record existed, came back: %v", err)
	record, err := kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, nodecp.DocumentsRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Len(record.Data, len(objs)+1))

	// A document of a kind liken does not create is refused, naming it.
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "x", "namespace": "default"}}}
	assert.ErrorContains(t, nodecp.EnsureResources(ctx, kube, dyn, []*unstructured.Unstructured{secret}), "Secret x: liken's control-plane init creates no Secret")
}
