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
// until then this fails, and Init tries again. A power cut between a
// document and its record costs nothing: the next init finds it and
// records it.
func EnsureResources(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, objs []*unstructured.Unstructured) error {
	log := klog.FromContext(ctx)
	cms := kube.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	record, err := cms.Get(ctx, DocumentsRecord, metav1.GetOptions{})
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err):
		record = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DocumentsRecord, Namespace: metav1.NamespaceSystem}}
	case err != nil:
		return fmt.Errorf("reading the record of the layer's documents %s/%s: %w", metav1.NamespaceSystem, DocumentsRecord, err)
	default:
		record = record.DeepCopy()
	}
	if record.Data == nil {
		record.Data = map[string]string{}
	}
	added := 0
	for _, obj := range objs {
		gv, err := schema.ParseGroupVersion(obj.GetAPIVersion())
		if err != nil {
			return permanent(fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err))
		}
		gk := schema.GroupKind{Group: gv.Group, Kind: obj.GetKind()}
		res, ok := resources[gk]
		if !ok {
			return permanent(fmt.Errorf("%s %s: liken's control-plane init creates no %s", obj.GetKind(), obj.GetName(), gk))
		}
		document := gv.Group == likenv1.GroupName
		key := recordKey(obj)
		if _, done := record.Data[key]; done {
			continue
		}
		var client dynamic.ResourceInterface = dyn.Resource(gv.WithResource(res.name))
		if res.namespaced {
			client = dyn.Resource(gv.WithResource(res.name)).Namespace(obj.GetNamespace())
		}
		create := obj.DeepCopy()
		unstructured.RemoveNestedField(create.Object, "status")
		_, err = client.Create(ctx, create, metav1.CreateOptions{FieldManager: InitFieldManager})
		switch {
		case apierrors.IsAlreadyExists(err):
		case apierrors.IsNotFound(err) && document:
			return fmt.Errorf("creating %s %s: the API server does not serve %s yet (liken's CRDs were created a moment ago)", obj.GetKind(), obj.GetName(), gv.WithResource(res.name).GroupResource())
		case err != nil:
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), klog.KObj(obj), err)
		default:
			log.Info("Created a resource", "kind", obj.GetKind(), "object", klog.KObj(obj))
		}
		record.Data[key] = "created"
		added++
	}
	if added == 0 {
		return nil
	}
	if !exists {
		_, err = cms.Create(ctx, record, metav1.CreateOptions{FieldManager: InitFieldManager})
	} else {
		_, err = cms.Update(ctx, record, metav1.UpdateOptions{FieldManager: InitFieldManager})
	}
	if err != nil {
		// Another leader's init may have written it: the next try reads it
		// again, and finds the documents made.
		return fmt.Errorf("recording the layer's documents created in %s/%s: %w", metav1.NamespaceSystem, DocumentsRecord, err)
	}
	return nil
}
