package pki

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/tools/clientcmd"
)

var now = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func newTestCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test-ca", now, 24*time.Hour)
	assert.NilError(t, err)
	return ca
}

func verify(leaf *Leaf, ca *CA, at time.Time, usage x509.ExtKeyUsage) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func TestIssue(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		name        string
		req         Request
		wantEKU     []x509.ExtKeyUsage
		verifies    []x509.ExtKeyUsage
		refuses     []x509.ExtKeyUsage
		wantDNS     []string
		wantIPs     []string
		wantSubject pkix.Name
	}{
		{
			name: "serving",
			req: Request{CommonName: "kube-apiserver", DNSNames: []string{"localhost", "kubernetes.default.svc"},
				IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}, Usage: ServerAuth, Now: now, Validity: time.Hour},
			wantEKU:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			verifies: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			refuses:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			wantDNS:  []string{"localhost", "kubernetes.default.svc"},
			wantIPs:  []string{"127.0.0.1", "10.96.0.1"},
		},
		{
			name:     "client in a group",
			req:      Request{CommonName: "admin", Organizations: []string{"system:masters"}, Usage: ClientAuth, Now: now, Validity: time.Hour},
			wantEKU:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			verifies: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			refuses:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		},
		{
			name:     "both, as an etcd member",
			req:      Request{CommonName: "etcd", DNSNames: []string{"leader-1"}, Usage: ServerAuth | ClientAuth, Now: now, Validity: time.Hour},
			wantEKU:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			verifies: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			wantDNS:  []string{"leader-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := ca.Issue(tc.req)
			assert.NilError(t, err)
			c := leaf.Cert
			assert.Check(t, is.DeepEqual(c.ExtKeyUsage, tc.wantEKU))
			assert.Check(t, is.Equal(c.Subject.CommonName, tc.req.CommonName))
			assert.Check(t, is.DeepEqual(c.Subject.Organization, tc.req.Organizations))
			assert.Check(t, is.DeepEqual(c.DNSNames, tc.wantDNS))
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			assert.Check(t, is.DeepEqual(ips, tc.wantIPs))
			assert.Check(t, !c.IsCA)
			assert.Check(t, is.Equal(c.NotAfter, now.Add(time.Hour)))
			for _, u := range tc.verifies {
				assert.Check(t, verify(leaf, ca, now, u), "usage %v", u)
			}
			for _, u := range tc.refuses {
				assert.Check(t, verify(leaf, ca, now, u) != nil, "usage %v verified, want refused", u)
			}
			assert.Check(t, verify(leaf, ca, now.Add(2*time.Hour), tc.wantEKU[0]) != nil, "verified after it expired")
			other := newTestCA(t)
			assert.Check(t, verify(leaf, other, now, tc.wantEKU[0]) != nil, "verified against another CA")
		})
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"no common name", Request{Usage: ClientAuth, Now: now, Validity: time.Hour}, "needs a common name"},
		{"no usage", Request{CommonName: "x", Now: now, Validity: time.Hour}, "server auth, client auth or both"},
		{"unknown usage", Request{CommonName: "x", Usage: 8, Now: now, Validity: time.Hour}, "server auth, client auth or both"},
		{"no time", Request{CommonName: "x", Usage: ClientAuth, Validity: time.Hour}, "time of issue"},
		{"no validity", Request{CommonName: "x", Usage: ClientAuth, Now: now}, "positive validity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ca.Issue(tc.req)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestLoadCA(t *testing.T) {
	ecCA := newTestCA(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	assert.NilError(t, err)
	rsaTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rsa-ca"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	rsaDER, err := x509.CreateCertificate(rand.Reader, rsaTmpl, rsaTmpl, rsaKey.Public(), rsaKey)
	assert.NilError(t, err)
	rsaCert, err := x509.ParseCertificate(rsaDER)
	assert.NilError(t, err)
	rsaCA := &CA{Cert: rsaCert, Key: rsaKey}
	leaf, err := ecCA.Issue(Request{CommonName: "leaf", Usage: ClientAuth, Now: now, Validity: time.Hour})
	assert.NilError(t, err)
	ecKeyPEM, err := EncodeKey(ecCA.Key)
	assert.NilError(t, err)
	rsaKeyPEM, err := EncodeKey(rsaKey)
	assert.NilError(t, err)
	leafKeyPEM, err := leaf.KeyPEM()
	assert.NilError(t, err)

	for _, tc := range []struct {
		name      string
		cert, key []byte // nil: no file
		want      *CA
		wantErr   string // with %c for the certificate's path, %k for the key's
		errFile   string // "crt" or "key": the file the error names
	}{
		{name: "ECDSA", cert: ecCA.CertPEM(), key: ecKeyPEM, want: ecCA},
		{name: "RSA", cert: rsaCA.CertPEM(), key: rsaKeyPEM, want: rsaCA},
		{name: "bad certificate PEM", cert: []byte("not PEM\n"), key: ecKeyPEM, wantErr: "not a PEM certificate", errFile: "crt"},
		{name: "a key where the certificate belongs", cert: ecKeyPEM, key: ecKeyPEM, wantErr: "not a PEM certificate", errFile: "crt"},
		{name: "bad key PEM", cert: ecCA.CertPEM(), key: []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), wantErr: "not a valid private key", errFile: "key"},
		{name: "a certificate where the key belongs", cert: ecCA.CertPEM(), key: ecCA.CertPEM(), wantErr: "is not a private key", errFile: "key"},
		{name: "key of another CA", cert: ecCA.CertPEM(), key: rsaKeyPEM, wantErr: "the key pair does not match", errFile: "key"},
		{name: "not a CA", cert: leaf.CertPEM(), key: leafKeyPEM, wantErr: "not a CA", errFile: "crt"},
		{name: "missing key", cert: ecCA.CertPEM(), wantErr: "no such file", errFile: "key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			certFile, keyFile := filepath.Join(dir, "server-ca.crt"), filepath.Join(dir, "server-ca.key")
			assert.NilError(t, os.WriteFile(certFile, tc.cert, 0o644))
			if tc.key != nil {
				assert.NilError(t, os.WriteFile(keyFile, tc.key, 0o600))
			}
			ca, err := LoadCA(certFile, keyFile)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				named := map[string]string{"crt": certFile, "key": keyFile}[tc.errFile]
				assert.ErrorContains(t, err, named)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, ca.Cert.Equal(tc.want.Cert))
			// It signs leaves that verify against it.
			l, err := ca.Issue(Request{CommonName: "leaf", Usage: ServerAuth, Now: now, Validity: time.Hour})
			assert.NilError(t, err)
			assert.Check(t, verify(l, tc.want, now, x509.ExtKeyUsageServerAuth))
		})
	}
}

