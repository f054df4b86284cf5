package nsmachine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"liken.sh/liken/internal/loopdev"
	"liken.sh/liken/node/boot"
)

// InitOptions are what Start passes to Init.
type InitOptions struct {
	Dir      string    // the machine's folder
	Slot     boot.Slot // the slot to boot
	Cgroup   string    // the machine's cgroup, below Init's own
	NetNS    string    // a network namespace to join, or ""
	Hostname string    // the name until the image's own setup names it
	// PowerFD, if not 0, is the power line: a pipe whose other end only
	// the process that started the machine holds (Start passes it).
	PowerFD int
}

// KernelDefaults are the kernel settings the kubelet sets at start when
// they differ (and fails when it cannot). A machine sharing the host's
// kernel reads these values and cannot change the host's.
var KernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// ownSettings are the kernel settings under /proc/sys that belong to the
// machine's own namespaces (network, UTS, IPC), not to the host.
var ownSettings = []string{
	"net", "kernel/hostname", "kernel/domainname",
	"kernel/shmmax", "kernel/shmall", "kernel/shmmni", "kernel/shm_rmid_forced",
	"kernel/msgmax", "kernel/msgmnb", "kernel/msgmni", "kernel/sem", "fs/mqueue",
}

// devices are the host's device nodes a machine gets: what systemd, the
// kubelet (kmsg) and containerd need, and no disk.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty", "kmsg", "net/tun", "fuse"}

// Init does in the new namespaces what liken-boot does on a real machine,
// then runs the image's init (systemd) as the namespace's PID 1. It
// returns only on an error.
//
// The root is the slot's squashfs, read-only, with /etc in memory over it,
// /var and /tmp in memory, the slot store at /var/lib/liken (and the
// folders of boot.Persistent on it), the boot partition at /boot and the
// layer read-only at /var/lib/liken-layer. The host's kernel stays out of
// reach: /proc/sys is read-only but for the machine's own network
// namespace, the settings in KernelDefaults read as the kubelet wants
// them, /proc/cmdline and the boot ID are the machine's own, and
// /proc/sysrq-trigger is gone.
func Init(o InitOptions) error {
	// Namespaces joined below (cgroup, network) belong to this thread,
	// which is also the one that runs the image's init.
	runtime.LockOSThread()
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	if err := joinCgroup(hs, o.Cgroup); err != nil {
		return err
	}
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("a cgroup namespace: %w", err)
	}
	if o.NetNS != "" {
		fd, err := unix.Open(o.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("the lab's network namespace: %w", err)
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("joining the network namespace %s: %w", o.NetNS, err)
		}
	}
	if err := unix.Sethostname([]byte(o.Hostname)); err != nil {
		return err
	}
	root := filepath.Join(o.Dir, RunDir, "root")
	if err := assemble(o, root, hs); err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	// pivot_root with the old root stacked under the new one, then
	// detached: the squashfs has no folder to put it in.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := keepPowerLine(o.PowerFD); err != nil {
		return err
	}
	fmt.Printf("nsmachine: slot %s's root is ready; starting /sbin/init\n", o.Slot)
	env := []string{"container=liken-lab", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return unix.Exec("/sbin/init", []string{"/sbin/init"}, env)
}

// mount is unix.Mount with an error that names the mount.
func mount(src, dst, fstype string, flags uintptr, data string) error {
	if _, err := os.Lstat(dst); os.IsNotExist(err) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("the mount point %s: %w", dst, err)
		}
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, dst, err)
	}
	return nil
}

// bindReadOnly bind-mounts src on dst, read-only.
func bindReadOnly(src, dst string, extra uintptr) error {
	if err := mount(src, dst, "", unix.MS_BIND|extra, ""); err != nil {
		return err
	}
	return mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|extra&^unix.MS_REC, "")
}

