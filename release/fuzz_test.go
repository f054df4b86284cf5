package release

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// FuzzParseDocument: any input either parses to a document that passes
// Validate and survives a round trip, or is refused with an *Error.
func FuzzParseDocument(f *testing.F) {
	f.Add([]byte(doc("2026.07.20-001", art("rootfs.squashfs", 4096, sumA), art("boot/vmlinuz", 10, sumB))))
	f.Add([]byte(doc("2026.07.20-001", art("../x", 1, sumA))))
	f.Add([]byte(doc("2026.07.20-001", art("rootfs.squashfs", 1, sumA)) + "extra: 1\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("{}"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDocument(b)
		if err != nil {
			assert.Assert(t, d == nil)
			assert.Assert(t, ReasonOf(err) == ReasonInvalidDocument || ReasonOf(err) == ReasonPathTraversal, "unexpected error %v", err)
			return
		}
		assert.NilError(t, d.Validate())
		out, err := d.Marshal()
		assert.NilError(t, err)
		back, err := ParseDocument(out)
		assert.NilError(t, err)
		assert.DeepEqual(t, back, d)
	})
}

// FuzzParseIndex: any input either parses to a valid index that survives a
// round trip, or is refused with an *Error.
func FuzzParseIndex(f *testing.F) {
	idx := NewIndex()
	idx.Put(IndexEntry{Version: "2026.07.20-001", Digest: "sha256:" + sumA, Published: time.Date(2026, 7, 20, 10, 0, 0, 0, time.UTC)})
	b, err := idx.Marshal()
	assert.NilError(f, err)
	f.Add(b)
	f.Add([]byte("apiVersion: liken.sh/v1alpha1\nkind: ReleaseIndex\nreleases: []\n"))
	f.Add([]byte("releases:\n- published: 2026-07-20\n"))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, err := ParseIndex(b)
		if err != nil {
			assert.Assert(t, idx == nil)
			assert.Assert(t, ReasonOf(err) == ReasonInvalidDocument, "unexpected error %v", err)
			return
		}
		assert.NilError(t, idx.Validate())
		out, err := idx.Marshal()
		assert.NilError(t, err)
		back, err := ParseIndex(out)
		assert.NilError(t, err)
		assert.Equal(t, len(back.Releases), len(idx.Releases))
		for i := range idx.Releases {
			assert.Equal(t, back.Releases[i].Version, idx.Releases[i].Version)
			assert.Equal(t, back.Releases[i].Digest, idx.Releases[i].Digest)
			assert.Assert(t, back.Releases[i].Published.Equal(idx.Releases[i].Published))
		}
	})
}
