package layer

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestGenerateIdentity(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	id, err := GenerateIdentity(GenerateOptions{Cluster: "lab", Now: now})
	assert.NilError(t, err)
	assert.NilError(t, id.Verify())

	for _, ca := range CAs {
		c, err := parseCert(id.Files[ca.CertFile()])
		assert.NilError(t, err)
		assert.Assert(t, c.IsCA, ca.Name)
		assert.Equal(t, c.Subject.CommonName, ca.CommonName+"@lab")
		assert.Assert(t, c.KeyUsage&x509.KeyUsageCertSign != 0)
		assert.Equal(t, c.NotAfter, now.Add(DefaultCAValidity).UTC())
	}
	// Each CA has its own key.
	seen := map[string]bool{}
	for _, ca := range CAs {
		k := string(id.Files[ca.KeyFile()])
		assert.Assert(t, !seen[k])
		seen[k] = true
	}

	// The token is in the full format k3s accepts, bound to the server CA,
	// and carries a Kubernetes bootstrap token.
	tok := strings.TrimSpace(string(id.Files[TokenFile]))
	m := regexp.MustCompile(`^K10([0-9a-f]{64})::([a-z0-9]{6})\.([a-z0-9]{16})$`).FindStringSubmatch(tok)
	assert.Assert(t, m != nil, "token format")
	sum := sha256.Sum256(id.Files["server-ca.crt"])
	assert.Equal(t, m[1], hex.EncodeToString(sum[:]))
	tid, secret, err := BootstrapToken(id.Files[TokenFile])
	assert.NilError(t, err)
	assert.Equal(t, tid+"."+secret, m[2]+"."+m[3])

	other, err := GenerateIdentity(GenerateOptions{})
	assert.NilError(t, err)
	assert.Assert(t, string(other.Files[TokenFile]) != string(id.Files[TokenFile]))
}

func TestWriteIdentityModes(t *testing.T) {
	id, err := GenerateIdentity(GenerateOptions{})
	assert.NilError(t, err)
	dir := filepath.Join(t.TempDir(), "id")
	assert.NilError(t, os.MkdirAll(dir, 0o700))
	assert.NilError(t, WriteIdentity(dir, id))
	for _, n := range IdentityFiles() {
		st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(n)))
		assert.NilError(t, err)
		want := os.FileMode(0o644)
		if strings.HasSuffix(n, ".key") || n == TokenFile {
			want = 0o600
		}
		assert.Equal(t, st.Mode().Perm(), want, n)
	}
	st, err := os.Stat(filepath.Join(dir, "etcd"))
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))

	// A cluster keeps its identity: no overwrite.
	err = WriteIdentity(dir, id)
	assert.ErrorContains(t, err, "already holds an identity")

	got, err := LoadIdentity(dir)
	assert.NilError(t, err)
	assert.DeepEqual(t, got.Files, id.Files)
}

func TestLoadIdentityRefuses(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(dir string)
		want   []string
	}{
		{"missing file", func(dir string) { os.Remove(filepath.Join(dir, "etcd", "peer-ca.key")) },
			[]string{"incomplete", "etcd/peer-ca.key is missing", "liken layer generate"}},
		{"not a certificate", func(dir string) { os.WriteFile(filepath.Join(dir, "client-ca.crt"), []byte("hello"), 0o644) },
			[]string{"client-ca.crt: not a PEM certificate"}},
		{"garbage key", func(dir string) {
			os.WriteFile(filepath.Join(dir, "service.key"), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600)
		}, []string{"service.key: not a valid private key"}},
		{"token without format", func(dir string) { os.WriteFile(filepath.Join(dir, "token"), []byte("secret123"), 0o600) },
			[]string{"token: the join token is not in the full format"}},
		{"short secret", func(dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "server-ca.crt"))
			os.WriteFile(filepath.Join(dir, "token"), []byte(JoinToken(b, "abcdef.abc")), 0o600)
		}, []string{"a bootstrap token: 6 and 16 characters"}},
		{"a directory instead of a file", func(dir string) {
			os.Remove(filepath.Join(dir, "token"))
			os.Mkdir(filepath.Join(dir, "token"), 0o700)
		}, []string{"token is not a regular file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := fixtureIdentity(t)
			tc.break_(dir)
			_, err := LoadIdentity(dir)
			assert.Assert(t, err != nil)
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
			assert.Assert(t, !strings.Contains(err.Error(), fixtureSecret(t)), "token printed")
			assert.Assert(t, !strings.Contains(err.Error(), "secret123"), "token printed")
		})
	}
}

func TestFingerprintsRevealNoSecret(t *testing.T) {
	id, err := GenerateIdentity(GenerateOptions{})
	assert.NilError(t, err)
	fps := id.Fingerprints()
	assert.Equal(t, len(fps), len(IdentityFiles()))
	_, secret, err := BootstrapToken(id.Files[TokenFile])
	assert.NilError(t, err)
	for _, fp := range fps {
		s := fp.Detail + fp.SHA256
		assert.Assert(t, !strings.Contains(s, secret))
		assert.Assert(t, !strings.Contains(s, "PRIVATE"))
		if strings.HasSuffix(fp.File, ".crt") {
			c, err := parseCert(id.Files[fp.File])
			assert.NilError(t, err)
			sum := sha256.Sum256(c.Raw)
			assert.Equal(t, fp.SHA256, colonHex(sum[:]))
		}
	}
}

// fixtureSecret is the secret part of the fixture identity's join token.
func fixtureSecret(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testdata, "identity", TokenFile))
	assert.NilError(t, err)
	tok := strings.TrimSpace(string(b))
	return tok[strings.LastIndex(tok, ".")+1:]
}
