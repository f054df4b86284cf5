package layer

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/internal/pki"
)

// checkAdminKubeconfig checks that the kubeconfig b loads with client-go,
// reaches server trusting the identity's server CA, and authenticates with
// a certificate of the identity's client CA for client auth, naming user
// and groups, valid from before now until now+validity.
func checkAdminKubeconfig(t *testing.T, b []byte, id *Identity, server, user string, groups []string, now time.Time, validity time.Duration) {
	t.Helper()
	cc, err := clientcmd.NewClientConfigFromBytes(b)
	assert.NilError(t, err)
	cfg, err := cc.ClientConfig()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cfg.Host, server))
	assert.Check(t, is.DeepEqual(cfg.CAData, id.Files["server-ca.crt"]))
	cert, err := pki.ParseCert(cfg.CertData)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cert.Subject.CommonName, user))
	// DER sorts the organizations; Kubernetes takes them in any order.
	assert.Check(t, is.DeepEqual(slices.Sorted(slices.Values(cert.Subject.Organization)), slices.Sorted(slices.Values(groups))))
	assert.Check(t, is.Equal(cert.NotAfter, now.Add(validity).UTC().Truncate(time.Second)))
	assert.Check(t, !cert.NotBefore.After(now), "valid from %s, after its issue at %s", cert.NotBefore, now)
	key, err := pki.ParseKey(cfg.KeyData)
	assert.NilError(t, err)
	assert.Check(t, publicKeysEqual(key.Public(), cert.PublicKey), "the key is not the certificate's")

	clientCA, err := pki.ParseCert(id.Files["client-ca.crt"])
	assert.NilError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(clientCA)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	assert.Check(t, err, "the API server checks clients against the client CA")
	serverCA, err := pki.ParseCert(id.Files["server-ca.crt"])
	assert.NilError(t, err)
	others := x509.NewCertPool()
	others.AddCert(serverCA)
	_, err = cert.Verify(x509.VerifyOptions{Roots: others, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	assert.Check(t, err != nil, "the certificate verifies against the server CA, which must not sign clients")
}

// TestAdminKubeconfig: the kubeconfig reaches the normalised server,
// trusts the server CA, and carries a client certificate of the client CA
// for the user and groups asked, valid for the validity asked.
func TestAdminKubeconfig(t *testing.T) {
	id, err := LoadIdentity(fixtureIdentity(t))
	assert.NilError(t, err)
	now := time.Date(2027, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		req      AdminRequest
		wantHost string
	}{
		{name: "host:port", req: AdminRequest{Server: "10.0.0.10:6443", User: DefaultAdminUser, Groups: []string{AdminGroup}, Validity: DefaultAdminValidity},
			wantHost: "https://10.0.0.10:6443"},
		{name: "URL without a port", req: AdminRequest{Server: "https://api.example.com", User: "alice", Groups: []string{"ops", "dev"}, Validity: time.Hour},
			wantHost: "https://api.example.com:443"},
		{name: "IPv6 URL with a slash", req: AdminRequest{Server: "https://[fd00::1]:6443/", User: "liken-lab-admin", Groups: []string{AdminGroup}, Validity: 365 * 24 * time.Hour},
			wantHost: "https://[fd00::1]:6443"},
		{name: "no group", req: AdminRequest{Server: "api.example.com:6443", User: "bob", Validity: 90 * time.Minute},
			wantHost: "https://api.example.com:6443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Now = now
			k, err := AdminKubeconfig(id, tc.req)
			assert.NilError(t, err)
			b, err := pki.EncodeKubeconfig(k)
			assert.NilError(t, err)
			checkAdminKubeconfig(t, b, id, tc.wantHost, tc.req.User, tc.req.Groups, now, tc.req.Validity)
		})
	}
}

