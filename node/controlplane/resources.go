package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/manifests"
)

// DocumentsFile is, in a leader's LeaderDir, the layer's Cluster and
// Machine documents (YAML, one after another), which Init creates when
// they do not exist.
const DocumentsFile = "documents.yaml"

// ReadDocuments reads the objects of a DocumentsFile. A leader installed
// before liken wrote the file has none.
func ReadDocuments(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return manifests.DecodeAll(path, b)
}

// resource is where the API serves a kind.
type resource struct {
	name       string
	namespaced bool
}

// resources are the kinds EnsureResources creates: those of liken's
// manifests and of the layer's documents.
var resources = map[schema.GroupKind]resource{
	{Kind: "Namespace"}:      {"namespaces", false},
	{Kind: "ServiceAccount"}: {"serviceaccounts", true},
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:                 {"customresourcedefinitions", false},
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:                         {"clusterroles", false},
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}:                  {"clusterrolebindings", false},
	{Group: "rbac.authorization.k8s.io", Kind: "Role"}:                                {"roles", true},
	{Group: "rbac.authorization.k8s.io", Kind: "RoleBinding"}:                         {"rolebindings", true},
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}:        {"validatingadmissionpolicies", false},
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicyBinding"}: {"validatingadmissionpolicybindings", false},
	{Group: "apps", Kind: "Deployment"}:                                               {"deployments", true},
	{Group: "liken.sh", Kind: "Cluster"}:                                              {"clusters", false},
	{Group: "liken.sh", Kind: "Machine"}:                                              {"machines", false},
}

// DocumentsRecord is the ConfigMap in kube-system where control-plane init
// records each object it created or found (data: recordKey), so that it
// creates each one once in the cluster's life: a Machine a person deleted
// (a machine taken out of the fleet), or a cluster-operator Deployment
// deleted to run it elsewhere, stays deleted at the leaders' next boots.
const DocumentsRecord = "liken-layer-documents"

// recordKey names obj in DocumentsRecord: KIND.NAMESPACE.NAME, with the
// colons of RBAC names made underscores (a ConfigMap key has none).
func recordKey(obj *unstructured.Unstructured) string {
	return strings.ReplaceAll(obj.GetKind()+"."+obj.GetNamespace()+"."+obj.GetName(), ":", "_")
}