// assemble mounts the machine's root on root.
func assemble(o InitOptions, root string, hs []hierarchy) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the machine's mounts private: %w", err)
	}
	run := filepath.Join(o.Dir, RunDir)
	image := filepath.Join(o.Dir, SlotsDir, "slots", string(o.Slot), "rootfs.squashfs")
	loop, release, err := loopdev.Attach(image)
	if err != nil {
		return fmt.Errorf("slot %s: %w", o.Slot, err)
	}
	err = mount(loop, root, "squashfs", unix.MS_RDONLY, "")
	release()
	if err != nil {
		return fmt.Errorf("slot %s's root: %w", o.Slot, err)
	}
	// This boot's memory: /etc's changes, and the files shown in /proc.
	mem := filepath.Join(run, "memory")
	if err := mount("tmpfs", mem, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"etc", "work", "proc"} {
		if err := os.MkdirAll(filepath.Join(mem, d), 0o755); err != nil {
			return err
		}
	}
	steps := []func() error{
		func() error {
			return mount("overlay", root+"/etc", "overlay", 0, "lowerdir="+root+"/etc,upperdir="+mem+"/etc,workdir="+mem+"/work")
		},
		func() error { return mount("tmpfs", root+"/var", "tmpfs", 0, "mode=0755") },
		func() error { return mount("tmpfs", root+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777") },
		func() error { return mount("tmpfs", root+"/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755") },
		func() error {
			return mount(filepath.Join(o.Dir, SlotsDir), root+"/var/lib/liken", "", unix.MS_BIND, "")
		},
		func() error {
			for dst, src := range boot.Persistent {
				src = filepath.Join(o.Dir, SlotsDir, src)
				if err := os.MkdirAll(src, 0o700); err != nil {
					return err
				}
				if err := mount(src, root+dst, "", unix.MS_BIND, ""); err != nil {
					return err
				}
			}
			return nil
		},
		func() error { return boot.SetMachineID(root, filepath.Join(o.Dir, SlotsDir)) },
		func() error { return mount(filepath.Join(o.Dir, BootDir), root+"/boot", "", unix.MS_BIND, "") },
		func() error { return bindReadOnly(filepath.Join(o.Dir, LayerDir), root+"/var/lib/liken-layer", 0) },
		func() error { return adaptKubelet(root, hs) },
		func() error { return adaptContainerd(root) },
		func() error { return adaptDNSPort(root) },
		func() error { return mountProc(root, run, mem) },
		func() error { return mountSys(root, hs) },
		func() error { return mountDev(root) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// mountProc mounts the machine's /proc, with the host's kernel out of
// reach.
func mountProc(root, run, mem string) error {
	proc := root + "/proc"
	if err := mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	files := map[string]string{
		proc + "/cmdline":                   filepath.Join(run, "cmdline"),
		proc + "/sys/kernel/random/boot_id": filepath.Join(run, "boot_id"),
		proc + "/sysrq-trigger":             "/dev/null",
	}
	for name, value := range KernelDefaults {
		file := filepath.Join(mem, "proc", filepath.Base(name))
		if err := os.WriteFile(file, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
		files[proc+"/sys/"+name] = file
	}
	for dst, src := range files {
		if _, err := os.Stat(dst); os.IsNotExist(err) {
			continue // a kernel without it (sysrq-trigger)
		}
		if err := bindReadOnly(src, dst, 0); err != nil {
			return err
		}
	}
	// The settings of the machine's own namespaces stay writable;
	// everything else under /proc/sys is the host's kernel.
	for _, name := range ownSettings {
		dir := proc + "/sys/" + name
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			continue
		}
		if err := mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	return bindReadOnly(proc+"/sys", proc+"/sys", unix.MS_REC)
}

// mountSys mounts the machine's /sys, read-only, with its cgroups: each
// hierarchy shows the machine's cgroup as its root (the cgroup namespace),
// writable, for systemd, the kubelet and containerd.
func mountSys(root string, hs []hierarchy) error {
	sys := root + "/sys"
	if err := mount("sysfs", sys, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	cg := sys + "/fs/cgroup"
	if err := mount("tmpfs", cg, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return err
	}
	for _, h := range hs {
		dst := filepath.Join(cg, filepath.Base(h.mountPoint))
		if h.mountPoint == "/sys/fs/cgroup" {
			dst = cg
		}
		opts := h.options
		if h.fstype == "cgroup2" {
			opts = ""
		}
		if err := mount("cgroup", dst, h.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			return err
		}
	}
	return nil
}

// mountDev makes the machine's /dev: the host's harmless devices, its own
// terminals, shared memory and message queues.
func mountDev(root string) error {
	dev := root + "/dev"
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return err
	}
	for _, d := range devices {
		if _, err := os.Stat("/dev/" + d); err != nil {
			continue
		}
		dst := filepath.Join(dev, d)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, nil, 0o666); err != nil {
			return err
		}
		if err := mount("/dev/"+d, dst, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := mount("tmpfs", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := mount("mqueue", dev+"/mqueue", "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for name, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

// keepPowerLine makes the image's init die with the process that started
// the machine. The parent-death signal Start asked for belongs to the
// first thread of this process, and this one (which execs the image's
// init) may be another: set it here, then read the power line, in case
// the parent ended before that. The line is closed before the exec.
func keepPowerLine(fd int) error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("the parent-death signal: %w", err)
	}
	if fd == 0 {
		return nil
	}
	defer unix.Close(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("the power line: %w", err)
	}
	var b [1]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return nil
	}
	if n == 0 && err == nil {
		return errors.New("the power is off: the process that started this machine has ended")
	}
	return fmt.Errorf("the power line: %w", err)
}

// kubeletConfig is the image's kubelet configuration, in the root.
const kubeletConfig = "/etc/kubernetes/kubelet.yaml"

// adaptKubelet lets the kubelet run on a host whose cgroups are v1 (or
// the hybrid layout): liken's own kernel gives the image cgroup v2, and
// the image's kubelet refuses v1, as it should on a real machine. The
// change goes to this boot's /etc, in memory.
func adaptKubelet(root string, hs []hierarchy) error {
	for _, h := range hs {
		if h.fstype == "cgroup2" && h.mountPoint == "/sys/fs/cgroup" {
			return nil
		}
	}
	f, err := os.OpenFile(root+kubeletConfig, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("the kubelet's configuration: %w", err)
	}
	_, err = f.WriteString("# Added by liken's namespace lab: the host's cgroups are v1.\nfailCgroupV1: false\n")
	return errors.Join(err, f.Close())
}

// The image's liken-dns port: a dummy link that holds the address where
// pods reach the machine's resolver.
const (
	dnsPortNetdev  = "/etc/systemd/network/04-liken-dns.netdev"
	dnsPortNetwork = "/etc/systemd/network/04-liken-dns.network"
)

// adaptDNSPort gives the machine resolver's address for pods a home on a
// host whose kernel makes no dummy links (built without them, and no
// module to load): the machine's loopback, where pods reach it as they
// reach any address of the machine. The image's network file for the
// liken-dns port then matches lo, in this boot's /etc, in memory.
func adaptDNSPort(root string) error {
	probe := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "liken-probe"}}
	err := netlink.LinkAdd(probe)
	switch {
	case err == nil:
		return netlink.LinkDel(probe)
	case !errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("trying a dummy link: %w", err)
	}
	b, err := os.ReadFile(root + dnsPortNetwork)
	if err != nil {
		return fmt.Errorf("the liken-dns port's network file: %w", err)
	}
	network := strings.Replace(string(b), "Name=liken-dns", "Name=lo", 1)
	if network == string(b) {
		return fmt.Errorf("%s matches no port named liken-dns", dnsPortNetwork)
	}
	network = "# Changed by liken's namespace lab: the host's kernel makes no dummy links.\n" + network
	if err := os.WriteFile(root+dnsPortNetwork, []byte(network), 0o644); err != nil {
		return err
	}
	return os.Remove(root + dnsPortNetdev)
}

// containerdConfig is the image's containerd configuration, in the root.
const containerdConfig = "/etc/containerd/config.toml"

// adaptContainerd lets containerd start pods on a host where even root
// cannot lower a process's OOM score (no CAP_SYS_RESOURCE in the host's
// bounding set, as in some sandboxes): every pod's sandbox asks for -998,
// and runc fails the pod when the write is refused. containerd then keeps
// each container's score at or above its own. The change goes to this
// boot's /etc, in memory.
func adaptContainerd(root string) error {
	var caps unix.CapUserData
	if err := unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_1}, &caps); err != nil {
		return fmt.Errorf("reading this process's capabilities: %w", err)
	}
	if caps.Effective&(1<<unix.CAP_SYS_RESOURCE) != 0 {
		return nil
	}
	f, err := os.OpenFile(root+containerdConfig, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("containerd's configuration: %w", err)
	}
	_, err = f.WriteString("\n# Added by liken's namespace lab: the host refuses to lower OOM scores.\n" +
		"[plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n")
	return errors.Join(err, f.Close())
}
