// Package boote2e builds two-slot test disks that boot liken's grub.cfg with Debian's GRUB under QEMU, and runs them.
//
// Everything comes from Debian packages fetched with `apt-get download`
// and unpacked with `dpkg -x` under _output/boot (no root, no loop
// devices, nothing installed): QEMU and SeaBIOS to run the machine, GRUB's
// BIOS build for the disk, a Debian kernel and its modules for the slots.
// The folder is a cache: a second run reuses it.
package boote2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/node/boot/diskimage"
)

// Packages are the Debian packages the kit unpacks. The kernel image is
// resolved from kernelMeta at fetch time.
var Packages = []string{
	"qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios",
	"grub-pc-bin", "grub-common",
	// QEMU's shared libraries that a machine without QEMU lacks.
	"libaio1", "libcapstone4", "libdaxctl1", "libfdt1", "libfuse3-3", "libibverbs1",
	"libndctl6", "libnl-3-200", "libnl-route-3-200", "libpmem1", "librdmacm1",
	"libslirp0", "liburing2", "libvdeplug2",
}

// kernelMeta is the package whose dependency names the current kernel:
// Debian's kernel for virtual machines. Its image is LZ4-compressed, where
// the generic kernel's is XZ, which alone takes 6 s to unpack under
// emulation; it also builds in ext4.
const kernelMeta = "linux-image-cloud-amd64"

// SlotModules are the kernel modules the slots' init loads (their
// dependencies are added; modules built into the kernel are skipped): the
// disk, its file system, the watchdog.
var SlotModules = []string{"virtio_pci", "virtio_blk", "crc32c_generic", "ext4", "softdog"}

// Kit is an unpacked set of tools and a kernel.
type Kit struct {
	// Dir is the cache folder (_output/boot).
	Dir string
	// Root is where the packages are unpacked.
	Root string
	// Kernel is the kernel image; ModulesDir its modules.
	Kernel, ModulesDir string
	// CoreImg is GRUB's core image built for liken's disks; BootImg the MBR code.
	CoreImg, BootImg string
	// Init is the static bootinit binary.
	Init string
	// Modules are the module files to load, in order.
	Modules []string
}

// RepoRoot finds the folder holding liken's go.mod, from the working
// folder up.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module liken.sh/liken\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find liken's go.mod above the working folder")
		}
		dir = parent
	}
}

// Prepare fetches and unpacks the packages (once; later runs reuse the
// cache), builds bootinit and GRUB's core image, and returns the kit.
// logf receives progress.
func Prepare(logf func(string, ...any)) (*Kit, error) {
	repo, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	k := &Kit{Dir: filepath.Join(repo, "_output", "boot")}
	k.Root = filepath.Join(k.Dir, "root")
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

// fetch downloads and unpacks the packages unless the cache already holds
// exactly this set.
func (k *Kit) fetch(logf func(string, ...any)) error {
	debs := filepath.Join(k.Dir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	stamp := filepath.Join(k.Root, ".liken-packages")
	have, _ := os.ReadFile(stamp)
	kernelPkg, err := resolveKernelPackage()
	if err != nil && len(have) > 0 {
		logf("using the packages already unpacked in %s (%v)", k.Root, err)
		return nil
	}
	if err != nil && aptUpdate(logf) {
		kernelPkg, err = resolveKernelPackage()
	}
	if err != nil {
		return err
	}
	want := append(append([]string(nil), Packages...), kernelPkg)
	if string(have) == strings.Join(want, "\n")+"\n" {
		return nil
	}
	logf("fetching Debian packages into %s: %s", debs, strings.Join(want, " "))
	// apt-get download writes into the working folder; remove older
	// versions of the same packages first so each name maps to one file.
	old, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	for _, f := range old {
		os.Remove(f)
	}
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, want...)...)
		cmd.Dir = debs
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && aptUpdate(logf) {
		out, err = download()
	}
	if err != nil {
		return fmt.Errorf("apt-get download failed (%v); the boot test needs Debian's package lists: run 'apt-get update' (hack/install-deps.sh does) and retry:\n%s", err, out)
	}
	if err := os.RemoveAll(k.Root); err != nil {
		return err
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) < len(want) {
		return fmt.Errorf("apt-get download left %d packages in %s, want %d", len(files), debs, len(want))
	}
	logf("unpacking %d packages into %s", len(files), k.Root)
	for _, f := range files {
		if out, err := exec.Command("dpkg", "-x", f, k.Root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg -x %s: %v\n%s", f, err, out)
		}
	}
	return os.WriteFile(stamp, []byte(strings.Join(want, "\n")+"\n"), 0o644)
}

// aptUpdate refreshes Debian's package lists when this process may (as
// root), once; it reports whether it did.
func aptUpdate(logf func(string, ...any)) bool {
	if os.Geteuid() != 0 || aptUpdated {
		return false
	}
	aptUpdated = true
	logf("refreshing Debian's package lists (apt-get update)")
	out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput()
	if err != nil {
		logf("apt-get update failed: %v\n%s", err, out)
		return false
	}
	return true
}

var aptUpdated bool

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

// Tool returns the path of an unpacked program.
func (k *Kit) Tool(name string) string {
	for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
		p := filepath.Join(k.Root, d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join(k.Root, "usr/bin", name)
}

// LibraryPath is LD_LIBRARY_PATH for the unpacked programs.
func (k *Kit) LibraryPath() string {
	return strings.Join([]string{
		filepath.Join(k.Root, "usr/lib/x86_64-linux-gnu"),
		filepath.Join(k.Root, "lib/x86_64-linux-gnu"),
	}, ":")
}

func (k *Kit) run(tool string, args ...string) error {
	cmd := exec.Command(k.Tool(tool), args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+k.LibraryPath())
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