func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	assert.NilError(t, ca.Write(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")))
	loaded, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	assert.NilError(t, err)
	assert.Check(t, loaded.Cert.Equal(ca.Cert))

	leaf, err := ca.Issue(Request{CommonName: "admin", Organizations: []string{"system:masters"}, Usage: ClientAuth, Now: now, Validity: time.Hour})
	assert.NilError(t, err)
	assert.NilError(t, leaf.Write(filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")))
	assert.NilError(t, WriteKubeconfig(filepath.Join(dir, "admin.kubeconfig"), Kubeconfig{Server: "https://127.0.0.1:6443", CA: ca.CertPEM(), Client: leaf}))

	for name, mode := range map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600, "admin.crt": 0o644, "admin.key": 0o600, "admin.kubeconfig": 0o600} {
		st, err := os.Stat(filepath.Join(dir, name))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(st.Mode().Perm(), mode), name)
	}
	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Check(t, is.Len(entries, 5), "temporary files left: %v", entries)

	// The kubeconfig is one client-go loads into a working TLS client.
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cfg.Host, "https://127.0.0.1:6443"))
	assert.Check(t, is.DeepEqual(cfg.CAData, ca.CertPEM()))
	assert.Check(t, is.DeepEqual(cfg.CertData, leaf.CertPEM()))
	keyPEM, err := leaf.KeyPEM()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(cfg.KeyData, keyPEM))
	raw, err := clientcmd.LoadFromFile(filepath.Join(dir, "admin.kubeconfig"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(raw.Contexts[raw.CurrentContext].AuthInfo, "admin"))
}

func TestWriteKubeconfigRefusesIncomplete(t *testing.T) {
	err := WriteKubeconfig(filepath.Join(t.TempDir(), "x.kubeconfig"), Kubeconfig{Server: "https://127.0.0.1:6443"})
	assert.ErrorContains(t, err, "x.kubeconfig needs a server, a CA and a client certificate")
}
