package release

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const (
	sumA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	sumB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// doc renders a release document with the given artifact lines.
func doc(version string, artifacts ...string) string {
	return "apiVersion: liken.sh/v1alpha1\nkind: Release\nversion: " + version + "\nartifacts:\n" + strings.Join(artifacts, "")
}

func art(path string, size int64, sum string) string {
	return fmt.Sprintf("- path: %q\n  size: %d\n  sha256: %s\n", path, size, sum)
}

func TestParseDocument(t *testing.T) {
	rootfs := art("rootfs.squashfs", 4096, sumA)
	for _, tc := range []struct {
		name   string
		in     string
		reason Reason
		want   string // substring of the error
		file   string
	}{
		{name: "valid", in: doc("2026.07.20-001", rootfs, art("boot/vmlinuz", 10, sumB))},
		{name: "unknown top field", in: doc("2026.07.20-001", rootfs) + "signature: x\n", reason: ReasonInvalidDocument, want: `unknown field "signature"`, file: DocumentName},
		{name: "unknown artifact field", in: doc("2026.07.20-001", rootfs+"  mode: 0755\n"), reason: ReasonInvalidDocument, want: `unknown field "mode"`},
		{name: "duplicate field", in: "version: 2026.07.20-001\n" + doc("2026.07.20-001", rootfs), reason: ReasonInvalidDocument, want: "version"},
		{name: "not yaml", in: "{[", reason: ReasonInvalidDocument, want: "cannot parse"},
		{name: "wrong kind", in: strings.Replace(doc("2026.07.20-001", rootfs), "kind: Release", "kind: Pod", 1), reason: ReasonInvalidDocument, want: "kind: Invalid value"},
		{name: "wrong apiVersion", in: strings.Replace(doc("2026.07.20-001", rootfs), "liken.sh/v1alpha1", "v1", 1), reason: ReasonInvalidDocument, want: "apiVersion"},
		{name: "bad version", in: doc("2026.7.20-1", rootfs), reason: ReasonInvalidDocument, want: "version: Invalid value: \"2026.7.20-1\": must look like YYYY.MM.DD-NNN"},
		{name: "no artifacts", in: doc("2026.07.20-001"), reason: ReasonInvalidDocument, want: "artifacts: Required value"},
		{name: "no rootfs", in: doc("2026.07.20-001", art("kernel", 1, sumA)), reason: ReasonInvalidDocument, want: "must hold the OS image rootfs.squashfs"},
		{name: "absolute path", in: doc("2026.07.20-001", rootfs, art("/etc/passwd", 1, sumA)), reason: ReasonPathTraversal, want: "must be relative", file: "/etc/passwd"},
		{name: "dot dot", in: doc("2026.07.20-001", rootfs, art("boot/../../x", 1, sumA)), reason: ReasonPathTraversal, want: "must not contain . or .. elements", file: "boot/../../x"},
		{name: "dot", in: doc("2026.07.20-001", rootfs, art("./x", 1, sumA)), reason: ReasonPathTraversal, want: ". or .."},
		{name: "backslash", in: doc("2026.07.20-001", rootfs, art(`..\x`, 1, sumA)), reason: ReasonPathTraversal, want: "backslash"},
		{name: "empty element", in: doc("2026.07.20-001", rootfs, art("boot//x", 1, sumA)), reason: ReasonPathTraversal, want: "empty element"},
		{name: "trailing slash", in: doc("2026.07.20-001", rootfs, art("boot/", 1, sumA)), reason: ReasonPathTraversal, want: "empty element"},
		{name: "empty path", in: doc("2026.07.20-001", rootfs, art("", 1, sumA)), reason: ReasonInvalidDocument, want: "must not be empty"},
		{name: "hidden", in: doc("2026.07.20-001", rootfs, art(".x", 1, sumA)), reason: ReasonInvalidDocument, want: "hidden"},
		{name: "odd characters", in: doc("2026.07.20-001", rootfs, art("a b", 1, sumA)), reason: ReasonInvalidDocument, want: "may contain only"},
		{name: "document as artifact", in: doc("2026.07.20-001", rootfs, art("release.yaml", 1, sumA)), reason: ReasonInvalidDocument, want: "release document itself"},
		{name: "long path", in: doc("2026.07.20-001", rootfs, art(strings.Repeat("a", 256), 1, sumA)), reason: ReasonInvalidDocument, want: "at most 255 characters"},
		{name: "duplicate path", in: doc("2026.07.20-001", rootfs, art("rootfs.squashfs", 1, sumB)), reason: ReasonInvalidDocument, want: "Duplicate value"},
		{name: "file below file", in: doc("2026.07.20-001", rootfs, art("rootfs.squashfs/x", 1, sumB)), reason: ReasonInvalidDocument, want: "lies below rootfs.squashfs"},
		{name: "size zero", in: doc("2026.07.20-001", art("rootfs.squashfs", 0, sumA)), reason: ReasonInvalidDocument, want: "size: Invalid value: 0"},
		{name: "size negative", in: doc("2026.07.20-001", art("rootfs.squashfs", -5, sumA)), reason: ReasonInvalidDocument, want: "between 1 and"},
		{name: "size too large", in: doc("2026.07.20-001", art("rootfs.squashfs", MaxArtifactBytes+1, sumA)), reason: ReasonInvalidDocument, want: "MaxArtifactBytes"},
		{name: "release too large", in: doc("2026.07.20-001", art("rootfs.squashfs", MaxArtifactBytes, sumA), art("b", MaxArtifactBytes, sumA), art("c", 1, sumA)), reason: ReasonInvalidDocument, want: "MaxReleaseBytes"},
		{name: "uppercase sha", in: doc("2026.07.20-001", art("rootfs.squashfs", 1, strings.ToUpper(sumA))), reason: ReasonInvalidDocument, want: "64 lowercase hex"},
		{name: "short sha", in: doc("2026.07.20-001", art("rootfs.squashfs", 1, "abc")), reason: ReasonInvalidDocument, want: "64 lowercase hex"},
		{name: "float size", in: doc("2026.07.20-001", art("rootfs.squashfs", 1, sumA)+"- path: x\n  size: 1.5\n  sha256: "+sumA+"\n"), reason: ReasonInvalidDocument, want: "cannot parse"},
		{name: "too large", in: doc("2026.07.20-001", rootfs) + "#" + strings.Repeat("x", MaxDocumentBytes), reason: ReasonInvalidDocument, want: "more than the limit of 1048576 bytes (MaxDocumentBytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDocument([]byte(tc.in))
			if tc.reason == "" {
				assert.NilError(t, err)
				assert.Check(t, is.Equal(d.Version, "2026.07.20-001"))
				assert.Check(t, d.Artifact(RootfsPath) != nil)
				return
			}
			assert.Check(t, is.Nil(d))
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, is.Equal(ReasonOf(err), tc.reason))
			if tc.file != "" {
				assert.Check(t, is.Equal(FileOf(err), tc.file))
			}
		})
	}
}

