package boote2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"liken.sh/liken/node/boot"
)

// bootTimeout bounds one boot, from power-on (or the previous marker) to
// the next marker, on a busy 2-core machine without KVM.
//
// The tests run in parallel: go test runs as many at once as there are
// CPUs (-parallel defaults to GOMAXPROCS), and each machine keeps one CPU
// busy, so a 2-core machine boots two disks at a time.
const bootTimeout = 240 * time.Second

var (
	kitOnce sync.Once
	theKit  *Kit
	kitErr  error
)

// kit prepares the packages and images once per test binary. A kit that
// cannot be prepared fails the test: the boot tests never skip.
func kit(t *testing.T) *Kit {
	t.Helper()
	kitOnce.Do(func() {
		start := time.Now()
		theKit, kitErr = Prepare(t.Logf)
		t.Logf("boot kit ready in %s", time.Since(start).Round(time.Millisecond))
	})
	assert.NilError(t, kitErr, "preparing the QEMU boot kit")
	return theKit
}

// envFiles writes the two copies with liken's Go bootloader, as a machine
// would, and returns them.
func envFiles(t *testing.T, steps func(boot.Bootloader)) (primary, backup []byte) {
	t.Helper()
	dir := t.TempDir()
	steps(boot.NewGRUB(dir))
	primary, err := os.ReadFile(filepath.Join(dir, boot.EnvFile))
	assert.NilError(t, err)
	backup, err = os.ReadFile(filepath.Join(dir, boot.BackupFile))
	assert.NilError(t, err)
	return primary, backup
}

func armed(t *testing.T, proven, trial boot.Slot) ([]byte, []byte) {
	return envFiles(t, func(bl boot.Bootloader) {
		assert.NilError(t, bl.Commit(proven))
		if trial != "" {
			assert.NilError(t, bl.ArmTrial(trial))
		}
	})
}

// machine is a test disk and the QEMU runs on it.
type machine struct {
	t    *testing.T
	kit  *Kit
	disk *Disk
	spec DiskSpec
	runs int
	vm   *VM
	// uefiVars, when set, boots the machine with UEFI (qemu.Hardware).
	uefiVars string
}

func newMachine(t *testing.T, spec DiskSpec) *machine {
	t.Helper()
	k := kit(t)
	d, err := k.BuildDisk(t.TempDir(), spec)
	assert.NilError(t, err)
	return &machine{t: t, kit: k, disk: d, spec: spec}
}

// powerOn starts QEMU on the disk; failing to start fails the test.
func (m *machine) powerOn() {
	m.t.Helper()
	logPath := m.nextLog()
	hw := BootTest
	hw.UEFIVars = m.uefiVars
	vm, err := m.kit.Start(m.disk.Path, logPath, hw)
	assert.NilError(m.t, err)
	m.started(vm, logPath)
}

// powerOnCached starts QEMU on the disk behind a volatile write cache
// (see CacheDisk): cutAt decides at each flush whether the power fails
// there, losing every write not flushed. The test kills QEMU once the
// returned disk's Cut is closed.
func (m *machine) powerOnCached(cutAt func(CacheView) bool) *CacheDisk {
	m.t.Helper()
	// A short folder: a Unix socket's path is limited to 107 bytes.
	dir, err := os.MkdirTemp("", "liken-nbd")
	assert.NilError(m.t, err)
	m.t.Cleanup(func() { os.RemoveAll(dir) })
	d, err := ServeCacheDisk(m.disk.Path, dir, cutAt)
	assert.NilError(m.t, err)
	logPath := m.nextLog()
	vm, err := m.kit.StartCacheDisk(d, logPath, BootTest)
	assert.NilError(m.t, err)
	m.started(vm, logPath)
	m.t.Cleanup(func() {
		vm.Kill()
		assert.Check(m.t, d.Close())
	})
	return d
}

func (m *machine) nextLog() string {
	m.runs++
	logDir := filepath.Join(m.kit.Dir, "logs")
	assert.NilError(m.t, os.MkdirAll(logDir, 0o755))
	name := strings.NewReplacer("/", "-", " ", "_").Replace(m.t.Name())
	return filepath.Join(logDir, name+"-"+string(rune('0'+m.runs))+".log")
}