// EnsureResources creates each object that does not exist and was never
// created (DocumentsRecord), in order, and leaves one that exists as it is
// (create-only): liken's own resources (manifests.Resources) and the
// layer's Cluster and Machines, so that a fleet installed from its layers
// needs no kubectl apply, and what a person changed or deleted later stays
// so. An object a newer release's manifests add is created at its leaders'
// first boot. A Cluster or Machine is created once its CRD is served;
// until then this fails, and Init tries again.
//
// Each object is recorded as soon as it is created or found, so a run that
// fails on a later object (and is tried again) never creates twice what a
// person deleted in between. A power cut between an object and its record
// costs nothing: the next run finds the object and records it. The record
// is made before the first object, the namespace, and so before liken's
// CRDs: a cluster that serves liken's Cluster CRD but has no record was
// set up by hand before the record existed (a leader installed into an
// older fleet), and this records every object as found and creates none,
// so nothing deleted there comes back.
func EnsureResources(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, objs []*unstructured.Unstructured) error {
	log := klog.FromContext(ctx)
	cms := kube.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	record, err := cms.Get(ctx, DocumentsRecord, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		record = nil
	case err != nil:
		return fmt.Errorf("reading the record of the layer's documents %s/%s: %w", metav1.NamespaceSystem, DocumentsRecord, err)
	default:
		record = record.DeepCopy()
	}
	if record == nil {
		handMade, err := servesClusters(ctx, dyn)
		if err != nil {
			return err
		}
		if handMade {
			return recordAll(ctx, cms, objs)
		}
	}
	// save records key, creating the record the first time.
	save := func(key string) error {
		if record == nil {
			fresh := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DocumentsRecord, Namespace: metav1.NamespaceSystem}, Data: map[string]string{key: "created"}}
			made, err := cms.Create(ctx, fresh, metav1.CreateOptions{FieldManager: InitFieldManager})
			if err != nil {
				// Another leader's init may have made it: the next try
				// reads it, and finds this object made.
				return fmt.Errorf("recording %s in %s/%s: %w", key, metav1.NamespaceSystem, DocumentsRecord, err)
			}
			record = made.DeepCopy()
			return nil
		}
		if record.Data == nil {
			record.Data = map[string]string{}
		}
		record.Data[key] = "created"
		saved, err := cms.Update(ctx, record, metav1.UpdateOptions{FieldManager: InitFieldManager})
		if err != nil {
			return fmt.Errorf("recording %s in %s/%s: %w", key, metav1.NamespaceSystem, DocumentsRecord, err)
		}
		record = saved.DeepCopy()
		return nil
	}
	for _, obj := range objs {
		client, document, err := clientFor(dyn, obj)
		if err != nil {
			return err
		}
		key := recordKey(obj)
		if record != nil {
			if _, done := record.Data[key]; done {
				continue
			}
		}
		create := obj.DeepCopy()
		unstructured.RemoveNestedField(create.Object, "status")
		_, err = client.Create(ctx, create, metav1.CreateOptions{FieldManager: InitFieldManager})
		switch {
		case apierrors.IsAlreadyExists(err):
		case apierrors.IsNotFound(err) && document:
			return fmt.Errorf("creating %s %s: the API server does not serve %s yet (liken's CRDs were created a moment ago)", obj.GetKind(), obj.GetName(), obj.GroupVersionKind().GroupKind())
		case err != nil:
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), klog.KObj(obj), err)
		default:
			log.Info("Created a resource", "kind", obj.GetKind(), "object", klog.KObj(obj))
		}
		if err := save(key); err != nil {
			return err
		}
	}
	return nil
}

// clientFor is where the API serves obj, and whether obj is one of the
// layer's documents (a Cluster or a Machine).
func clientFor(dyn dynamic.Interface, obj *unstructured.Unstructured) (dynamic.ResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(obj.GetAPIVersion())
	if err != nil {
		return nil, false, permanent(fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err))
	}
	gk := schema.GroupKind{Group: gv.Group, Kind: obj.GetKind()}
	res, ok := resources[gk]
	if !ok {
		return nil, false, permanent(fmt.Errorf("%s %s: liken's control-plane init creates no %s", obj.GetKind(), obj.GetName(), gk))
	}
	if res.namespaced {
		return dyn.Resource(gv.WithResource(res.name)).Namespace(obj.GetNamespace()), gv.Group == likenv1.GroupName, nil
	}
	return dyn.Resource(gv.WithResource(res.name)), gv.Group == likenv1.GroupName, nil
}

// clusterCRD is the name of liken's Cluster CRD.
const clusterCRD = "clusters." + likenv1.GroupName

// servesClusters tells whether liken's Cluster CRD exists.
func servesClusters(ctx context.Context, dyn dynamic.Interface) (bool, error) {
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	_, err := dyn.Resource(crds).Get(ctx, clusterCRD, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the CRD %s: %w", clusterCRD, err)
	}
	return true, nil
}

// recordAll makes the record of a cluster whose liken resources were
// applied by hand: every object as found, none created.
func recordAll(ctx context.Context, cms corev1client.ConfigMapInterface, objs []*unstructured.Unstructured) error {
	record := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DocumentsRecord, Namespace: metav1.NamespaceSystem}, Data: map[string]string{}}
	for _, obj := range objs {
		record.Data[recordKey(obj)] = "found"
	}
	if _, err := cms.Create(ctx, record, metav1.CreateOptions{FieldManager: InitFieldManager}); err != nil {
		return fmt.Errorf("recording the resources of a cluster set up by hand in %s/%s: %w", metav1.NamespaceSystem, DocumentsRecord, err)
	}
	klog.FromContext(ctx).Info("liken's resources were applied by hand before this record existed: recorded them all, created none", "record", klog.KRef(metav1.NamespaceSystem, DocumentsRecord), "objects", len(objs))
	return nil
}
