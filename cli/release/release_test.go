package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	clocktesting "k8s.io/utils/clock/testing"

	noderelease "liken.sh/liken/release"
)

var now = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// image writes a small file that starts like a squashfs image.
func image(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	assert.NilError(t, os.WriteFile(p, []byte("hsqs"+body), 0o644))
	return p
}

// run runs liken release with args and returns stdout and the error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := runStreams(t, args...)
	return out, err
}

// runStreams runs liken release with args and returns stdout, stderr and
// the error.
func runStreams(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := newCommand(clocktesting.NewFakePassiveClock(now))
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func TestReleaseGolden(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	img := image(t, ".", "rootfs.img", strings.Repeat("x", 4096))
	assert.NilError(t, os.WriteFile("vmlinuz", []byte("kernel"), 0o644))

	out, stderr, err := runStreams(t, img, "--channel", "channel", "--artifact", "boot/vmlinuz=vmlinuz")
	assert.NilError(t, err)
	golden.Assert(t, out, filepath.Join(testdata(t), "release.golden"))
	assert.Equal(t, stderr, "The channel holds no release before release 2026.11.30-001: there is no etcd version to compare with.\n")

	// release.yaml lists every artifact with its size and sha256, and the
	// digest is the sha256 of its bytes.
	doc, err := os.ReadFile("channel/2026.11.30-001/release.yaml")
	assert.NilError(t, err)
	golden.Assert(t, string(doc), filepath.Join(testdata(t), "release.yaml.golden"))
	sum := sha256.Sum256(doc)
	assert.Assert(t, is.Contains(out, "sha256:"+hex.EncodeToString(sum[:])))
	idx, err := os.ReadFile("channel/index.yaml")
	assert.NilError(t, err)
	golden.Assert(t, string(idx), filepath.Join(testdata(t), "index.yaml.golden"))

	// The next release of the day gets the next number.
	out, err = run(t, img, "--channel", "channel", "-o", "yaml")
	assert.NilError(t, err)
	assert.Assert(t, strings.HasPrefix(out, "- version: \"2026.11.30-002\"\n  digest: sha256:"), out)

	// The digest subcommand agrees, from the directory, the file and JSON.
	out, err = run(t, "digest", "channel/2026.11.30-001")
	assert.NilError(t, err)
	golden.Assert(t, out, filepath.Join(testdata(t), "digest.golden"))
	out, err = run(t, "digest", "channel/2026.11.30-001/release.yaml", "-o", "json")
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(out, `"digest": "sha256:`+hex.EncodeToString(sum[:])+`"`))
}

func TestNextVersion(t *testing.T) {
	dir := t.TempDir()
	v, err := NextVersion(dir, now)
	assert.NilError(t, err)
	assert.Equal(t, v, "2026.11.30-001")
	// A directory without an index entry (an interrupted publish) counts.
	assert.NilError(t, os.Mkdir(filepath.Join(dir, "2026.11.30-007"), 0o755))
	assert.NilError(t, os.Mkdir(filepath.Join(dir, "2026.11.29-020"), 0o755))
	v, err = NextVersion(dir, now)
	assert.NilError(t, err)
	assert.Equal(t, v, "2026.11.30-008")
	idx := noderelease.NewIndex()
	idx.Put(noderelease.IndexEntry{Version: "2026.11.30-011", Digest: "sha256:" + strings.Repeat("a", 64), Published: now})
	assert.NilError(t, noderelease.WriteIndex(dir, idx))
	v, err = NextVersion(dir, now)
	assert.NilError(t, err)
	assert.Equal(t, v, "2026.11.30-012")
}

func TestReleaseRefuses(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	img := image(t, ".", "rootfs.img", "data")
	assert.NilError(t, os.WriteFile("notsquash.img", []byte("ELF..."), 0o644))
	assert.NilError(t, os.MkdirAll("channel", 0o755))
	_, err := run(t, img, "--channel", "channel", "--version", "2026.11.30-001")
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile("broken.yaml", []byte("apiVersion: liken.sh/v1alpha1\nkind: Release\nversion: 2026.11.30-001\nartifacts:\n- path: ../../etc/passwd\n  size: 1\n  sha256: "+strings.Repeat("0", 64)+"\n"), 0o644))

	tests := []struct {
		args []string
		want string
	}{
		{[]string{img}, "no channel directory: pass --channel DIR"},
		{[]string{"notsquash.img", "--channel", "channel"}, "image notsquash.img is not a squashfs file"},
		{[]string{"missing.img", "--channel", "channel"}, "image: stat missing.img: no such file"},
		{[]string{".", "--channel", "channel"}, "image . is not a regular file"},
		{[]string{img, "--channel", "channel", "--version", "2026.11.30-001"}, "the channel already holds release 2026.11.30-001"},
		{[]string{img, "--channel", "channel", "--version", "v2"}, `release version "v2" must look like YYYY.MM.DD-NNN`},
		{[]string{img, "--channel", "channel", "--artifact", "vmlinuz"}, `--artifact "vmlinuz" must be PATH=FILE`},
		{[]string{img, "--channel", "channel", "--artifact", "rootfs.squashfs=x"}, "rootfs.squashfs is reserved"},
		{[]string{img, "--channel", "channel", "--artifact", "../evil=" + img}, "../evil"},
		{[]string{img, "--channel", "channel", "-o", "xml"}, `--output "xml" is not supported`},
		{[]string{}, "IMAGE is missing"},
		{[]string{"digest"}, "URL|FILE is missing"},
		{[]string{"digest", "nope.yaml"}, "nope.yaml"},
		{[]string{"digest", "broken.yaml"}, "../../etc/passwd"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := run(t, tc.args...)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	entries, err := os.ReadDir("channel")
	assert.NilError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.DeepEqual(t, names, []string{"2026.11.30-001", "index.yaml"})
}

// liken release digest reads a release over HTTP like a machine would, and
// a URL of a release directory reads its release.yaml.
func TestDigestOverHTTP(t *testing.T) {
	dir := t.TempDir()
	img := image(t, dir, "rootfs.img", "data")
	res, err := Build(BuildOptions{Image: img, Channel: filepath.Join(dir, "channel")}, clocktesting.NewFakePassiveClock(now))
	assert.NilError(t, err)
	srv := httptest.NewServer(http.FileServer(http.Dir(filepath.Join(dir, "channel"))))
	defer srv.Close()
	for _, url := range []string{srv.URL + "/2026.11.30-001/release.yaml", srv.URL + "/2026.11.30-001/", srv.URL + "/2026.11.30-001"} {
		out, err := run(t, "digest", url, "-o", "yaml")
		assert.NilError(t, err)
		assert.Equal(t, out, "- version: \"2026.11.30-001\"\n  digest: "+res.Digest+"\n")
	}
	_, err = run(t, "digest", srv.URL+"/2026.12.01-001/")
	assert.ErrorContains(t, err, "2026.12.01-001/release.yaml")
}

func testdata(t *testing.T) string {
	t.Helper()
	return testdataDir
}
