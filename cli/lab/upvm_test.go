package lab

import (
	"crypto/x509"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/cli/layer"
	"liken.sh/liken/internal/pki"
)

// TestWriteAdminKubeconfig: the VM lab's kubeconfig reaches the endpoint
// as a member of system:masters, with a certificate of the cluster's
// client CA, and trusts only the cluster's server CA.
func TestWriteAdminKubeconfig(t *testing.T) {
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: "vm"})
	assert.NilError(t, err)
	p := filepath.Join(t.TempDir(), "admin.kubeconfig")
	assert.NilError(t, writeAdminKubeconfig(p, id, "https://127.0.0.1:40123"))

	cfg, err := clientcmd.BuildConfigFromFlags("", p)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Host, "https://127.0.0.1:40123")
	assert.DeepEqual(t, cfg.CAData, id.Files["server-ca.crt"])
	cert, err := pki.ParseCert(cfg.CertData)
	assert.NilError(t, err)
	assert.DeepEqual(t, cert.Subject.Organization, []string{"system:masters"})
	clientCA, err := pki.ParseCert(id.Files["client-ca.crt"])
	assert.NilError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(clientCA)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	assert.NilError(t, err, "the API server checks clients against the client CA")
}

// TestFailedChecks: waiting for the API, lab up names the checks /readyz
// reports as failed.
func TestFailedChecks(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"[+]ping ok\n[-]etcd failed: reason withheld\n[+]log ok\n[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\nreadyz check failed\n",
			"failed checks etcd, poststarthook/rbac/bootstrap-roles"},
		{"Service Unavailable\nmore\n", "Service Unavailable"},
		{"", ""},
	} {
		assert.Check(t, is.Equal(failedChecks(tc.body), tc.want))
	}
}