func TestArtifactsTooMany(t *testing.T) {
	lines := []string{art("rootfs.squashfs", 1, sumA)}
	for i := range MaxArtifacts {
		lines = append(lines, art(fmt.Sprintf("f%d", i), 1, sumA))
	}
	_, err := ParseDocument([]byte(doc("2026.07.20-001", lines...)))
	assert.ErrorContains(t, err, "must have at most 256 items")
}

func TestErrorMessage(t *testing.T) {
	err := newError(ReasonChecksumMismatch, "2026.07.20-001", "rootfs.squashfs", "bytes differ")
	assert.Error(t, err, "release 2026.07.20-001 file rootfs.squashfs: bytes differ (the channel serves bytes that differ from the release document: republish the file or fix the web server; liken retries)")
	wrapped := fmt.Errorf("fetch: %w", err)
	assert.Check(t, is.Equal(ReasonOf(wrapped), ReasonChecksumMismatch))
	assert.Check(t, is.Equal(FileOf(wrapped), "rootfs.squashfs"))
	assert.Check(t, is.Equal(ReasonOf(errors.New("x")), Reason("")))

	// Read again from a slot that verified before: the disk, not the channel.
	err.Recheck = true
	assert.Error(t, err, "release 2026.07.20-001 file rootfs.squashfs: bytes differ (the slot's bytes changed on disk after liken verified them, so the channel is not at fault: check the disk for errors (kernel log, SMART) and that nothing but liken-node writes to the slot)")
	err = newError(ReasonWriteFailed, "2026.07.20-001", "rootfs.squashfs", "input/output error")
	err.Recheck = true
	assert.Error(t, err, "release 2026.07.20-001 file rootfs.squashfs: input/output error (the slot's storage failed: check the disk)")
}

