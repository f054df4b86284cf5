package layer

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/node/controlplane"
)

// TestLeaderIdentityFitsControlPlane checks that the identity a leader's
// layer carries is the one its control plane's setup reads: the same file
// names (node/ may not import this package, so it names them itself) and
// key formats it loads.
func TestLeaderIdentityFitsControlPlane(t *testing.T) {
	var names []string
	for _, ca := range CAs {
		names = append(names, ca.Name)
	}
	var cpNames []string
	for _, p := range controlplane.CAs {
		cpNames = append(cpNames, string(p))
	}
	slices.Sort(names)
	slices.Sort(cpNames)
	assert.Check(t, is.DeepEqual(cpNames, names))
	assert.Check(t, is.Equal(controlplane.ServiceAccountKeyFile, ServiceAccountKeyFile))

	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	id, err := GenerateIdentity(GenerateOptions{Cluster: "lab", Now: now})
	assert.NilError(t, err)
	dir := filepath.Join(t.TempDir(), "identity")
	assert.NilError(t, WriteIdentity(dir, id))
	cfg := controlplane.Config{
		Machine: "leader-1", Endpoint: "https://10.0.2.2:7443", ServiceCIDR: "10.96.0.0/16", FirstLeader: "leader-1",
		Leaders: []controlplane.Leader{{Name: "leader-1", APIServer: "https://10.0.2.2:16443", EtcdClient: "https://10.0.2.2:12379", EtcdPeer: "https://10.0.2.2:12380"}},
	}
	assert.NilError(t, controlplane.Setup(cfg, dir, t.TempDir(), now))
}
