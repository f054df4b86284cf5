package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"liken.sh/liken/node/controlplane"
)

// fixtureIdentity copies testdata/identity into a temporary directory with
// the modes liken layer generate gives (git keeps no modes).
func fixtureIdentity(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "identity")
	for _, n := range IdentityFiles() {
		b, err := os.ReadFile(filepath.Join(testdata, "identity", filepath.FromSlash(n)))
		assert.NilError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(n))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		mode := os.FileMode(0o644)
		if isSecretFile(n) {
			mode = 0o600
		}
		assert.NilError(t, os.WriteFile(p, b, mode))
	}
	return dir
}

// fixtureLayer assembles the layer of testdata/cluster.yaml,
// testdata/machines.yaml and the fixture identity.
func fixtureLayer(t testing.TB) *Layer {
	t.Helper()
	id, err := LoadIdentity(fixtureIdentity(t))
	assert.NilError(t, err)
	var docs []*Document
	for _, f := range []string{gold("cluster.yaml"), gold("machines.yaml")} {
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		d, errs := ParseDocuments(f, bytes.NewReader(b))
		assert.Equal(t, len(errs), 0, "%v", errs)
		docs = append(docs, d...)
	}
	c, ms, errs := CheckFleet(docs)
	assert.Equal(t, len(errs), 0, "%v", errs)
	var tokens []controlplane.MachineToken
	for i, m := range ms {
		tokens = append(tokens, controlplane.MachineToken{Machine: m.Name, Token: fmt.Sprintf("tokn%02d.0123456789abcdef", i+1), Expires: fixtureTokenExpiry})
	}
	return &Layer{Cluster: c, Machines: ms, Identity: id, Tokens: tokens}
}

// fixtureTokenExpiry is when the fixture layer's join tokens expire.
var fixtureTokenExpiry = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)

