package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/utils/clock"

	v1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/lab/controlplane"
	clirelease "liken.sh/liken/cli/release"
	"liken.sh/liken/image"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/release"
)

// The VM lab (liken lab up --vm): each machine is a QEMU virtual machine
// booting a disk written by liken install with liken's OS image (make
// image). It reaches the API endpoint and the channel on this computer
// through QEMU's user network, at qemu.HostAddress (upvm.go).

// VMHardware is what each virtual machine of a fleet of machines gets:
// 1.5 GiB for systemd, containerd, kubelet and liken-node; two CPUs alone,
// one each in a fleet, since every emulated CPU keeps a host core busy.
func VMHardware(machines int) qemu.Hardware {
	hw := qemu.Hardware{MemoryMiB: 1536, CPUs: 2, Network: true}
	if machines > 1 {
		hw.CPUs = 1
	}
	return hw
}

// LeaderHardware is what a virtual Leader gets: it runs an etcd member
// and the API server besides the node agent, which need 2 GiB and two
// emulated CPUs to be ready within minutes (docs/design/controlplane.md,
// "Measured").
func LeaderHardware() qemu.Hardware {
	return qemu.Hardware{MemoryMiB: 2048, CPUs: 2, Network: true}
}

// machineHardware is machine m's hardware in the lab st, with its
// forwarded ports and its port on the lab's segment.
func machineHardware(st *State, m *MachineInfo) qemu.Hardware {
	hw := VMHardware(len(st.Machines))
	if m.Role == string(v1.RoleLeader) {
		hw = LeaderHardware()
	}
	hw.Forwards = m.Forwards
	for i := range st.Machines {
		if st.Machines[i].Name == m.Name {
			hw.Segment = &qemu.Segment{Socket: segmentSocket(st, m.Name), Switch: segmentSocket(st, switchName), MAC: segmentMAC(i)}
		}
	}
	return hw
}

// The VM lab's network segment: each virtual machine's second port is on
// one Ethernet segment, the frames going through unix datagram sockets
// to the lab's switch (liken lab serve-segment), never through this
// computer's network. On it, machine i (from 0) has the address
// segmentAddress(i); its first port, on QEMU's user network, reaches
// this computer at qemu.HostAddress. The segment carries the default
// route, so that the kubelet gives its Node the segment's address, and
// it leads nowhere else: the lab's machines reach only one another and
// this computer's channel and endpoint.
const (
	segmentDir = "segment"
	switchName = "switch"
	// segmentPrefix is the segment's /24; the gateway, .1, answers
	// nothing.
	segmentPrefix = "10.77.0"
)

// segmentSocket is the unix socket of name (a machine, or the switch).
func segmentSocket(st *State, name string) string {
	return filepath.Join(st.Dir, segmentDir, name+".sock")
}

// segmentMAC is machine i's hardware address on the segment.
func segmentMAC(i int) string { return fmt.Sprintf("52:54:00:4c:00:%02x", i+1) }

// segmentAddress is machine i's address on the segment (liken lab up
// makes at most 200 machines).
func segmentAddress(i int) string { return fmt.Sprintf("%s.%d", segmentPrefix, 11+i) }

// vmPorts is machine i's spec.ports: its port to this computer, QEMU's
// user network at its fixed address, and its port on the segment.
func vmPorts(i int) string {
	return fmt.Sprintf("  ports:\n  - name: host\n    mac: %q\n    addresses: [10.0.2.15/24]\n"+
		"  - name: lab\n    mac: %q\n    addresses: [%s/24]\n    gateway: %s.1\n",
		qemu.UserMAC, segmentMAC(i), segmentAddress(i), segmentPrefix)
}

// startSegment starts the lab's switch and waits for its socket.
func startSegment(ctx context.Context, st *State, bins binaries) error {
	sock := segmentSocket(st, switchName)
	// A unix socket's address holds 107 bytes.
	if len(sock) > 100 {
		return fmt.Errorf("the lab's folder %s is too long for the segment's unix sockets (%s): set LIKEN_LAB_HOME to a shorter folder", st.Dir, sock)
	}
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return err
	}
	p, err := controlplane.StartProcess(bins.liken, []string{"lab", "serve-segment", "--socket", sock}, filepath.Join(st.Dir, "segment.log"), true)
	if err != nil {
		return err
	}
	p.Kind, p.Name = KindSegment, "segment"
	st.Processes = append(st.Processes, *p)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		if err := exitedProcess(st); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// vmDiskSize is each virtual machine's disk: two releases, the node
// agent's images and state.
const vmDiskSize = 4 << 30

// osImageDir finds make image's output in the liken source tree, building
// it with make image when it is missing.
func osImageDir(log io.Writer) (string, error) {
	src := sourceTree()
	if src == "" {
		return "", errors.New("liken lab up --vm runs liken's OS image from a liken source tree (make image writes it to _output/image): run it there")
	}
	dir := filepath.Join(src, "_output", "image")
	for _, f := range image.Files {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			continue
		}
		fmt.Fprintf(log, "The OS image is missing (%s); building it with make image in %s (as root; minutes the first time)...\n", f, src)
		cmd := exec.Command("make", "-C", src, "image")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("make image: %w", err)
		}
		break
	}
	return dir, nil
}

