package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

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

// EnsureResources creates each object that does not exist, in order, and
// leaves one that exists as it is (create-only): liken's own resources
// (manifests.Resources) and the layer's Cluster and Machines, so that a
// fleet installed from its layers needs no kubectl apply, and what a person
// changed later is never overwritten. A Cluster or Machine is created once
// its CRD is served; until then this fails, and Init tries again.
func EnsureResources(ctx context.Context, dyn dynamic.Interface, objs []*unstructured.Unstructured) error {
	log := klog.FromContext(ctx)
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
		var client dynamic.ResourceInterface = dyn.Resource(gv.WithResource(res.name))
		if res.namespaced {
			client = dyn.Resource(gv.WithResource(res.name)).Namespace(obj.GetNamespace())
		}
		create := obj.DeepCopy()
		unstructured.RemoveNestedField(create.Object, "status")
		_, err = client.Create(ctx, create, metav1.CreateOptions{FieldManager: InitFieldManager})
		switch {
		case apierrors.IsAlreadyExists(err):
		case apierrors.IsNotFound(err) && gv.Group == "liken.sh":
			return fmt.Errorf("creating %s %s: the API server does not serve %s yet (liken's CRDs were created a moment ago)", obj.GetKind(), obj.GetName(), gv.WithResource(res.name).GroupResource())
		case err != nil:
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), klog.KObj(obj), err)
		default:
			log.Info("Created a resource", "kind", obj.GetKind(), "object", klog.KObj(obj))
		}
	}
	return nil
}
