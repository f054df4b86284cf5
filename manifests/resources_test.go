package manifests

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestResources: liken's resources come in the order a cluster takes them
// (the namespace, the CRDs, then what uses them, cluster-operator last).
func TestResources(t *testing.T) {
	objs, err := Resources()
	assert.NilError(t, err)
	var kinds []string
	for _, o := range objs {
		if len(kinds) == 0 || kinds[len(kinds)-1] != o.GetKind() {
			kinds = append(kinds, o.GetKind())
		}
	}
	assert.DeepEqual(t, kinds, []string{
		"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
		"Role", "RoleBinding", "Role", "RoleBinding", "Role", "RoleBinding",
		"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Deployment",
	})
}

func TestDecodeAllRefusesAnObjectWithoutAName(t *testing.T) {
	_, err := DecodeAll("documents.yaml", []byte("# a comment\n---\napiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata:\n  name: node-1\n---\napiVersion: liken.sh/v1alpha1\nkind: Machine\nspec: {}\n"))
	assert.Error(t, err, "documents.yaml, document 3: an object needs an apiVersion, a kind and a metadata.name")
	objs, err := DecodeAll("documents.yaml", []byte("---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n"))
	assert.NilError(t, err)
	assert.Equal(t, len(objs), 1)
}
