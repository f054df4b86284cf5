package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/boot"
)

func TestReadBootInfo(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	cmdline := write("cmdline", "BOOT_IMAGE=/B/vmlinuz liken.slot=B liken.trial=1 panic=1\n")
	bootID := write("boot_id", "0f1e2d3c-aaaa-bbbb-cccc-000000000001\n")
	rel := write("release", "VERSION=2026.11.01-001\n")
	stat := write("stat", "cpu  1 2 3\nintr 5 6\nbtime 1795600000\nprocesses 9\n")
	bi, err := ReadBootInfo(cmdline, bootID, rel, stat)
	assert.NilError(t, err)
	assert.DeepEqual(t, bi, BootInfo{Slot: boot.SlotB, Trial: true, BootID: "0f1e2d3c-aaaa-bbbb-cccc-000000000001", Version: "2026.11.01-001", BootedAt: time.Unix(1795600000, 0)})

	_, err = ReadBootInfo(write("bad", "quiet\n"), bootID, rel, stat)
	assert.ErrorContains(t, err, "has no liken.slot=A|B")
	_, err = ReadBootInfo(cmdline, write("empty", "\n"), rel, stat)
	assert.ErrorContains(t, err, "the boot ID must be one line")
	_, err = ReadBootInfo(cmdline, bootID, rel, write("nobtime", "cpu 1\n"))
	assert.ErrorContains(t, err, "no btime line")

	// A file after the command line that cannot be read still leaves the
	// trial flag and the slot: StartFailed reboots a trial boot on them.
	missing := filepath.Join(dir, "missing")
	for _, files := range [][3]string{{missing, rel, stat}, {bootID, missing, stat}, {bootID, rel, missing}} {
		bi, err := ReadBootInfo(cmdline, files[0], files[1], files[2])
		assert.ErrorContains(t, err, "reading the")
		assert.Equal(t, bi.Trial, true, "files %v", files)
		assert.Equal(t, bi.Slot, boot.SlotB, "files %v", files)
	}
}