// TestAdminKubeconfigRefuses: a bad server, user, group or validity, and
// an identity without the client CA's key, are refused with what to do.
func TestAdminKubeconfigRefuses(t *testing.T) {
	id, err := LoadIdentity(fixtureIdentity(t))
	assert.NilError(t, err)
	now := time.Date(2027, 6, 1, 12, 0, 0, 0, time.UTC)
	good := AdminRequest{Server: "10.0.0.10:6443", User: DefaultAdminUser, Groups: []string{AdminGroup}, Now: now, Validity: time.Hour}
	for _, tc := range []struct {
		name   string
		id     *Identity
		change func(*AdminRequest)
		err    string
	}{
		{name: "no server", change: func(r *AdminRequest) { r.Server = " " },
			err: "no API server: give its host:port or URL, such as 10.0.0.10:6443"},
		{name: "not a URL", change: func(r *AdminRequest) { r.Server = "api example com:6443" },
			err: `API server "api example com:6443" is not host:port or a URL`},
		{name: "no host", change: func(r *AdminRequest) { r.Server = "https://:6443" },
			err: `API server "https://:6443" is not host:port or a URL`},
		{name: "http", change: func(r *AdminRequest) { r.Server = "http://10.0.0.10:6443" },
			err: `API server "http://10.0.0.10:6443" is not https`},
		{name: "empty port", change: func(r *AdminRequest) { r.Server = "https://api.example.com:" },
			err: `API server "https://api.example.com:" has no port between 1 and 65535`},
		{name: "port out of range", change: func(r *AdminRequest) { r.Server = "10.0.0.10:70000" },
			err: `API server "10.0.0.10:70000" has no port between 1 and 65535`},
		{name: "port zero", change: func(r *AdminRequest) { r.Server = "10.0.0.10:0" },
			err: `API server "10.0.0.10:0" has no port between 1 and 65535`},
		{name: "query", change: func(r *AdminRequest) { r.Server = "https://10.0.0.10:6443/?x=1" },
			err: "holds a user, a query or a fragment"},
		{name: "user in URL", change: func(r *AdminRequest) { r.Server = "https://me@10.0.0.10:6443" },
			err: "holds a user, a query or a fragment"},
		{name: "no user", change: func(r *AdminRequest) { r.User = "" },
			err: "no user name for the certificate: give one, such as liken-admin"},
		{name: "empty group", change: func(r *AdminRequest) { r.Groups = []string{AdminGroup, ""} },
			err: "an empty group name"},
		{name: "no validity", change: func(r *AdminRequest) { r.Validity = 0 },
			err: "validity 0s is not positive"},
		{name: "negative validity", change: func(r *AdminRequest) { r.Validity = -time.Hour },
			err: "validity -1h0m0s is not positive"},
		{name: "outlives the client CA", change: func(r *AdminRequest) { r.Validity = 20 * 365 * 24 * time.Hour },
			err: "the client CA expires at 2036-11-27T05:13:57Z, before the certificate would (2047-05-27T12:00:00Z): choose a shorter validity"},
		{name: "a worker's identity", id: id.WithoutPrivateKeys(),
			err: "the identity has no client-ca.key, the key that signs administrators' certificates: a worker's layer carries the identity's certificates and join token but no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, use := good, id
			if tc.change != nil {
				tc.change(&req)
			}
			if tc.id != nil {
				use = tc.id
			}
			_, err := AdminKubeconfig(use, req)
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// TestKubeconfigCommand: liken layer kubeconfig creates the kubeconfig
// with mode 0600, says on stderr what it wrote, for whom and until when,
// prints the export line, and never replaces the file.
func TestKubeconfigCommand(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		user     string
		groups   []string
		validity time.Duration
	}{
		{name: "defaults", user: "liken-admin", groups: []string{"system:masters"}, validity: 24 * time.Hour},
		{name: "user, groups and validity", args: []string{"--user", "alice", "--group", "ops", "--group", "dev", "--valid-for", "1h"},
			user: "alice", groups: []string{"ops", "dev"}, validity: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := workdir(t)
			id, err := LoadIdentity(filepath.Join(dir, "identity"))
			assert.NilError(t, err)
			before := time.Now()
			out, stderr, err := run(t, dir, append([]string{"kubeconfig", "--identity", "identity", "--server", "10.0.0.10:6443", "-o", "admin.kubeconfig"}, tc.args...)...)
			assert.NilError(t, err)
			after := time.Now()

			path := filepath.Join(dir, "admin.kubeconfig")
			// The shell form of the path: the temporary folder holds no quote.
			assert.Check(t, is.Equal(out, "export KUBECONFIG='"+path+"'\n"))
			assert.Check(t, is.Contains(stderr, "Wrote admin.kubeconfig (mode 0600): user "+tc.user+" in "+strings.Join(tc.groups, ", ")+" for https://10.0.0.10:6443, valid until "))
			assert.Check(t, is.Contains(stderr, "it cannot be revoked"))
			st, err := os.Stat(path)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o600)))
			entries, err := os.ReadDir(dir)
			assert.NilError(t, err)
			assert.Check(t, is.Len(entries, 4), "expected the documents, the identity and the kubeconfig: %v", entries)

			b, err := os.ReadFile(path)
			assert.NilError(t, err)
			cfg, err := clientcmd.Load(b)
			assert.NilError(t, err)
			cert, err := pki.ParseCert(cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].ClientCertificateData)
			assert.NilError(t, err)
			// Issued between before and after: check it as issued at its
			// own NotAfter-validity, which lies in that span.
			issued := cert.NotAfter.Add(-tc.validity)
			assert.Check(t, !issued.Before(before.Truncate(time.Second)) && !issued.After(after), "issued at %s, not between %s and %s", issued, before, after)
			checkAdminKubeconfig(t, b, id, "https://10.0.0.10:6443", tc.user, tc.groups, issued, tc.validity)

			// A second run replaces nothing.
			_, _, err = run(t, dir, "kubeconfig", "--identity", "identity", "--server", "10.0.0.20:6443", "-o", "admin.kubeconfig")
			assert.ErrorContains(t, err, "admin.kubeconfig already exists: remove it or choose another name; liken layer kubeconfig never replaces a file")
			again, err := os.ReadFile(path)
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(again, b))
		})
	}
}

