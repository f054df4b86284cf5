// Command liken-boot is the init of liken's initramfs: it mounts the slot the kernel command line names as the read-only root and hands over to the image's service manager.
//
// Steps, each printed on the console as a line starting with "liken-boot:":
//
//  1. load the watchdog's module (softdog) first and, on a trial boot
//     (liken.trial=1), arm the watchdog for watchdog.InitTimeout: from
//     here on a hang anywhere (a driver's probe, the kernel, the service
//     manager, liken-node) resets the machine, and GRUB boots the proven
//     slot;
//  2. load the other kernel modules the archive lists (the disk, its file
//     systems, squashfs, loop, overlay);
//  3. find the partitions by their labels (liken-boot, liken-layer,
//     liken-slots); on a trial boot, flush the disk's cache so that
//     GRUB's cleared trial flag is saved; check the boot partition with
//     e2fsck -p (checkBootPartition); mount the slot store;
//  4. mount slots/<slot>/rootfs.squashfs through a read-only loop device
//     as the new root; /etc is an overlay whose changes live in memory for
//     one boot, /var a memory file system; the slot store is mounted at
//     /var/lib/liken, with kubelet's and containerd's state and the
//     journal in it, the machine ID kept there in /etc/machine-id, the
//     boot partition read-only at /boot (liken-node makes it writable
//     for the time of its writes, node/boot Writable; not mounted at all
//     when e2fsck could not repair it), the layer partition read-only at
//     /var/lib/liken-layer;
//  5. on a trial boot, re-arm the watchdog with what is left of the
//     Cluster's trial timeout, read from liken-node's trial record in the
//     slot store (watchdog.ForTrial);
//  6. switch to the new root and run /sbin/init.
//
// Any failure ends the init, so the kernel panics and, with panic=N on the
// command line, reboots: a trial slot that cannot boot falls back to the
// proven slot with no help.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/internal/loopdev"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/watchdog"
)

// Partition labels, as liken install writes them.
const (
	bootLabel  = "liken-boot"
	layerLabel = "liken-layer"
	slotsLabel = "liken-slots"
)

// daemonState is liken-node's state file in the slot store (node/daemon's
// StateFile), which holds the trial record.
const daemonState = "state/daemon.json"

// newRoot is where the slot's root is assembled before the switch.
const newRoot = "/root"

func say(format string, args ...any) {
	fmt.Printf("liken-boot: "+format+"\n", args...)
}

func main() {
	if err := run(); err != nil {
		say("cannot boot: %v", err)
		say("the kernel panics now; with panic=N it reboots and GRUB boots the proven slot")
		syscall.Sync()
		os.Exit(1)
	}
}

func run() error {
	start := time.Now()
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	slot, trial, err := boot.ParseCmdline(string(cmdline))
	if err != nil {
		return err
	}
	say("booting slot %s (trial %t)", slot, trial)
	// The Cluster's settings.kernelArgs come last, as the boot loader
	// passed them: this line shows what this boot runs with.
	say("kernel command line: %s", strings.TrimSpace(string(cmdline)))
	armFirst := func() error {
		if !trial {
			return nil
		}
		if err := armWatchdog(watchdog.InitTimeout); err != nil {
			return fmt.Errorf("arming the watchdog for the trial: %w", err)
		}
		say("watchdog armed for %s before the other drivers load and the disk is mounted", watchdog.InitTimeout)
		return nil
	}
	if err := initramfs.LoadModules("softdog", armFirst); err != nil {
		return fmt.Errorf("loading kernel modules: %w", err)
	}
	parts, err := findPartitions(30*time.Second, bootLabel, layerLabel, slotsLabel)
	if err != nil {
		return err
	}
	if trial {
		// GRUB cleared the trial flag through the firmware, which may
		// leave the write in the disk's cache: flush it now, so that a
		// power cut from here on cannot bring the flag back and run the
		// trial again.
		if err := flushDisk(parts[bootLabel]); err != nil {
			return fmt.Errorf("saving GRUB's cleared trial flag: %w", err)
		}
	}
	bootClean, err := checkBootPartition(parts[bootLabel], trial)
	if err != nil {
		return err
	}
	if err := assemble(slot, parts, bootClean); err != nil {
		return err
	}
	if trial {
		state, err := os.ReadFile(filepath.Join(newRoot, "var/lib/liken", daemonState))
		timeout, why := watchdog.ForTrial(state, time.Now())
		if err != nil {
			why = fmt.Sprintf("liken-node's state cannot be read (%v); keeping %s", err, watchdog.InitTimeout)
		}
		if err := armWatchdog(timeout); err != nil {
			return fmt.Errorf("re-arming the watchdog for the trial: %w", err)
		}
		say("watchdog armed: liken-node must feed it within %s (%s)", timeout, why)
	}
	say("root of slot %s mounted in %s; starting /sbin/init", slot, time.Since(start).Round(time.Millisecond))
	return switchRoot()
}