// maskJoinTokens replaces what changes with every pack and every day in
// the tokens liken layer prints (ids, expiries, and how far away they are)
// with fixed words, for golden files.
func maskJoinTokens(s string) string {
	s = regexp.MustCompile(`(?m)^(  \S+\s+)[a-z0-9]{6}(\s+)\d{4}-\d\d-\d\d \d\d:\d\d UTC`).ReplaceAllString(s, "${1}TOKENID${2}EXPIRY")
	s = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d UTC`).ReplaceAllString(s, "EXPIRY")
	return regexp.MustCompile(`\(in [0-9a-z]+\)`).ReplaceAllString(s, "(in SOME TIME)")
}

func archiveBytes(t testing.TB, l *Layer) []byte {
	t.Helper()
	var buf bytes.Buffer
	assert.NilError(t, l.Write(&buf))
	return buf.Bytes()
}

func TestWriteReadRoundTrip(t *testing.T) {
	l := fixtureLayer(t)
	b := archiveBytes(t, l)
	// The same inputs give the same bytes.
	assert.DeepEqual(t, b, archiveBytes(t, l))

	got, err := Read(bytes.NewReader(b), DefaultLimits)
	assert.NilError(t, err)
	assert.Equal(t, got.Cluster.Name, "mycluster")
	assert.Equal(t, len(got.Machines), 5)
	assert.DeepEqual(t, got.Cluster.YAML, l.Cluster.YAML)
	for i := range l.Machines {
		assert.DeepEqual(t, got.Machines[i].YAML, l.Machines[i].YAML)
	}
	assert.DeepEqual(t, got.Identity.Files, l.Identity.Files)
	assert.Equal(t, got.Machine("node-4").Spec.KernelModules[0].Name, "vfio-pci")
	assert.Assert(t, got.Machine("node-9") == nil)
}

func TestWriteFileMode(t *testing.T) {
	l := fixtureLayer(t)
	p := filepath.Join(t.TempDir(), "layer.tgz")
	assert.NilError(t, l.WriteFile(p, false))
	st, err := os.Stat(p)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	err = l.WriteFile(p, false)
	assert.ErrorContains(t, err, "already exists")
	assert.NilError(t, os.Chmod(p, 0o644))
	assert.NilError(t, l.WriteFile(p, true))
	st, err = os.Stat(p)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	entries, err := os.ReadDir(filepath.Dir(p))
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 1, "temporary files left behind")
}

// member is one entry of a hand-made archive.
type member struct {
	hdr  tar.Header
	body []byte
}

func file(name string, body []byte) member {
	return member{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(body))}, body: body}
}

// craft builds a tar.gz from members.
func craft(t testing.TB, ms ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, m := range ms {
		h := m.hdr
		assert.NilError(t, tw.WriteHeader(&h))
		if len(m.body) > 0 {
			_, err := tw.Write(m.body)
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	assert.NilError(t, zw.Close())
	return buf.Bytes()
}

// validMembers are the members of the fixture layer, in archive order.
func validMembers(t testing.TB) []member {
	t.Helper()
	b := archiveBytes(t, fixtureLayer(t))
	zr, err := gzip.NewReader(bytes.NewReader(b))
	assert.NilError(t, err)
	tr := tar.NewReader(zr)
	var out []member
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		body, err := io.ReadAll(tr)
		assert.NilError(t, err)
		out = append(out, member{hdr: *h, body: body})
	}
	return out
}

func replace(ms []member, name string, m member) []member {
	out := make([]member, 0, len(ms))
	for _, x := range ms {
		if x.hdr.Name == name {
			out = append(out, m)
			continue
		}
		out = append(out, x)
	}
	return out
}

func without(ms []member, name string) []member {
	out := make([]member, 0, len(ms))
	for _, x := range ms {
		if x.hdr.Name != name {
			out = append(out, x)
		}
	}
	return out
}

func TestReadRefuses(t *testing.T) {
	valid := validMembers(t)
	small := Limits{MaxArchiveBytes: 1 << 20, MaxTotalBytes: 64 << 10, MaxMemberBytes: 8 << 10, MaxMembers: 32}
	machine4 := string(valid[5].body)
	assert.Assert(t, is.Contains(machine4, "name: node-4"))
	tests := []struct {
		name    string
		archive func() []byte
		lim     Limits
		want    []string
	}{
		{"absolute path", func() []byte { return craft(t, append(valid, file("/etc/passwd", []byte("x")))...) },
			DefaultLimits, []string{`member "/etc/passwd"`, "absolute path"}},
		{"dot dot", func() []byte { return craft(t, append(valid, file("machines/../../evil", []byte("x")))...) },
			DefaultLimits, []string{`member "machines/../../evil"`, "leaves the archive"}},
		{"symlink", func() []byte {
			return craft(t, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "identity/link", Linkname: "/etc/shadow"}})...)
		}, DefaultLimits, []string{`member "identity/link"`, "is a link", "/etc/shadow"}},
		{"hard link", func() []byte {
			return craft(t, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "cluster2.yaml", Linkname: "cluster.yaml"}})...)
		}, DefaultLimits, []string{`member "cluster2.yaml"`, "is a link"}},
		{"device", func() []byte {
			return craft(t, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}})...)
		}, DefaultLimits, []string{`member "sda"`, "device file"}},
		{"char device", func() []byte {
			return craft(t, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}})...)
		}, DefaultLimits, []string{`member "null"`, "device file"}},
		{"fifo", func() []byte {
			return craft(t, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "pipe"}})...)
		}, DefaultLimits, []string{`member "pipe"`, "FIFO"}},
		{"oversized member", func() []byte {
			return craft(t, replace(valid, "identity/token", file("identity/token", bytes.Repeat([]byte("K"), 9<<10)))...)
		}, small, []string{`member "identity/token"`, "9216 bytes", "more than the 8192"}},
		{"oversized total", func() []byte {
			var ms []member
			for i := range 10 {
				ms = append(ms, file("pad/"+string(rune('a'+i)), bytes.Repeat([]byte{0}, 8<<10)))
			}
			return craft(t, ms...)
		}, small, []string{`member "pad/i"`, "past 65536 bytes"}},
		{"oversized archive", func() []byte { return craft(t, valid...) },
			Limits{MaxArchiveBytes: 1000, MaxTotalBytes: 1 << 20, MaxMemberBytes: 1 << 20, MaxMembers: 100}, []string{"larger than 1000 bytes"}},
		{"too many members", func() []byte {
			var ms []member
			for i := range 40 {
				ms = append(ms, file(strings.Repeat("m", i+1), nil))
			}
			return craft(t, ms...)
		}, small, []string{"more than 32 members"}},
		{"duplicate member", func() []byte { return craft(t, append(valid, valid[1])...) },
			DefaultLimits, []string{`member "cluster.yaml"`, "appears twice"}},
		{"unexpected member", func() []byte { return craft(t, append(valid, file("identity/extra.key", []byte("x")))...) },
			DefaultLimits, []string{`member "identity/extra.key"`, "not expected"}},
		{"no manifest", func() []byte { return craft(t, without(valid, "layer.yaml")...) },
			DefaultLimits, []string{"no layer.yaml", "not a liken layer archive"}},
		{"future format", func() []byte {
			return craft(t, replace(valid, "layer.yaml", file("layer.yaml", []byte("format: liken.sh/layer/v9\ncluster: mycluster\nmachines: []\n")))...)
		}, DefaultLimits, []string{`member "layer.yaml"`, "liken.sh/layer/v9"}},
		{"no cluster", func() []byte { return craft(t, without(valid, "cluster.yaml")...) },
			DefaultLimits, []string{"no cluster.yaml"}},
		{"invalid machine document", func() []byte {
			return craft(t, replace(valid, "machines/node-4.yaml", file("machines/node-4.yaml", []byte(strings.Replace(machine4, "role: Worker", "role: Boss", 1))))...)
		}, DefaultLimits, []string{"machines/node-4.yaml: Machine node-4", `spec.role: Unsupported value: "Boss"`}},
		{"machine file misnamed", func() []byte {
			return craft(t, replace(valid, "machines/node-4.yaml", file("machines/node-9.yaml", []byte(machine4)))...)
		}, DefaultLimits, []string{`member "machines/node-9.yaml"`, "machines/node-4.yaml"}},
		{"manifest out of step", func() []byte { return craft(t, without(valid, "machines/node-5.yaml")...) },
			DefaultLimits, []string{`member "layer.yaml"`, "changed after it was packed"}},
		{"missing key", func() []byte { return craft(t, without(valid, "identity/etcd/peer-ca.key")...) },
			DefaultLimits, []string{"identity/", "etcd/peer-ca.key is missing"}},
		{"swapped key", func() []byte {
			var ck []byte
			for _, m := range valid {
				if m.hdr.Name == "identity/client-ca.key" {
					ck = m.body
				}
			}
			return craft(t, replace(valid, "identity/server-ca.key", file("identity/server-ca.key", ck))...)
		}, DefaultLimits, []string{"server-ca.key does not belong to server-ca.crt"}},
		{"foreign token", func() []byte {
			tok := JoinToken([]byte("another CA"), "abcdef.0123456789abcdef")
			return craft(t, replace(valid, "identity/token", file("identity/token", []byte(tok)))...)
		}, DefaultLimits, []string{"token", "belongs to another identity"}},
		{"not gzip", func() []byte { return []byte("PK\x03\x04 this is a zip") },
			DefaultLimits, []string{"not a gzip-compressed layer archive"}},
		{"truncated", func() []byte { b := craft(t, valid...); return b[:len(b)/2] },
			DefaultLimits, []string{"truncated"}},
		{"bad checksum", func() []byte {
			b := craft(t, valid...)
			b[len(b)-6] ^= 0xff // inside the CRC-32 trailer
			return b
		}, DefaultLimits, []string{"corrupt"}},
		{"control characters", func() []byte { return craft(t, append(valid, file("a\x1b[2Jb", []byte("x")))...) },
			DefaultLimits, []string{"control characters"}},
		{"backslash", func() []byte { return craft(t, append(valid, file(`..\evil`, []byte("x")))...) },
			DefaultLimits, []string{"backslash"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tc.archive()), tc.lim)
			assert.Assert(t, err != nil)
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
			// No secret ever appears in an error.
			assert.Assert(t, !strings.Contains(err.Error(), "PRIVATE KEY"))
			assert.Assert(t, !strings.Contains(err.Error(), fixtureSecret(t)))
		})
	}
}

// Archives made by hand with tar (./ prefixes, directory entries) read.
func TestReadAcceptsHandMadeTar(t *testing.T) {
	var ms []member
	ms = append(ms, member{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}})
	ms = append(ms, member{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./identity/", Mode: 0o700}})
	for _, m := range validMembers(t) {
		m.hdr.Name = "./" + m.hdr.Name
		ms = append(ms, m)
	}
	l, err := Read(bytes.NewReader(craft(t, ms...)), DefaultLimits)
	assert.NilError(t, err)
	assert.Equal(t, l.Cluster.Name, "mycluster")
}

func TestDescribeGolden(t *testing.T) {
	l := fixtureLayer(t)
	var buf bytes.Buffer
	assert.NilError(t, l.Describe(&buf, "layer.tgz", true))
	golden.Assert(t, maskJoinTokens(buf.String()), gold("inspect.golden"))
	for _, n := range IdentityFiles() {
		if isSecretFile(n) {
			assert.Assert(t, !strings.Contains(buf.String(), strings.TrimSpace(string(l.Identity.Files[n]))), "%s printed", n)
		}
	}
	assert.Assert(t, !strings.Contains(buf.String(), "PRIVATE KEY"))
}

// tarOf builds an uncompressed tar stream from members.
func tarOf(t testing.TB, ms ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := m.hdr
		assert.NilError(t, tw.WriteHeader(&h))
		if len(m.body) > 0 {
			_, err := tw.Write(m.body)
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	return buf.Bytes()
}

// FuzzReadLayer feeds arbitrary tar streams, compressed as liken layer pack
// compresses them, to the layer reader: it must never panic, and what it
// accepts must be a complete, consistent layer. (Fuzzing the tar bytes
// rather than the gzip bytes lets mutations reach the member checks and
// the documents; corrupt gzip streams are covered by TestReadRefuses.)
func FuzzReadLayer(f *testing.F) {
	valid := validMembers(f)
	f.Add(tarOf(f, valid...))
	f.Add(tarOf(f, append(valid, file("../x", []byte("x")))...))
	f.Add(tarOf(f, append(valid, member{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/"}})...))
	f.Add(tarOf(f, file("layer.yaml", []byte("format: liken.sh/layer/v1\ncluster: c\nmachines: [m]\n")), valid[1], valid[2]))
	f.Add(tarOf(f, file("cluster.yaml", []byte("{}"))))
	f.Add([]byte{})
	lim := Limits{MaxArchiveBytes: 1 << 20, MaxTotalBytes: 1 << 20, MaxMemberBytes: 64 << 10, MaxMembers: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(data)
		_ = zw.Close()
		l, err := Read(&buf, lim)
		if err != nil {
			if l != nil {
				t.Fatal("a layer returned with an error")
			}
			return
		}
		if l.Cluster == nil || l.Cluster.Cluster == nil || len(l.Machines) == 0 {
			t.Fatal("accepted a layer without a Cluster or Machines")
		}
		for _, m := range l.Machines {
			if m.Machine.Spec.Cluster != l.Cluster.Name {
				t.Fatalf("accepted Machine %s of cluster %q", m.Name, m.Machine.Spec.Cluster)
			}
		}
		if err := l.Identity.Verify(); err != nil {
			t.Fatalf("accepted an identity that does not verify: %v", err)
		}
	})
}

// TestLayerForMachine: a worker's disk carries the layer without a private
// key, reads back as a valid layer, and an archive missing only some keys
// is still refused.
func TestLayerForMachine(t *testing.T) {
	l := fixtureLayer(t)
	for _, tc := range []struct {
		machine  string
		withKeys bool
	}{{"node-1", true}, {"node-4", false}, {"node-5", false}} {
		t.Run(tc.machine, func(t *testing.T) {
			own, err := l.ForMachine(tc.machine)
			assert.NilError(t, err)
			got, err := Read(bytes.NewReader(archiveBytes(t, own)), DefaultLimits)
			assert.NilError(t, err)
			assert.Equal(t, got.Identity.HasPrivateKeys(), tc.withKeys)
			assert.Equal(t, len(got.Machines), len(l.Machines))
			for name, b := range l.Identity.Files {
				kept, ok := got.Identity.Files[name]
				if (strings.HasSuffix(name, ".key") || name == TokenFile) && !tc.withKeys {
					assert.Check(t, !ok, "%s kept on a worker", name)
					continue
				}
				assert.Check(t, ok && bytes.Equal(kept, b), "%s", name)
			}
			// A leader keeps every machine's join token (its init makes
			// them tokens of the cluster); a worker its own only.
			if tc.withKeys {
				assert.DeepEqual(t, got.Tokens, l.Tokens)
			} else {
				own, _ := l.Token(tc.machine)
				assert.DeepEqual(t, got.Tokens, []controlplane.MachineToken{own})
			}
			var out bytes.Buffer
			assert.NilError(t, got.Describe(&out, "layer.tgz", false))
			assert.Check(t, is.Equal(strings.Contains(out.String(), "service.key"), tc.withKeys), out.String())
			assert.Check(t, is.Equal(strings.Contains(out.String(), "no private key"), !tc.withKeys), out.String())
		})
	}
	// The worker's copy leaves the whole layer untouched.
	assert.Assert(t, l.Identity.HasPrivateKeys())

	_, err := l.ForMachine("node-9")
	assert.ErrorContains(t, err, `no Machine "node-9"`)

	_, err = Read(bytes.NewReader(craft(t, without(validMembers(t), IdentityDir+"client-ca.key")...)), DefaultLimits)
	assert.ErrorContains(t, err, "client-ca.key is missing")
}
