package controlplane

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/internal/pki"
)

var now = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// certsConfig is a leader reached at its own address, behind an endpoint
// with a DNS name.
func certsConfig() Config {
	return Config{
		Machine:     "leader-2",
		Endpoint:    "https://api.fleet.example:6443",
		ServiceCIDR: "10.43.0.0/16",
		PodCIDR:     "10.42.0.0/16",
		FirstLeader: "leader-1",
		Leaders: []Leader{
			{Name: "leader-1", APIServer: "https://192.168.1.11:6443", EtcdClient: "https://192.168.1.11:2379", EtcdPeer: "https://192.168.1.11:2380"},
			{Name: "leader-2", APIServer: "https://192.168.1.12:6443", EtcdClient: "https://192.168.1.12:2379", EtcdPeer: "https://leader-2.fleet.example:2380"},
		},
	}
}

// testIdentity writes a leader's identity into a new folder: the five CAs
// with their keys and the service account key.
func testIdentity(t *testing.T) (dir string, cas map[Pair]*pki.CA) {
	t.Helper()
	dir = t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(dir, "etcd"), 0o700))
	cas = map[Pair]*pki.CA{}
	for _, p := range CAs {
		ca, err := pki.NewCA("test-"+string(p), now.Add(-24*time.Hour), 10*365*24*time.Hour)
		assert.NilError(t, err)
		assert.NilError(t, ca.Write(filepath.Join(dir, p.Cert()), filepath.Join(dir, p.Key())))
		cas[p] = ca
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	assert.NilError(t, err)
	assert.NilError(t, pki.WriteKey(filepath.Join(dir, ServiceAccountKeyFile), sa))
	return dir, cas
}

func TestSetup(t *testing.T) {
	identity, cas := testIdentity(t)
	out := filepath.Join(t.TempDir(), "control-plane")
	assert.NilError(t, Setup(certsConfig(), identity, out, now))

	serving := []string{"localhost", "leader-2", "leader-2.fleet.example", "api.fleet.example"}
	servingIPs := []string{"127.0.0.1", "192.168.1.12"}
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, tc := range []struct {
		file       string // a .crt, or a kubeconfig
		ca         Pair
		cn         string
		orgs       []string
		dns, ips   []string
		usages     []x509.ExtKeyUsage
		wrongUsage x509.ExtKeyUsage // one it must not verify for; 0: none
	}{
		{file: EtcdServer.Cert(), ca: EtcdServerCA, cn: "leader-2", dns: serving, ips: servingIPs, usages: both},
		{file: EtcdPeer.Cert(), ca: EtcdPeerCA, cn: "leader-2", dns: serving, ips: servingIPs, usages: both},
		{file: NodeEtcdClient.Cert(), ca: EtcdServerCA, cn: "liken-node", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{file: APIServerEtcdClient.Cert(), ca: EtcdServerCA, cn: "kube-apiserver-etcd-client", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{
			file: APIServer.Cert(), ca: ServerCA, cn: "kube-apiserver",
			dns:    append(slices.Clone(serving), "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
			ips:    append(slices.Clone(servingIPs), "10.43.0.1"),
			usages: server, wrongUsage: x509.ExtKeyUsageClientAuth,
		},
		{file: APIServerKubeletClient.Cert(), ca: ClientCA, cn: "kube-apiserver-kubelet-client", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{file: FrontProxyClient.Cert(), ca: RequestHeaderCA, cn: "front-proxy-client", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{file: ControllerManagerKubeconfig, ca: ClientCA, cn: "system:kube-controller-manager", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{file: SchedulerKubeconfig, ca: ClientCA, cn: "system:kube-scheduler", usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
		{file: InitKubeconfig, ca: ClientCA, cn: "liken-control-plane-init", orgs: []string{"system:masters"}, usages: client, wrongUsage: x509.ExtKeyUsageServerAuth},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(out, tc.file)
			var cert *x509.Certificate
			if filepath.Ext(tc.file) == ".crt" {
				b, err := os.ReadFile(path)
				assert.NilError(t, err)
				cert, err = pki.ParseCert(b)
				assert.NilError(t, err)
				keyPEM, err := os.ReadFile(path[:len(path)-len(".crt")] + ".key")
				assert.NilError(t, err)
				key, err := pki.ParseKey(keyPEM)
				assert.NilError(t, err)
				assert.Check(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey), "the key is not the certificate's")
				assertMode(t, path[:len(path)-len(".crt")]+".key", 0o600)
			} else {
				cfg, err := clientcmd.BuildConfigFromFlags("", path)
				assert.NilError(t, err)
				assert.Check(t, is.Equal(cfg.Host, "https://127.0.0.1:6443"))
				assert.Check(t, is.DeepEqual(cfg.CAData, cas[ServerCA].CertPEM()))
				cert, err = pki.ParseCert(cfg.CertData)
				assert.NilError(t, err)
				key, err := pki.ParseKey(cfg.KeyData)
				assert.NilError(t, err)
				assert.Check(t, key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey), "the key is not the certificate's")
				assertMode(t, path, 0o600)
			}
			assert.Check(t, is.Equal(cert.Subject.CommonName, tc.cn))
			assert.Check(t, is.DeepEqual(cert.Subject.Organization, tc.orgs))
			assert.Check(t, is.DeepEqual(cert.DNSNames, tc.dns))
			var ips []string
			for _, ip := range cert.IPAddresses {
				ips = append(ips, ip.String())
			}
			assert.Check(t, is.DeepEqual(ips, tc.ips))
			assert.Check(t, is.DeepEqual(cert.ExtKeyUsage, tc.usages))
			assert.Check(t, is.Equal(cert.NotAfter, now.Add(365*24*time.Hour)))
			for _, p := range CAs {
				for _, u := range tc.usages {
					err := verify(cert, cas[p], u)
					if p == tc.ca {
						assert.Check(t, err, "does not verify against %s for %v", p, u)
					} else {
						assert.Check(t, err != nil, "verifies against %s, want only %s", p, tc.ca)
					}
				}
			}
			if tc.wrongUsage != 0 {
				assert.Check(t, verify(cert, cas[tc.ca], tc.wrongUsage) != nil, "verifies for %v", tc.wrongUsage)
			}
		})
	}

	t.Run("copies", func(t *testing.T) {
		for _, p := range CAs {
			b, err := os.ReadFile(filepath.Join(out, p.Cert()))
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(b, cas[p].CertPEM()), p.Cert())
		}
		for _, f := range []string{ServiceAccountKeyFile, ClientCAKey} {
			want, err := os.ReadFile(filepath.Join(identity, f))
			assert.NilError(t, err)
			got, err := os.ReadFile(filepath.Join(out, f))
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(got, want), f)
			assertMode(t, filepath.Join(out, f), 0o600)
		}
		assertMode(t, out, 0o700|os.ModeDir)
		assertMode(t, filepath.Join(out, "etcd"), 0o700|os.ModeDir)
	})
}

// TestSetupRenews runs Setup as a second boot does: it replaces every file
// with one issued at the new time and leaves no temporary file.
func TestSetupRenews(t *testing.T) {
	identity, _ := testIdentity(t)
	out := t.TempDir()
	assert.NilError(t, Setup(certsConfig(), identity, out, now))
	before := listFiles(t, out)
	later := now.Add(30 * 24 * time.Hour)
	assert.NilError(t, Setup(certsConfig(), identity, out, later))
	assert.DeepEqual(t, listFiles(t, out), before)
	b, err := os.ReadFile(filepath.Join(out, APIServer.Cert()))
	assert.NilError(t, err)
	cert, err := pki.ParseCert(b)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cert.NotAfter, later.Add(CertValidity)))
}

func TestSetupRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, identity string, cfg *Config) string // returns what the error must name
		want   string
	}{
		{"invalid configuration", func(t *testing.T, _ string, cfg *Config) string { cfg.Machine = "worker-1"; return "machine" }, "is not among the leaders"},
		{"bad service account key", func(t *testing.T, identity string, _ *Config) string {
			p := filepath.Join(identity, ServiceAccountKeyFile)
			assert.NilError(t, os.WriteFile(p, []byte("not a key"), 0o600))
			return p
		}, "not a PEM private key"},
		{"missing service account key", func(t *testing.T, identity string, _ *Config) string {
			p := filepath.Join(identity, ServiceAccountKeyFile)
			assert.NilError(t, os.Remove(p))
			return p
		}, "no such file"},
		{"bad CA certificate", func(t *testing.T, identity string, _ *Config) string {
			p := filepath.Join(identity, RequestHeaderCA.Cert())
			assert.NilError(t, os.WriteFile(p, []byte("garbage"), 0o644))
			return p
		}, "not a PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			identity, _ := testIdentity(t)
			cfg := certsConfig()
			named := tc.change(t, identity, &cfg)
			err := Setup(cfg, identity, t.TempDir(), now)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, named)
		})
	}
	for _, p := range CAs {
		t.Run("missing "+p.Key(), func(t *testing.T) {
			identity, _ := testIdentity(t)
			key := filepath.Join(identity, p.Key())
			assert.NilError(t, os.Remove(key))
			out := filepath.Join(t.TempDir(), "out")
			err := Setup(certsConfig(), identity, out, now)
			assert.ErrorContains(t, err, key+": no such file")
			_, err = os.Stat(out)
			assert.Check(t, os.IsNotExist(err), "Setup wrote files before it had every CA")
		})
	}
}

func verify(cert *x509.Certificate, ca *pki.CA, usage x509.ExtKeyUsage) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.Mode()&(os.ModeDir|os.ModePerm), want), path)
}

func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	assert.NilError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return err
	}))
	return files
}