// TestKubeconfigCommandRefuses: missing or bad arguments, and a worker's
// identity, are refused with what to do, and no file is written.
func TestKubeconfigCommandRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		args  []string
		err   string
	}{
		{name: "no output", args: []string{"--identity", "identity", "--server", "10.0.0.10:6443"},
			err: "no output file: pass -o FILE, such as -o admin.kubeconfig"},
		{name: "no identity", args: []string{"--server", "10.0.0.10:6443", "-o", "admin.kubeconfig"},
			err: "no identity: pass --identity DIR, the folder liken layer generate wrote"},
		{name: "no server", args: []string{"--identity", "identity", "-o", "admin.kubeconfig"},
			err: "no API server: give its host:port or URL"},
		{name: "bad server", args: []string{"--identity", "identity", "--server", "http://10.0.0.10:6443", "-o", "admin.kubeconfig"},
			err: `API server "http://10.0.0.10:6443" is not https`},
		{name: "missing identity folder", args: []string{"--identity", "elsewhere", "--server", "10.0.0.10:6443", "-o", "admin.kubeconfig"},
			err: "identity folder elsewhere: stat elsewhere: no such file or directory (liken layer generate writes one)"},
		{name: "a worker's identity", setup: func(t *testing.T, dir string) {
			for _, n := range privateKeyFiles() {
				assert.NilError(t, os.Remove(filepath.Join(dir, "identity", filepath.FromSlash(n))))
			}
		}, args: []string{"--identity", "identity", "--server", "10.0.0.10:6443", "-o", "admin.kubeconfig"},
			err: "identity identity has no client-ca.key, the key that signs administrators' certificates: a worker's layer carries the identity's certificates and join token but no key; use the identity folder liken layer generate wrote"},
		{name: "no validity", args: []string{"--identity", "identity", "--server", "10.0.0.10:6443", "--valid-for", "0s", "-o", "admin.kubeconfig"},
			err: "validity 0s is not positive"},
		{name: "an existing link", setup: func(t *testing.T, dir string) {
			assert.NilError(t, os.Symlink("nowhere", filepath.Join(dir, "admin.kubeconfig")))
		}, args: []string{"--identity", "identity", "--server", "10.0.0.10:6443", "-o", "admin.kubeconfig"},
			err: "admin.kubeconfig already exists: remove it or choose another name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := workdir(t)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			before, err := os.ReadDir(dir)
			assert.NilError(t, err)
			out, _, err := run(t, dir, append([]string{"kubeconfig"}, tc.args...)...)
			assert.ErrorContains(t, err, tc.err)
			assert.Check(t, is.Equal(out, ""))
			after, err := os.ReadDir(dir)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(len(after), len(before)), "files written: %v", after)
		})
	}
}
