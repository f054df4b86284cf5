package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// TestReadLayerMachine: a machine installed by a newer liken, whose
// machine.yaml has fields this release does not know, still has its
// role read; a document that is no Machine is refused with the file's
// name; no file is no document.
func TestReadLayerMachine(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	newer := write("newer.yaml", "apiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata:\n  name: node-4\nspec:\n  role: Leader\n  aFieldOfANewerRelease: 3\n")
	m, err := ReadLayerMachine(newer)
	assert.NilError(t, err)
	assert.Equal(t, m.Spec.Role, likenv1.RoleLeader)

	_, err = ReadLayerMachine(write("cluster.yaml", "apiVersion: liken.sh/v1alpha1\nkind: Cluster\nmetadata:\n  name: prod\n"))
	assert.ErrorContains(t, err, "cluster.yaml holds no Machine document")

	m, err = ReadLayerMachine(filepath.Join(dir, "missing.yaml"))
	assert.NilError(t, err)
	assert.Assert(t, m == nil)
}
