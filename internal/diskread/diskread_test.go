package diskread_test

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"liken.sh/liken/internal/diskread"
)

// resident counts f's pages in the page cache.
func resident(t *testing.T, f *os.File, size int) int {
	t.Helper()
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	assert.NilError(t, err)
	defer func() { assert.NilError(t, unix.Munmap(b)) }()
	page := os.Getpagesize()
	vec := make([]byte, (size+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// A file just written and read sits in the page cache; after Uncached
// none of its pages do, so the next read comes from the disk.
func TestUncachedDropsTheFilesPages(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rootfs.squashfs")
	const size = 4 << 20
	assert.NilError(t, os.WriteFile(p, make([]byte, size), 0o644))
	f, err := os.Open(p)
	assert.NilError(t, err)
	defer f.Close()
	_, err = f.Read(make([]byte, size))
	assert.NilError(t, err)
	before := resident(t, f, size)
	assert.Assert(t, before > 0, "the file's pages are not cached after a read: this file system cannot show the difference")

	assert.NilError(t, diskread.Uncached(f))
	assert.Equal(t, resident(t, f, size), 0, "%d of the file's pages were cached before", before)
}