// PublishOSImage publishes make image's output (imageDir) as release
// version in channelDir, with change applied to a copy of its root first
// (nil: none; the copy is always made, since the root names its version
// in /etc/liken/release). work holds the copy while it is built.
func PublishOSImage(imageDir, channelDir, work, version string, change func(root string) error) (*clirelease.Result, error) {
	root := filepath.Join(work, "root-"+version)
	if err := os.RemoveAll(root); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	if out, err := exec.Command("unsquashfs", "-no-progress", "-d", root, filepath.Join(imageDir, image.RootFS)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("unpacking the OS image: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(root, image.ReleaseFile), []byte(image.ReleaseFileContent(version)), 0o644); err != nil {
		return nil, err
	}
	if change != nil {
		if err := change(root); err != nil {
			return nil, err
		}
	}
	img := filepath.Join(work, "rootfs-"+version+".squashfs")
	defer os.Remove(img)
	// A fast compression: only the version (or a fault) differs from the
	// image make image compressed.
	if out, err := exec.Command("mksquashfs", root, img, "-noappend", "-comp", "zstd", "-Xcompression-level", "3", "-quiet", "-no-progress").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("packing the OS image: %v\n%s", err, out)
	}
	return clirelease.Build(clirelease.BuildOptions{
		Image: img, Channel: channelDir, Version: version,
		Artifacts: image.ArtifactFlags(imageDir),
	}, clock.RealClock{})
}

// vmFault is the change that makes the OS image fail as fault says.
func vmFault(fault string) func(root string) error {
	switch fault {
	case FaultPanic:
		// liken-boot finds no init: the kernel panics.
		return func(root string) error { return os.Remove(filepath.Join(root, imageInit)) }
	case FaultNoRejoin:
		// No network configuration: every Ethernet port is left alone by
		// systemd-networkd (the first file that matches a port wins), so
		// the machine never gets an address, whatever its Machine's ports
		// and its layer say.
		return func(root string) error {
			return os.WriteFile(filepath.Join(root, "etc/systemd/network/00-liken-fault-no-network.network"),
				[]byte("[Match]\nType=ether\n\n[Link]\nUnmanaged=yes\n"), 0o644)
		}
	}
	return nil
}

// publishVM builds the next release of the OS image into the lab's
// channel.
func publishVM(st *State, fault string) (version, digest string, err error) {
	version, err = nextVersion(st.ChannelDir, time.Now())
	if err != nil {
		return "", "", err
	}
	rel, err := PublishOSImage(st.ImageDir, st.ChannelDir, filepath.Join(st.Dir, "images"), version, vmFault(fault))
	if err != nil {
		return "", "", err
	}
	if fault == FaultCorrupt {
		if err := corrupt(filepath.Join(st.ChannelDir, version, release.RootfsPath)); err != nil {
			return "", "", err
		}
	}
	return rel.Version, rel.Digest, nil
}

// vmTools fetches QEMU (and GRUB) into liken's cache.
func vmTools(log io.Writer) (*qemu.Tools, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	return qemu.Fetch(filepath.Join(cache, "liken", "qemu"), nil, func(f string, a ...any) { fmt.Fprintf(log, f+"\n", a...) })
}

// installVM writes the machine's disk with liken install: a Leader's
// disk gets its control plane (leader/).
func installVM(ctx context.Context, m MachineInfo, channelDir, version, layerFile string) error {
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return err
	}
	_, err := install.Install(ctx, install.Options{
		Disk: filepath.Join(m.Dir, vmDisk), Release: filepath.Join(channelDir, version), Layer: layerFile,
		Machine: m.Name, Size: vmDiskSize, TempDir: m.Dir,
	})
	return err
}

// vmDisk is the machine's disk image in its folder.
const vmDisk = "disk.img"

// startVM powers a virtual machine on: QEMU, in a session of its own, its
// console in the machine's log.
func startVM(st *State, m *MachineInfo) (*controlplane.Process, error) {
	tools, err := vmTools(io.Discard)
	if err != nil {
		return nil, err
	}
	// QEMU binds its segment socket anew: remove the one a machine whose
	// power was pulled left behind.
	if err := os.Remove(segmentSocket(st, m.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	args := append([]string{"LD_LIBRARY_PATH=" + tools.LibraryPath(), tools.Tool("qemu-system-x86_64")},
		tools.Args(filepath.Join(m.Dir, vmDisk), machineHardware(st, m), "stdio")...)
	p, err := controlplane.StartProcess("/usr/bin/env", args, filepath.Join(m.Dir, machineLog), true)
	if err != nil {
		return nil, err
	}
	p.Kind, p.Name = KindMachine, m.Name
	return p, nil
}
