// Package boote2e builds two-slot test disks that boot liken's grub.cfg with Debian's GRUB under QEMU, and runs them.
//
// Everything comes from Debian packages fetched with `apt-get download`
// and unpacked with `dpkg -x` under _output/boot (no root, no loop
// devices, nothing installed): QEMU, SeaBIOS and OVMF to run the machine,
// GRUB's BIOS and EFI builds for the disk, a Debian kernel and its modules
// for the slots, Debian's FAT tools to check an EFI system partition.
// The folder is a cache: a second run reuses it.
package boote2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/internal/debpkg"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/internal/srctree"
	"liken.sh/liken/node/boot/diskimage"
)

// kernelMeta is the package whose dependency names the current kernel:
// Debian's kernel for virtual machines. Its image is LZ4-compressed, where
// the generic kernel's is XZ, which alone takes 6 s to unpack under
// emulation; it also builds in ext4.
const kernelMeta = "linux-image-cloud-amd64"

// SlotModules are the kernel modules the slots' init loads (their
// dependencies are added; modules built into the kernel are skipped): the
// disk, its file system, the watchdog.
var SlotModules = []string{"virtio_pci", "virtio_blk", "crc32c_generic", "ext4", "softdog"}

// Kit is an unpacked set of tools (QEMU, GRUB) and a kernel.
type Kit struct {
	*qemu.Tools
	// Dir is the cache folder (_output/boot).
	Dir string
	// Kernel is the kernel image; ModulesDir its modules.
	Kernel, ModulesDir string
	// CoreImg is GRUB's core image built for liken's disks; BootImg the MBR code.
	CoreImg, BootImg string
	// Init is the static bootinit binary.
	Init string
	// Modules are the module files to load, in order.
	Modules []string
}

// Prepare fetches and unpacks the packages (once; later runs reuse the
// cache), builds bootinit and GRUB's core image, and returns the kit.
// logf receives progress.
func Prepare(logf func(string, ...any)) (*Kit, error) {
	repo, err := srctree.Find()
	if err != nil {
		return nil, err
	}
	k := &Kit{Dir: filepath.Join(repo, "_output", "boot")}
	if err := os.MkdirAll(k.Dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lock(filepath.Join(k.Dir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	if err := k.fetch(logf); err != nil {
		return nil, err
	}
	if err := k.findKernel(); err != nil {
		return nil, err
	}
	if err := k.resolveModules(); err != nil {
		return nil, err
	}
	build := filepath.Join(k.Dir, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return nil, err
	}
	k.Init = filepath.Join(build, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", k.Init, "./e2e/boot/bootinit")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building bootinit: %v\n%s", err, out)
	}
	k.BootImg = filepath.Join(k.Root, "usr/lib/grub/i386-pc/boot.img")
	k.CoreImg = filepath.Join(build, "core.img")
	core, err := diskimage.UnpackedGRUB(k.Root).CoreImage("(hd0,msdos1)/boot/grub")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(k.CoreImg, core, 0o644); err != nil {
		return nil, err
	}
	return k, nil
}

// fetch downloads and unpacks QEMU, GRUB and the kernel unless the cache
// already holds exactly this set.
func (k *Kit) fetch(logf func(string, ...any)) error {
	kernelPkg, err := resolveKernelPackage()
	if err != nil && debpkg.AptUpdate(logf) {
		kernelPkg, err = resolveKernelPackage()
	}
	root := filepath.Join(k.Dir, "root")
	if err != nil {
		if _, serr := os.Stat(filepath.Join(root, ".liken-packages")); serr == nil {
			logf("using the packages already unpacked in %s (%v)", root, err)
			k.Tools = &qemu.Tools{Root: root, Accel: os.Getenv(qemu.AccelEnv)}
			return nil
		}
		return err
	}
	// dosfstools and mtools check the EFI system partition liken install
	// writes (TestInstalledDisk).
	k.Tools, err = qemu.Fetch(k.Dir, []string{kernelPkg, "dosfstools", "mtools"}, logf)
	return err
}

var dependsKernel = regexp.MustCompile(`Depends: (linux-image-[0-9][^\s]*-amd64)\b`)

// resolveKernelPackage names the kernel package kernelMeta points at.
func resolveKernelPackage() (string, error) {
	out, err := exec.Command("apt-cache", "depends", kernelMeta).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s failed (%v); run 'apt-get update' and retry:\n%s", kernelMeta, err, out)
	}
	m := dependsKernel.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("apt-cache depends %s names no kernel image; run 'apt-get update' and retry:\n%s", kernelMeta, out)
	}
	return string(m[1]), nil
}

func (k *Kit) findKernel() error {
	kernels, _ := filepath.Glob(filepath.Join(k.Root, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return fmt.Errorf("want one kernel in %s/boot, found %d", k.Root, len(kernels))
	}
	k.Kernel = kernels[0]
	ver := strings.TrimPrefix(filepath.Base(k.Kernel), "vmlinuz-")
	k.ModulesDir = filepath.Join(k.Root, "lib", "modules", ver)
	return nil
}

// resolveModules finds SlotModules and their dependencies, dependencies
// first.
func (k *Kit) resolveModules() error {
	order, err := initramfs.ResolveModules(k.ModulesDir, SlotModules)
	k.Modules = order
	return err
}

func (k *Kit) run(tool string, args ...string) error {
	cmd := k.Command(tool, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return nil
}

// lock takes an exclusive lock on path, so two test processes do not
// unpack into the same cache at once.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
