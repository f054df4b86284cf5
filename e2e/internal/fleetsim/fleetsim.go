// Package fleetsim plays liken's machines against a real control plane and
// a real cluster-operator, for end-to-end tests and benchmarks.
package fleetsim

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"k8s.io/client-go/tools/cache"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/internal/srctree"
)

// manifests are the files of liken's manifests a simulated fleet needs:
// the namespace, the CRDs, the RBAC of the operator and the machines, and
// the admission policy that keeps each machine to its own objects.
var manifests = []string{"00-namespace.yaml", "10-crd-cluster.yaml", "11-crd-machine.yaml", "20-rbac-operator.yaml", "21-rbac-machine.yaml", "22-admission-machine.yaml"}

// Install applies liken's manifests to cp and waits until its CRDs are
// established.
func Install(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane) {
	t.Helper()
	dir := filepath.Join(RepoRoot(t), "manifests")
	for _, f := range manifests {
		out, err := cp.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(dir, f))
		assert.NilError(t, err, out)
	}
	out, err := cp.Kubectl(ctx, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh")
	assert.NilError(t, err, out)
}

// RepoRoot is the liken source tree that holds the running test.
func RepoRoot(t testing.TB) string {
	t.Helper()
	d, err := srctree.Find()
	assert.NilError(t, err, "run the test from the liken source tree")
	return d
}

// BinDir is the folder that holds every named program of liken
// (srctree.BinDir). A missing program fails the test.
func BinDir(t testing.TB, names ...string) string {
	t.Helper()
	d, err := srctree.BinDir(names...)
	assert.NilError(t, err)
	return d
}

// Binary is the path of one of liken's programs (srctree.Binary). A
// missing program fails the test.
func Binary(t testing.TB, name string) string {
	t.Helper()
	p, err := srctree.Binary(name)
	assert.NilError(t, err)
	return p
}

// SyncTimeout bounds WaitForSync: a watch that cannot list (an API server
// that died, a missing permission) fails the test instead of hanging it.
const SyncTimeout = 2 * time.Minute

// WaitForSync waits until every informer has synced, for at most
// SyncTimeout or until ctx ends, and tells whether they did.
func WaitForSync(ctx context.Context, synced ...cache.InformerSynced) bool {
	ctx, cancel := context.WithTimeout(ctx, SyncTimeout)
	defer cancel()
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}