// armWatchdog opens the watchdog, sets its timeout, feeds it and closes it
// without the magic character: it stays armed until liken-node feeds it.
func armWatchdog(timeout time.Duration) error {
	wd, err := watchdog.Open(watchdog.DefaultDevice, timeout)
	if wd != nil {
		if cerr := wd.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// flushDisk asks the disk that holds the partition dev to save what it
// has cached (fsync of a block device sends the disk a cache flush).
func flushDisk(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// e2fsck is the static e2fsck (Debian's e2fsck-static) in the initramfs.
const e2fsck = "/sbin/e2fsck"

// checkBootPartition runs e2fsck -p on the boot partition before it is
// mounted. ext2 has no journal: after a power cut while it was written,
// its bitmaps may call blocks of the proven kernel or of the boot state
// free, and the next write would reuse them. e2fsck -p repairs what is
// safe to repair unattended. What it cannot repair fails a trial boot
// (its panic reboots into the proven slot, which checks again) and, on
// the proven slot, leaves the partition unmounted: the machine runs its
// workloads, and liken-node, which finds no boot state, reports it and
// writes no slot, until a person repairs it. clean is false then.
func checkBootPartition(dev string, trial bool) (clean bool, err error) {
	start := time.Now()
	cmd := exec.Command(e2fsck, "-p", dev)
	out, err := cmd.CombinedOutput()
	code := cmd.ProcessState.ExitCode()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			say("e2fsck: %s", l)
		}
	}
	switch {
	case err == nil:
		say("boot partition %s checked in %s: clean", dev, time.Since(start).Round(time.Millisecond))
		return true, nil
	case code == 1 || code == 2 || code == 3:
		say("boot partition %s checked in %s: e2fsck repaired it (exit status %d)", dev, time.Since(start).Round(time.Millisecond), code)
		return true, nil
	case code < 0:
		return false, fmt.Errorf("checking the boot partition %s: %w", dev, err)
	case trial:
		return false, fmt.Errorf("the boot partition %s has errors e2fsck -p cannot repair (exit status %d): the trial stops here", dev, code)
	}
	say("the boot partition %s has errors e2fsck -p cannot repair (exit status %d): it is not mounted, and no release can be staged or tried until a person repairs it (e2fsck from a rescue system)", dev, code)
	return false, nil
}

// findPartitions waits until a block device carries each label and returns
// the device of each.
func findPartitions(wait time.Duration, labels ...string) (map[string]string, error) {
	deadline := time.Now().Add(wait)
	for {
		found := map[string]string{}
		entries, _ := os.ReadDir("/sys/class/block")
		for _, e := range entries {
			dev := "/dev/" + e.Name()
			if l, err := extLabel(dev); err == nil && l != "" {
				if _, dup := found[l]; !dup {
					found[l] = dev
				}
			}
		}
		var missing []string
		for _, l := range labels {
			if found[l] == "" {
				missing = append(missing, l)
			}
		}
		if len(missing) == 0 {
			for _, l := range labels {
				say("partition %s is %s", l, found[l])
			}
			return found, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no partition labelled %s after %s (is this a disk written by liken install?)", strings.Join(missing, ", "), wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// extLabel reads the volume label of an ext2/3/4 file system.
func extLabel(dev string) (string, error) {
	f, err := os.Open(dev)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return "", err
	}
	if sb[0x38] != 0x53 || sb[0x39] != 0xef {
		return "", errors.New("not an ext file system")
	}
	return strings.TrimRight(string(sb[0x78:0x88]), "\x00"), nil
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, dst, err)
	}
	return nil
}

// assemble mounts the slot's root and everything under it at newRoot,
// the boot partition read-only unless it is not clean (then not at all).
func assemble(slot boot.Slot, parts map[string]string, bootClean bool) error {
	store := "/store"
	if err := mount(parts[slotsLabel], store, "ext4", 0, ""); err != nil {
		return err
	}
	image := filepath.Join(store, "slots", string(slot), "rootfs.squashfs")
	loop, release, err := loopdev.Attach(image)
	if err != nil {
		return fmt.Errorf("slot %s: %w", slot, err)
	}
	err = mount(loop, newRoot, "squashfs", unix.MS_RDONLY, "")
	release()
	if err != nil {
		return fmt.Errorf("slot %s's root: %w", slot, err)
	}
	// /etc: the image's, with this boot's changes in memory.
	if err := mount("tmpfs", "/overlay", "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"/overlay/etc", "/overlay/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mount("overlay", newRoot+"/etc", "overlay", 0, "lowerdir="+newRoot+"/etc,upperdir=/overlay/etc,workdir=/overlay/work"); err != nil {
		return err
	}
	if err := mount("tmpfs", newRoot+"/var", "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	// /tmp: programs' scratch space, and where systemd makes a unit's
	// private /dev (PrivateDevices, as systemd-timesyncd asks).
	if err := mount("tmpfs", newRoot+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := mount(store, newRoot+"/var/lib/liken", "", unix.MS_MOVE, ""); err != nil {
		return err
	}
	for dst, src := range boot.Persistent {
		src = filepath.Join(newRoot, "var/lib/liken", src)
		if err := os.MkdirAll(src, 0o700); err != nil {
			return err
		}
		if err := mount(src, newRoot+dst, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	// One machine ID for every boot, kept on the slot store: its journal
	// of earlier boots stays readable. Without it systemd makes one for
	// this boot.
	if err := boot.SetMachineID(newRoot, newRoot+"/var/lib/liken"); err != nil {
		say("keeping no machine ID, systemd makes one for this boot: %v", err)
	}
	if bootClean {
		if err := mount(parts[bootLabel], newRoot+"/boot", "ext4", unix.MS_RDONLY, ""); err != nil {
			return err
		}
	}
	return mount(parts[layerLabel], newRoot+"/var/lib/liken-layer", "ext4", unix.MS_RDONLY, "")
}

// switchRoot moves the kernel's file systems into the new root, makes it
// the root, and runs its init.
func switchRoot() error {
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return err
		}
	}
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the new root to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	return unix.Exec("/sbin/init", []string{"/sbin/init"}, os.Environ())
}
