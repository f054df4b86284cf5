package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// kubeconfig writes a kubeconfig whose client certificate has the given
// subject and expiry, issued an hour before now, and returns its path.
func kubeconfig(t *testing.T, cn string, groups []string, notAfter time.Time) string {
	return kubeconfigFrom(t, cn, groups, now.Add(-time.Hour), notAfter)
}

func kubeconfigFrom(t *testing.T, cn string, groups []string, notBefore, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn, Organization: groups},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	assert.NilError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	assert.NilError(t, err)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	assert.NilError(t, WriteCredentials(path, &rest.Config{Host: "https://127.0.0.1:1"},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return path
}

func TestCheck(t *testing.T) {
	day := 24 * time.Hour
	tokenOnly := filepath.Join(t.TempDir(), "token.kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "abcdef.0123456789abcdef"}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	assert.NilError(t, clientcmd.WriteToFile(*cfg, tokenOnly))

	for _, tc := range []struct {
		name  string
		path  string
		until time.Time
		want  string
	}{
		{"its own certificate, valid", kubeconfig(t, "system:node:m1", []string{NodeGroup}, now.Add(365*day)), now.Add(day), ""},
		{"not joined yet", filepath.Join(t.TempDir(), "missing"), now, "the machine has not joined yet"},
		{"a token, no certificate", tokenOnly, now, "holds no client certificate and key"},
		{"another machine's certificate", kubeconfig(t, "system:node:m2", []string{NodeGroup}, now.Add(365*day)), now, `holds the certificate of "system:node:m2", not of "system:node:m1"`},
		{"not in system:nodes", kubeconfig(t, "system:node:m1", []string{"system:masters"}, now.Add(365*day)), now, `the certificate's groups are ["system:masters"], not [system:nodes]`},
		{"expires before the deadline", kubeconfig(t, "system:node:m1", []string{NodeGroup}, now.Add(time.Hour)), now.Add(day), "expires at 2026-12-01T13:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.path, "m1", tc.until)
			if tc.want == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestJoinWithoutToken(t *testing.T) {
	ctx := context.Background()
	clock := func() time.Time { return now }

	// A valid certificate needs no token, and is left as it is.
	valid := kubeconfig(t, "system:node:m1", []string{NodeGroup}, now.Add(365*24*time.Hour))
	before, err := os.ReadFile(valid)
	assert.NilError(t, err)
	assert.NilError(t, Join(ctx, Options{Machine: "m1", Kubeconfig: valid, Now: clock}))
	after, err := os.ReadFile(valid)
	assert.NilError(t, err)
	assert.DeepEqual(t, before, after)

	// One whose renewal is due is left as it is at a join; a renewal while
	// the cluster does not answer fails and leaves it too.
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	due := kubeconfigFrom(t, "system:node:m1", []string{NodeGroup}, now.Add(-3*time.Hour), now.Add(time.Hour))
	cfg, err := clientcmd.LoadFromFile(due)
	assert.NilError(t, err)
	cfg.Clusters["liken"].Server = down.URL
	assert.NilError(t, clientcmd.WriteToFile(*cfg, due))
	before, err = os.ReadFile(KeyFile(due))
	assert.NilError(t, err)
	assert.NilError(t, Join(ctx, Options{Machine: "m1", Kubeconfig: due, Now: clock}))
	err = Renew(ctx, Options{Machine: "m1", Kubeconfig: due, Now: clock})
	assert.ErrorContains(t, err, "renewing the machine's certificate, which expires at 2026-12-01T13:00:00Z (it serves until then)")
	after, err = os.ReadFile(KeyFile(due))
	assert.NilError(t, err)
	assert.DeepEqual(t, before, after)

	// No certificate and no token: the error says what to give.
	err = Join(ctx, Options{Machine: "m1", Kubeconfig: filepath.Join(t.TempDir(), "kubeconfig"), Now: clock})
	assert.ErrorContains(t, err, "the machine has not joined yet) and there is no join token to get a new certificate: give liken-node --bootstrap-kubeconfig")

	// Someone else's certificate is never used.
	other := kubeconfig(t, "system:node:m2", []string{NodeGroup}, now.Add(365*24*time.Hour))
	assert.ErrorContains(t, Join(ctx, Options{Machine: "m1", Kubeconfig: other, Now: clock}), `not of "system:node:m1"`)
}

func TestWriteIsPrivate(t *testing.T) {
	path := kubeconfig(t, "system:node:m1", []string{NodeGroup}, now.Add(time.Hour))
	for _, p := range []string{path, KeyFile(path)} {
		fi, err := os.Stat(p)
		assert.NilError(t, err)
		assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600), "%s holds or names the machine's private key", p)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 2, "no temporary file is left behind")
}

// TestRenewalDue: a certificate is renewed once two thirds of its lifetime
// have passed, as the kubelet renews its own.
func TestRenewalDue(t *testing.T) {
	for _, tc := range []struct {
		name      string
		notBefore time.Time
		due       bool
	}{
		{"a third of its life", now.Add(-time.Hour), false},
		{"just before two thirds", now.Add(-4*time.Hour + time.Second), false},
		{"two thirds", now.Add(-4 * time.Hour), true},
		{"expired", now.Add(-9 * time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := kubeconfigFrom(t, "system:node:m1", []string{NodeGroup}, tc.notBefore, tc.notBefore.Add(6*time.Hour))
			due, _ := RenewalDue(path, now)
			assert.Equal(t, due, tc.due)
		})
	}
	due, _ := RenewalDue(filepath.Join(t.TempDir(), "missing"), now)
	assert.Assert(t, due, "no certificate at all")
}

// TestJoinRequestErrors: a failed certificate request says whether the
// cluster refused the join token or its API did not answer, and writes
// nothing.
func TestJoinRequestErrors(t *testing.T) {
	status := func(code int, reason string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":%q,"code":%d}`, reason, code)
		}
	}
	server := func(h http.Handler) string {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		return s.URL
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, tc := range []struct {
		name, host, want string
	}{
		{"wrong token", server(status(http.StatusUnauthorized, "Unauthorized")), "the cluster refused the join token (is it the fleet's, and not expired?"},
		{"no binding", server(status(http.StatusForbidden, "Forbidden")), "the join token may not ask for certificates (the binding liken:join:create-csr is missing"},
		{"another refusal", server(status(http.StatusUnprocessableEntity, "Invalid")), "the API server refused the request: "},
		{"API down", down.URL, "the API does not answer (a leader's control plane may still be starting; liken-node tries again)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubeconfig")
			err := Join(context.Background(), Options{Machine: "m1", Kubeconfig: path, Now: func() time.Time { return now },
				Bootstrap: &rest.Config{Host: tc.host, BearerToken: "abcdef.0123456789abcdef"}})
			assert.ErrorContains(t, err, "asking the cluster at "+tc.host+" for a certificate for system:node:m1: "+tc.want)
			_, err = os.Stat(path)
			assert.Assert(t, os.IsNotExist(err), "a failed join wrote %s", path)
		})
	}
}
