// Package qemu fetches QEMU and GRUB from Debian's packages, unpacked in a folder (nothing installed, no root), and runs virtual machines with them.
package qemu

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"liken.sh/liken/internal/debpkg"
)

// Packages are the Debian packages unpacked: QEMU, SeaBIOS and OVMF (UEFI)
// to run a machine, GRUB's BIOS and EFI builds for its disk, and QEMU's
// shared libraries that a machine without QEMU lacks.
var Packages = []string{
	"qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios", "ovmf",
	"grub-pc-bin", "grub-efi-amd64-bin", "grub-common",
	"libaio1", "libcapstone4", "libdaxctl1", "libfdt1", "libfuse3-3", "libibverbs1",
	"libndctl6", "libnl-3-200", "libnl-route-3-200", "libpmem1", "librdmacm1",
	"libslirp0", "liburing2", "libvdeplug2",
}

// Tools are the unpacked packages.
type Tools struct {
	// Root is the folder the packages are unpacked into.
	Root string
	// Accel is QEMU's accelerator: "tcg" (software emulation, when empty)
	// or "kvm". Fetch takes it from AccelEnv.
	Accel string
}

// AccelEnv names the accelerator the machines run with: unset or "tcg"
// for software emulation, "kvm" on a host whose KVM runs guests. KVM is
// never chosen on its own: on some hosts its device answers and guests
// then hang (docs/development.md).
const AccelEnv = "LIKEN_QEMU_ACCEL"

// Fetch downloads Packages and extra with apt-get download into dir/debs
// and unpacks them into dir/root, unless dir/root already holds exactly
// this set (debpkg.Unpack). logf receives progress lines.
func Fetch(dir string, extra []string, logf func(string, ...any)) (*Tools, error) {
	t := &Tools{Accel: os.Getenv(AccelEnv)}
	if t.Accel != "" && t.Accel != "tcg" && t.Accel != "kvm" {
		return nil, fmt.Errorf("%s=%q: give tcg (software emulation, the default) or kvm", AccelEnv, t.Accel)
	}
	root, err := debpkg.Unpack(dir, append(slices.Clone(Packages), extra...), logf)
	if err != nil {
		return nil, fmt.Errorf("QEMU and GRUB come from Debian's packages: %w", err)
	}
	t.Root = root
	return t, nil
}

// Tool returns the path of an unpacked program.
func (t *Tools) Tool(name string) string {
	for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
		p := filepath.Join(t.Root, d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join(t.Root, "usr/bin", name)
}

// LibraryPath is the LD_LIBRARY_PATH that finds the unpacked libraries.
func (t *Tools) LibraryPath() string {
	return filepath.Join(t.Root, "usr/lib/x86_64-linux-gnu") + ":" + filepath.Join(t.Root, "lib/x86_64-linux-gnu")
}

// Command returns the command that runs name with the unpacked libraries.
func (t *Tools) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(t.Tool(name), args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+t.LibraryPath())
	return cmd
}

// HostAddress is the host as a machine on QEMU's user network sees it:
// its connections to HostAddress reach the host's loopback.
const HostAddress = "10.0.2.2"

// Hardware is a virtual machine's size and network.
type Hardware struct {
	// MemoryMiB and CPUs size the machine.
	MemoryMiB, CPUs int
	// Network gives it one virtio port on QEMU's user network, where the
	// host is HostAddress and DHCP gives the machine 10.0.2.15. Without it
	// the machine has no network.
	Network bool
	// Forwards maps ports of the host's loopback to the machine's ports
	// (TCP, through the user network; Network only).
	Forwards map[int]int
	// Segment, when set, gives the machine a second virtio port on a
	// network segment shared with other machines.
	Segment *Segment
	// UEFIVars, when set, boots the machine with UEFI (Debian's OVMF)
	// instead of BIOS (SeaBIOS): it is the machine's own file of UEFI
	// variables, made by NewUEFIVars.
	UEFIVars string
}

// UserMAC is the hardware address of the port on QEMU's user network.
const UserMAC = "52:54:00:12:34:56"

// Segment is a machine's port on a network segment: QEMU's dgram backend
// sends each Ethernet frame as one datagram from the machine's unix
// socket to the segment's switch, which sends frames back to it there.
type Segment struct {
	// Socket is the machine's end, Switch the switch's (absolute paths
	// shorter than a unix socket address allows).
	Socket, Switch string
	// MAC is the port's hardware address, unique on the segment.
	MAC string
}

// Args are a machine's QEMU flags: the accelerator (software emulation
// unless Accel says kvm), no display, the serial console
// on console (stdio, or file:PATH), the disk on virtio.
func (t *Tools) Args(disk string, hw Hardware, console string) []string {
	nic := []string{"-nic", "none"}
	if hw.Network {
		// No option ROM: network boot is never used, and the ROM is in
		// a package that is not unpacked.
		netdev := "user,id=net0"
		hosts := slices.Sorted(maps.Keys(hw.Forwards))
		for _, host := range hosts {
			netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", host, hw.Forwards[host])
		}
		nic = []string{"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0,mac=" + UserMAC + ",romfile="}
	}
	if s := hw.Segment; s != nil {
		nic = append(nic,
			"-netdev", "dgram,id=net1,local.type=unix,local.path="+escape(s.Socket)+",remote.type=unix,remote.path="+escape(s.Switch),
			"-device", "virtio-net-pci,netdev=net1,mac="+s.MAC+",romfile=")
	}
	accel := t.Accel
	if accel == "" {
		accel = "tcg"
	}
	if hw.UEFIVars != "" {
		nic = append(nic,
			"-drive", "if=pflash,format=raw,readonly=on,file="+escape(filepath.Join(t.Root, ovmfCode)),
			"-drive", "if=pflash,format=raw,file="+escape(hw.UEFIVars))
	}
	return append(nic,
		"-accel", accel, "-machine", "pc", "-m", strconv.Itoa(hw.MemoryMiB), "-smp", strconv.Itoa(hw.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "none",
		"-monitor", "none", "-serial", console,
		"-L", filepath.Join(t.Root, "usr/share/seabios"), "-L", filepath.Join(t.Root, "usr/share/qemu"),
		"-drive", "file="+escape(disk)+",format=raw,if=virtio,cache=writeback",
		"-boot", "strict=on",
	)
}

// OVMF's firmware and the template of its variables, in Debian's ovmf.
const (
	ovmfCode = "usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "usr/share/OVMF/OVMF_VARS_4M.fd"
)

// NewUEFIVars writes a machine's file of UEFI variables at path: OVMF's
// empty template, which the firmware then writes its boot entries to.
func (t *Tools) NewUEFIVars(path string) error {
	b, err := os.ReadFile(filepath.Join(t.Root, ovmfVars))
	if err != nil {
		return fmt.Errorf("OVMF's variables template (Debian's ovmf): %w", err)
	}
	return os.WriteFile(path, b, 0o644)
}

// escape writes a path as a value of QEMU's option syntax, which escapes
// a comma by doubling it.
func escape(path string) string { return strings.ReplaceAll(path, ",", ",,") }
