package controlplane

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/internal/pki"
	"liken.sh/liken/node/join"
)

// TestIssueMachineCredentials: a leader's kubelet and liken-node get
// certificates for system:node:<leader> of the client CA, the kubelet's in
// its own store (the kubelet-client-current.pem link it rotates), and
// nothing is issued again while both serve and are not due for renewal.
func TestIssueMachineCredentials(t *testing.T) {
	identity, cas := testIdentity(t)
	dir := t.TempDir()
	where := MachineCredentials{
		KubeletKubeconfig: filepath.Join(dir, "kubelet", "kubeconfig"),
		KubeletCertDir:    filepath.Join(dir, "kubelet", "pki"),
		NodeKubeconfig:    filepath.Join(dir, "machine", "liken-node.kubeconfig"),
	}
	cfg := certsConfig()
	assert.NilError(t, IssueMachineCredentials(cfg, identity, where, now))

	for _, kc := range []string{where.KubeletKubeconfig, where.NodeKubeconfig} {
		assert.NilError(t, join.Check(kc, "leader-2", now.Add(300*24*time.Hour)), kc)
		loaded, err := clientcmd.LoadFromFile(kc)
		assert.NilError(t, err)
		c := loaded.Clusters[loaded.Contexts[loaded.CurrentContext].Cluster]
		assert.Equal(t, c.Server, cfg.Endpoint)
		rc, err := clientcmd.BuildConfigFromFlags("", kc)
		assert.NilError(t, err)
		b, err := os.ReadFile(rc.CertFile)
		assert.NilError(t, err)
		cert, err := pki.ParseCert(b)
		assert.NilError(t, err)
		assert.NilError(t, verify(cert, cas[ClientCA], x509.ExtKeyUsageClientAuth), kc)
		assertMode(t, rc.KeyFile, 0o600)
	}
	current, err := os.Readlink(filepath.Join(where.KubeletCertDir, "kubelet-client-current.pem"))
	assert.NilError(t, err, "the kubelet's current certificate is a link, which it moves when it rotates")
	assert.Assert(t, filepath.IsAbs(current))

	before := listFiles(t, dir)
	assert.NilError(t, IssueMachineCredentials(cfg, identity, where, now.Add(time.Hour)))
	assert.DeepEqual(t, listFiles(t, dir), before)

	// Past two thirds of their life both are issued again.
	later := now.Add(CertValidity * 3 / 4)
	assert.NilError(t, IssueMachineCredentials(cfg, identity, where, later))
	for _, kc := range []string{where.KubeletKubeconfig, where.NodeKubeconfig} {
		due, expires := join.RenewalDue(kc, later)
		assert.Assert(t, !due, "%s expires %s", kc, expires)
	}
}
