package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func writeFile(t *testing.T, path string, data string) string {
	t.Helper()
	assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	assert.NilError(t, os.WriteFile(path, []byte(data), 0o644))
	return path
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestBuild(t *testing.T) {
	src := t.TempDir()
	channel := t.TempDir()
	published := time.Date(2026, 7, 20, 10, 0, 0, 123, time.FixedZone("x", 3600))
	rootfs := writeFile(t, filepath.Join(src, "image"), "squashfs bytes")
	kernel := writeFile(t, filepath.Join(src, "vmlinuz"), "kernel")

	digest, err := Build(channel, "2026.07.20-001", []Source{{Path: "rootfs.squashfs", File: rootfs}, {Path: "boot/vmlinuz", File: kernel}}, published)
	assert.NilError(t, err)

	b, err := os.ReadFile(filepath.Join(channel, "2026.07.20-001", "release.yaml"))
	assert.NilError(t, err)
	assert.Equal(t, Digest(b), digest)
	d, err := ParseDocument(b)
	assert.NilError(t, err)
	assert.DeepEqual(t, d.Artifacts, []Artifact{
		{Path: "rootfs.squashfs", Size: 14, SHA256: sha("squashfs bytes")},
		{Path: "boot/vmlinuz", Size: 6, SHA256: sha("kernel")},
	})
	for _, a := range d.Artifacts {
		sum, size, err := HashFile(context.Background(), filepath.Join(channel, "2026.07.20-001", a.Path))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(sum, a.SHA256))
		assert.Check(t, is.Equal(size, a.Size))
	}

	idx, err := ReadIndex(channel)
	assert.NilError(t, err)
	assert.Equal(t, len(idx.Releases), 1)
	assert.Check(t, is.Equal(idx.Releases[0].Digest, digest))
	assert.Check(t, idx.Releases[0].Published.Equal(published.Truncate(time.Second)))

	// A published release never changes.
	_, err = Build(channel, "2026.07.20-001", []Source{{Path: "rootfs.squashfs", File: rootfs}}, published)
	assert.ErrorContains(t, err, "already holds release 2026.07.20-001")

	// The next one joins the index.
	digest2, err := Build(channel, "2026.07.20-002", []Source{{Path: "rootfs.squashfs", File: kernel}}, published.Add(time.Hour))
	assert.NilError(t, err)
	idx, err = ReadIndex(channel)
	assert.NilError(t, err)
	assert.Equal(t, len(idx.Releases), 2)
	assert.Check(t, is.Equal(idx.Newest().Digest, digest2))

	// Nothing half-built is left behind.
	entries, err := os.ReadDir(channel)
	assert.NilError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.DeepEqual(t, names, []string{"2026.07.20-001", "2026.07.20-002", "index.yaml"})
}

func TestBuildRefuses(t *testing.T) {
	src := t.TempDir()
	channel := t.TempDir()
	now := time.Date(2026, 7, 20, 10, 0, 0, 0, time.UTC)
	rootfs := writeFile(t, filepath.Join(src, "image"), "squashfs bytes")
	empty := writeFile(t, filepath.Join(src, "empty"), "")
	for _, tc := range []struct {
		name      string
		channel   string
		version   string
		artifacts []Source
		published time.Time
		want      string
	}{
		{name: "bad version", channel: channel, version: "1.0", artifacts: []Source{{"rootfs.squashfs", rootfs}}, published: now, want: `release version "1.0" must look like YYYY.MM.DD-NNN`},
		{name: "no time", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", rootfs}}, want: "publication time is missing"},
		{name: "no channel", channel: filepath.Join(channel, "missing"), version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", rootfs}}, published: now, want: "create it first"},
		{name: "no rootfs", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"kernel", rootfs}}, published: now, want: "rootfs.squashfs"},
		{name: "traversal", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", rootfs}, {"../x", rootfs}}, published: now, want: "must not contain . or .."},
		{name: "empty file", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", empty}}, published: now, want: "size: Invalid value: 0"},
		{name: "missing file", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", filepath.Join(src, "nope")}}, published: now, want: "artifact rootfs.squashfs"},
		{name: "directory", channel: channel, version: "2026.07.20-001", artifacts: []Source{{"rootfs.squashfs", src}}, published: now, want: "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.channel, tc.version, tc.artifacts, tc.published)
			assert.ErrorContains(t, err, tc.want)
			entries, err := os.ReadDir(channel)
			assert.NilError(t, err)
			assert.Check(t, is.Len(entries, 0), "the channel must stay untouched")
		})
	}

	writeFile(t, filepath.Join(channel, "index.yaml"), "garbage: [")
	_, err := Build(channel, "2026.07.20-001", []Source{{"rootfs.squashfs", rootfs}}, now)
	assert.ErrorContains(t, err, "index.yaml: cannot parse")
}

func TestDigestOf(t *testing.T) {
	src := t.TempDir()
	channel := t.TempDir()
	rootfs := writeFile(t, filepath.Join(src, "image"), "squashfs bytes")
	digest, err := Build(channel, "2026.07.20-001", []Source{{"rootfs.squashfs", rootfs}}, time.Now())
	assert.NilError(t, err)
	srv := httptest.NewServer(http.FileServer(http.Dir(channel)))
	defer srv.Close()

	ctx := context.Background()
	for _, ref := range []string{
		filepath.Join(channel, "2026.07.20-001"),
		filepath.Join(channel, "2026.07.20-001", "release.yaml"),
		srv.URL + "/2026.07.20-001/release.yaml",
	} {
		got, d, err := DigestOf(ctx, srv.Client(), ref)
		assert.NilError(t, err, ref)
		assert.Check(t, is.Equal(got, digest), ref)
		assert.Check(t, is.Equal(d.Version, "2026.07.20-001"), ref)
	}
	_, _, err = DigestOf(ctx, srv.Client(), srv.URL+"/2026.07.20-002/release.yaml")
	assert.Check(t, is.Equal(ReasonOf(err), ReasonNotFound))
	assert.ErrorContains(t, err, "404 Not Found")
	_, _, err = DigestOf(ctx, nil, filepath.Join(channel, "index.yaml"))
	assert.Check(t, is.Equal(ReasonOf(err), ReasonInvalidDocument))

	idx, err := FetchIndex(ctx, srv.Client(), srv.URL+"/")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(idx.Lookup("2026.07.20-001").Digest, digest))
}
