package initramfs

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"gotest.tools/v3/assert"
)

type entry struct {
	mode uint64
	data string
}

// readNewc parses a newc cpio archive as the kernel does.
func readNewc(t *testing.T, b []byte) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	for {
		assert.Assert(t, len(b) >= 110, "truncated header")
		h := string(b[:110])
		assert.Equal(t, h[:6], "070701")
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			assert.NilError(t, err)
			return v
		}
		mode, size, namesize := field(1), field(6), field(11)
		pad := func(n uint64) uint64 { return (n + 3) &^ 3 }
		name := string(b[110 : 110+namesize-1])
		off := pad(110 + namesize)
		data := b[off : off+size]
		b = b[pad(off+size):]
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = entry{mode: mode, data: string(data)}
	}
}

// TestArchiveAsTheKernelReadsIt: the archive holds the init, the console
// device, and the modules with their load order, names relative to
// /lib/modules.
func TestArchiveAsTheKernelReadsIt(t *testing.T) {
	dir := t.TempDir()
	var mods []string
	for _, n := range []string{"virtio.ko", "virtio_blk.ko"} {
		p := filepath.Join(dir, n)
		assert.NilError(t, os.WriteFile(p, []byte("module "+n), 0o644))
		mods = append(mods, p)
	}
	a := New()
	a.File("init", 0o755, []byte("#!init"))
	assert.NilError(t, a.Modules(mods))
	gz, err := a.Gzip()
	assert.NilError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	assert.NilError(t, err)
	raw, err := io.ReadAll(zr)
	assert.NilError(t, err)

	got := readNewc(t, raw)
	assert.Equal(t, got["init"], entry{mode: 0o100755, data: "#!init"})
	assert.Equal(t, got["dev/console"].mode, uint64(0o020600))
	assert.Equal(t, got["lib/modules"].mode, uint64(0o040755))
	assert.Equal(t, got["lib/modules/virtio_blk.ko"].data, "module virtio_blk.ko")
	assert.Equal(t, got["modules.order"].data, "virtio.ko\nvirtio_blk.ko\n")
}

func TestResolveModulesNamesTheMissingModule(t *testing.T) {
	_, err := ResolveModules(t.TempDir(), []string{"virtio_blk"})
	assert.ErrorContains(t, err, "kernel module virtio_blk not found under")
}