func (m *machine) started(vm *VM, logPath string) {
	m.vm = vm
	m.t.Cleanup(func() {
		if ok, _ := vm.Exited(); !ok {
			vm.Kill()
		}
		if m.t.Failed() {
			m.t.Logf("serial console (also in %s):\n%s", logPath, tail(vm.Output(), 6000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// expect waits for the next console line holding marker and returns its
// key=value fields. An init error or QEMU's end fails the test.
func (m *machine) expect(marker string) map[string]string {
	m.t.Helper()
	line := m.expectLine(marker)
	fields := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	return fields
}

// expectLine waits for the next console line holding marker and returns
// the line from the marker on.
func (m *machine) expectLine(marker string) string {
	m.t.Helper()
	var line string
	poll.WaitOn(m.t, func(poll.LogT) poll.Result {
		if l, ok := m.vm.Find(marker); ok {
			line = l
			return poll.Success()
		}
		if l, ok := m.vm.Find("LIKEN-ERROR"); ok {
			return poll.Error(fmt.Errorf("the slot's init failed: %s", l))
		}
		if done, err := m.vm.Exited(); done {
			// A last look: the line may have arrived with the exit.
			if l, ok := m.vm.Find(marker); ok {
				line = l
				return poll.Success()
			}
			return poll.Error(fmt.Errorf("QEMU ended (%v) before the console showed %q", err, marker))
		}
		return poll.Continue("waiting for %q on the console", marker)
	}, poll.WithTimeout(bootTimeout), poll.WithDelay(50*time.Millisecond))
	m.t.Logf("%6.1fs %s", time.Since(m.vm.Started).Seconds(), line)
	return line[strings.Index(line, marker):]
}

// expectBoot waits for the init's report and checks the slot and trial:
// the kernel GRUB loaded (BOOT_IMAGE=) and the initramfs that runs must be
// the ones in the slot's own folder, and the command line must name that
// slot. Both slots have the same kernel: only its path tells them apart.
func (m *machine) expectBoot(slot boot.Slot, trial bool) map[string]string {
	m.t.Helper()
	f := m.expect("LIKEN-INIT ")
	want := "0"
	if trial {
		want = "1"
	}
	assert.Equal(m.t, f["kernel"], "/"+string(slot)+"/vmlinuz", "the kernel GRUB loaded")
	assert.Equal(m.t, f["initrd"], string(slot), "the slot whose initramfs GRUB loaded")
	assert.Equal(m.t, f["slot"], string(slot), "the slot the kernel command line names")
	assert.Equal(m.t, f["trial"], want, "trial boot")
	return f
}

// waitPowerOff waits until QEMU ends by itself, with success.
func (m *machine) waitPowerOff() {
	m.t.Helper()
	m.expect("LIKEN-POWEROFF")
	poll.WaitOn(m.t, func(poll.LogT) poll.Result {
		if done, err := m.vm.Exited(); done {
			if err != nil {
				return poll.Error(fmt.Errorf("QEMU exited with %v", err))
			}
			return poll.Success()
		}
		return poll.Continue("waiting for QEMU to power off")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	m.t.Logf("%6.1fs powered off", time.Since(m.vm.Started).Seconds())
}

// state reads one copy from the disk with the Go codec.
func (m *machine) state(name string) (boot.State, error) {
	m.t.Helper()
	b, err := m.disk.ReadEnv(name)
	assert.NilError(m.t, err)
	return boot.Decode(b)
}

func (m *machine) assertStates(want boot.State) {
	m.t.Helper()
	for _, name := range []string{boot.EnvFile, boot.BackupFile} {
		st, err := m.state(name)
		assert.NilError(m.t, err, name)
		assert.Equal(m.t, st, want, name)
	}
}

// simulate runs the lab's simulated firmware on copies of the disk's
// environment: what it boots and the bytes it leaves.
func (m *machine) simulate() (boot.Selection, []byte, []byte) {
	m.t.Helper()
	dir := m.t.TempDir()
	for name, b := range map[string][]byte{boot.EnvFile: m.spec.Primary, boot.BackupFile: m.spec.Backup} {
		assert.NilError(m.t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
	}
	sel, err := boot.SelectBootDetail(dir)
	assert.NilError(m.t, err)
	p, err := os.ReadFile(filepath.Join(dir, boot.EnvFile))
	assert.NilError(m.t, err)
	b, err := os.ReadFile(filepath.Join(dir, boot.BackupFile))
	assert.NilError(m.t, err)
	return sel, p, b
}

// assertSameAsFirmware checks that GRUB left the environment exactly as
// the simulated firmware does (call it when the slot wrote nothing).
func (m *machine) assertSameAsFirmware(wantPrimary, wantBackup []byte) {
	m.t.Helper()
	for name, want := range map[string][]byte{boot.EnvFile: wantPrimary, boot.BackupFile: wantBackup} {
		got, err := m.disk.ReadEnv(name)
		assert.NilError(m.t, err)
		assert.Assert(m.t, bytes.Equal(got, want), "%s after GRUB differs from the simulated firmware's:\nGRUB: %q\nsim:  %q", name, got, want)
	}
}
