// Command bootinit is the init (PID 1) of the QEMU boot tests' slots: it reads which slot booted from the kernel command line and, per scenario, commits the slot through node/boot, panics, or hangs.
//
// The disk builder in e2e/boot puts it, with the kernel modules it needs,
// a /scenario file and a /slot file (the slot whose folder holds this
// initramfs), into each slot's initramfs. It prints one line per step on
// the console, each starting with "LIKEN-", which the tests read; the
// report names the slot the command line gives (slot=), the slot whose
// initramfs was loaded (initrd=) and the kernel GRUB loaded (kernel=, the
// BOOT_IMAGE= GRUB puts on the command line: the path it read).
//
// Scenarios (used on a trial boot; a boot that is not a trial always
// reports and powers off):
//
//	commit  commit the slot through the GRUB bootloader, then reboot
//	panic   exit, which makes the kernel panic (and reboot after panic=N)
//	hang    arm the kernel's watchdog (softdog), then hang: it resets the machine
//	wait    report, then wait forever (the test cuts the power)
//	report  report, then power off without committing
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/node/boot"
)

const (
	bootDev   = "/dev/vda1"
	bootMount = "/mnt"
)

// grubDir is the GRUB folder on the boot partition: /boot/grub on the
// test disks, /grub on a disk written by liken install (found at mount).
var grubDir = bootMount + "/boot/grub"

func say(format string, args ...any) {
	fmt.Printf("LIKEN-"+format+"\n", args...)
}

// fail reports an error the test shows, and powers off so it ends at once.
func fail(format string, args ...any) {
	say("ERROR "+format, args...)
	halt(syscall.LINUX_REBOOT_CMD_POWER_OFF)
}

func halt(cmd int) {
	syscall.Sync()
	_ = syscall.Unmount(bootMount, 0)
	syscall.Sync()
	if err := syscall.Reboot(cmd); err != nil {
		say("ERROR reboot: %v", err)
	}
	for {
		time.Sleep(time.Hour)
	}
}

func main() {
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := syscall.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			fail("mount %s: %v", m.dst, err)
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		fail("read /proc/cmdline: %v", err)
	}
	// The whole command line, for the tests of the extra kernel arguments.
	say("CMDLINE %s", strings.TrimSpace(string(cmdline)))
	slot, trial, err := boot.ParseCmdline(string(cmdline))
	if err != nil {
		fail("%v", err)
	}
	scenario := "report"
	if b, err := os.ReadFile("/scenario"); err == nil {
		scenario = strings.TrimSpace(string(b))
	}
	kernel := "none"
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, "BOOT_IMAGE="); ok {
			kernel = v
		}
	}
	files := "none"
	if b, err := os.ReadFile("/slot"); err == nil {
		files = strings.TrimSpace(string(b))
	}
	if err := initramfs.LoadModules("", nil); err != nil {
		fail("loading modules: %v", err)
	}
	if err := waitFor(bootDev, 30*time.Second); err != nil {
		fail("%v", err)
	}
	_ = os.MkdirAll(bootMount, 0o755)
	if err := syscall.Mount(bootDev, bootMount, "ext4", 0, ""); err != nil {
		fail("mount %s: %v", bootDev, err)
	}
	if _, err := os.Stat(bootMount + "/grub/" + boot.EnvFile); err == nil {
		grubDir = bootMount + "/grub"
	}
	bl := boot.NewGRUB(grubDir)
	st, err := bl.State()
	if err != nil {
		fail("reading boot state: %v", err)
	}
	t := 0
	if trial {
		t = 1
	}
	say("INIT slot=%s initrd=%s kernel=%s trial=%d scenario=%s state=%s primary=%s backup=%s uptime=%s",
		slot, files, kernel, t, scenario, short(st, nil), copyState(boot.EnvFile), copyState(boot.BackupFile), uptime())

	if !trial {
		say("POWEROFF")
		halt(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	}
	switch scenario {
	case "commit":
		if err := bl.Commit(slot); err != nil {
			fail("commit %s: %v", slot, err)
		}
		st, err := bl.State()
		if err != nil {
			fail("reading boot state after commit: %v", err)
		}
		say("COMMIT slot=%s state=%s", slot, short(st, nil))
		say("REBOOT")
		halt(syscall.LINUX_REBOOT_CMD_RESTART)
	case "panic":
		say("PANIC")
		syscall.Sync()
		os.Exit(3) // PID 1 exits: the kernel panics
	case "hang":
		if err := armWatchdog(2); err != nil {
			fail("watchdog: %v", err)
		}
		say("HANG")
		for {
			time.Sleep(time.Hour)
		}
	case "wait":
		say("WAIT")
		for {
			time.Sleep(time.Hour)
		}
	case "report":
		say("POWEROFF")
		halt(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	default:
		fail("unknown scenario %q", scenario)
	}
}

// short renders a state as proven/trial ("A/-", "A/B"), or corrupt[:proven].
func short(st boot.State, err error) string {
	if err != nil {
		if st.Proven != "" {
			return "corrupt:" + string(st.Proven)
		}
		return "corrupt"
	}
	t := string(st.Trial)
	if t == "" {
		t = "-"
	}
	return string(st.Proven) + "/" + t
}

// copyState decodes one copy with the Go codec.
func copyState(name string) string {
	b, err := os.ReadFile(filepath.Join(grubDir, name))
	if err != nil {
		return "missing"
	}
	st, err := boot.Decode(b)
	return short(st, err)
}

func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}

func waitFor(path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// armWatchdog opens /dev/watchdog with a timeout in seconds; from then on
// only writes to it keep the machine running.
func armWatchdog(seconds int) error {
	if err := waitFor("/dev/watchdog", 10*time.Second); err != nil {
		return err
	}
	f, err := os.OpenFile("/dev/watchdog", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	const wdiocSetTimeout = 0xc0045706 // _IOWR('W', 6, int)
	v := int32(seconds)
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), wdiocSetTimeout, uintptr(unsafe.Pointer(&v))); errno != 0 {
		return fmt.Errorf("setting the timeout: %w", errno)
	}
	watchdog = f // stays open (and referenced): closing could stop it
	_, err = f.Write([]byte{0})
	return err
}

var watchdog *os.File