func TestDigest(t *testing.T) {
	// sha256 of the empty string.
	assert.Equal(t, Digest(nil), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	assert.Check(t, ValidDigest(Digest([]byte("x"))))
	assert.Check(t, !ValidDigest("sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"))
	assert.Check(t, !ValidDigest("sha512:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"))
}

func TestDocumentRoundTrip(t *testing.T) {
	d := &Document{APIVersion: APIVersion, Kind: KindRelease, Version: "2026.07.20-001", Artifacts: []Artifact{
		{Path: "rootfs.squashfs", Size: 3, SHA256: sumA}, {Path: "boot/vmlinuz", Size: 4, SHA256: sumB},
	}}
	b, err := d.Marshal()
	assert.NilError(t, err)
	back, err := ParseDocument(b)
	assert.NilError(t, err)
	assert.DeepEqual(t, back, d)
	assert.Equal(t, back.TotalSize(), int64(7))
}

func TestParseIndex(t *testing.T) {
	head := "apiVersion: liken.sh/v1alpha1\nkind: ReleaseIndex\nreleases:\n"
	entry := func(v, d, p string) string {
		return fmt.Sprintf("- version: %s\n  digest: %s\n  published: %s\n", v, d, p)
	}
	dig := "sha256:" + sumA
	for _, tc := range []struct {
		name string
		in   string
		want string
	}{
		{name: "valid", in: head + entry("2026.07.20-001", dig, "2026-07-20T10:00:00Z") + entry("2026.07.21-001", dig, `"2026-07-21T10:00:00+02:00"`)},
		{name: "empty", in: head},
		{name: "duplicate version", in: head + entry("2026.07.20-001", dig, "2026-07-20T10:00:00Z") + entry("2026.07.20-001", dig, "2026-07-20T10:00:00Z"), want: "Duplicate value"},
		{name: "bad digest", in: head + entry("2026.07.20-001", "sha256:abc", "2026-07-20T10:00:00Z"), want: "releases[0].digest: Invalid value"},
		{name: "bad version", in: head + entry("v1", dig, "2026-07-20T10:00:00Z"), want: "releases[0].version"},
		{name: "bad time", in: head + entry("2026.07.20-001", dig, "yesterday"), want: "cannot parse"},
		{name: "no time", in: head + "- version: 2026.07.20-001\n  digest: " + dig + "\n", want: "published: Required value"},
		{name: "unknown field", in: head + entry("2026.07.20-001", dig, "2026-07-20T10:00:00Z") + "  notes: x\n", want: "unknown field"},
		{name: "wrong kind", in: strings.Replace(head, "ReleaseIndex", "Release", 1), want: "kind"},
		{name: "too large", in: head + "#" + strings.Repeat("x", MaxIndexBytes), want: "(MaxIndexBytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx, err := ParseIndex([]byte(tc.in))
			if tc.want == "" {
				assert.NilError(t, err)
				assert.Check(t, idx != nil)
				return
			}
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, is.Equal(ReasonOf(err), ReasonInvalidDocument))
		})
	}
}

func TestIndexPutNewestNextVersion(t *testing.T) {
	day := time.Date(2026, 7, 20, 15, 0, 0, 0, time.UTC)
	idx := NewIndex()
	next, err := idx.NextVersion(day)
	assert.NilError(t, err)
	assert.Equal(t, next, "2026.07.20-001")
	assert.Check(t, is.Nil(idx.Newest()))
	idx.Put(IndexEntry{Version: "2026.07.20-002", Digest: "sha256:" + sumA, Published: day})
	idx.Put(IndexEntry{Version: "2026.07.19-009", Digest: "sha256:" + sumA, Published: day})
	idx.Put(IndexEntry{Version: "2026.07.20-002", Digest: "sha256:" + sumB, Published: day})
	assert.Equal(t, len(idx.Releases), 2)
	assert.Equal(t, idx.Releases[0].Version, "2026.07.19-009")
	assert.Equal(t, idx.Newest().Digest, "sha256:"+sumB)
	next, err = idx.NextVersion(day)
	assert.NilError(t, err)
	assert.Equal(t, next, "2026.07.20-003")
	idx.Put(IndexEntry{Version: "2026.07.20-999", Digest: "sha256:" + sumA, Published: day})
	_, err = idx.NextVersion(day)
	assert.ErrorContains(t, err, "last number of that day")

	b, err := idx.Marshal()
	assert.NilError(t, err)
	back, err := ParseIndex(b)
	assert.NilError(t, err)
	assert.DeepEqual(t, back, idx)
}
