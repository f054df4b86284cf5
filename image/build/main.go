// Command build builds liken's OS image (make image): a Debian kernel, liken's initramfs, and a read-only squashfs root with systemd, the node agent and liken-node.
//
// It writes to --out (default _output/image):
//
//	rootfs.squashfs  the root file system, whose /etc/liken/release names --version
//	vmlinuz          the kernel
//	initrd.img       the initramfs: liken-boot and the modules it needs
//	packages.txt     every Debian package and built component, with its version
//
// `liken release rootfs.squashfs --version V --artifact boot/vmlinuz=vmlinuz
// --artifact boot/initrd.img=initrd.img --artifact packages.txt=packages.txt`
// publishes it. Slow steps are cached under --cache: the Debian root (per
// package list), the node agent (per version); liken's own binaries are
// rebuilt every time. Building needs root (mmdebstrap, file ownership),
// mmdebstrap, squashfs-tools, gcc and libseccomp-dev (runc).
package main

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"liken.sh/liken/image"
	"liken.sh/liken/image/debian"
	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/image/oci"
	"liken.sh/liken/manifests"
)

// Versions of what goes into the image. kubelet is the version the
// project's control plane is pinned to (hack/kube).
const (
	suite              = "bookworm"
	kubeVersion        = "v1.37.2"
	etcdVersion        = "v3.7.0" // as hack/kube/go.mod pins it
	containerdVersion  = "v2.2.9"
	runcVersion        = "v1.3.3"
	cniPluginsVersion  = "v1.10.0"
	corednsVersion     = "v1.15.0" // as hack/coredns/go.mod pins it
	pauseImage         = "liken.sh/pause:3.10"
	workloadImage      = "liken.sh/workload:1.0"
	squashfsCompressor = "zstd"
)

// debianPackages are installed with mmdebstrap's minbase variant.
var debianPackages = []string{
	"systemd-sysv", "udev", "dbus", "kmod", "iproute2", "iptables", "systemd-timesyncd",
	// nft: kube-proxy's nftables mode writes its rules with it.
	"nftables",
	// The machine's resolver, and the public CAs it trusts (an https
	// release channel or registry by name).
	"systemd-resolved", "ca-certificates",
	"linux-image-cloud-amd64",
	// e2fsck.static, which liken-boot runs from the initramfs on the
	// boot partition before mounting it.
	"e2fsck-static",
}

// initramfsModules are the kernel modules liken-boot loads, in this order:
// the watchdog that ends a hung trial first (liken-boot arms it before
// the rest load), then the disk, its file systems, the loop device and
// squashfs for the root, overlay for /etc.
var initramfsModules = []string{"softdog", "virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4", "loop", "squashfs", "overlay"}

// units are the systemd units enabled in the image.
// The control plane's units start only on a leader, whose layer partition
// holds leader/config.yaml (docs/design/controlplane.md).
var units = []string{"liken-machine.service", "liken-kernel-log.service", "containerd.service", "kubelet.service", "kube-proxy.path", "liken-node.service", "systemd-networkd.service", "systemd-resolved.service", "systemd-timesyncd.service",
	"liken-control-plane-setup.service", "etcd.service", "kube-apiserver.service", "kube-controller-manager.service", "kube-scheduler.service", "liken-control-plane-init.service"}

// caBundle is the public CAs' bundle that Debian's ca-certificates writes,
// where Go programs look first.
const caBundle = "etc/ssl/certs/ca-certificates.crt"

//go:embed all:rootfs
var rootfs embed.FS

type builder struct {
	repo, out, cache, version string
	// likenVersion is liken-node's version (git describe).
	likenVersion string
	start        time.Time
}

func main() {
	var b builder
	flag.StringVar(&b.out, "out", "_output/image", "folder the image is written to")
	flag.StringVar(&b.cache, "cache", "", "folder of the cached Debian root and node agent (default: <out>/cache)")
	flag.StringVar(&b.version, "version", "", "the release version the image reports in /etc/liken/release, YYYY.MM.DD-NNN (required)")
	flag.Parse()
	if err := b.run(); err != nil {
		fmt.Fprintf(os.Stderr, "make image: %v\n", err)
		os.Exit(1)
	}
}

func (b *builder) step(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *builder) run() error {
	b.start = time.Now()
	if b.version == "" {
		return errors.New("--version is missing: the release version the image reports, such as 2026.12.01-001")
	}
	if os.Geteuid() != 0 {
		return errors.New("building the image needs root: mmdebstrap installs Debian's packages and the root's files belong to root")
	}
	var err error
	if b.repo, err = os.Getwd(); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(b.repo, "hack", "kube", "go.mod")); err != nil {
		return errors.New("run it from liken's repository (make image)")
	}
	if b.out, err = filepath.Abs(b.out); err != nil {
		return err
	}
	if b.cache == "" {
		b.cache = filepath.Join(b.out, "cache")
	}
	if err := os.MkdirAll(b.cache, 0o755); err != nil {
		return err
	}
	agent, err := b.agent()
	if err != nil {
		return err
	}
	own, err := b.ownBinaries()
	if err != nil {
		return err
	}
	tarball, err := b.debianRoot()
	if err != nil {
		return err
	}
	work := filepath.Join(b.out, "work")
	root := filepath.Join(work, "root")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	b.step("Unpacking the Debian root")
	if err := run("", "tar", "-C", root, "-xf", tarball); err != nil {
		return err
	}
	kernel, modulesDir, err := takeKernel(root, work)
	if err != nil {
		return err
	}
	b.step("Kernel %s", filepath.Base(modulesDir))
	if err := b.customize(root, agent, own); err != nil {
		return err
	}
	packages, err := b.packageList(root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.out, 0o755); err != nil {
		return err
	}
	for _, f := range image.Files {
		if err := os.Remove(filepath.Join(b.out, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	b.step("Writing the initramfs")
	mods, err := initramfs.ResolveModules(modulesDir, initramfsModules)
	if err != nil {
		return err
	}
	a := initramfs.New()
	init, err := os.ReadFile(own["liken-boot"])
	if err != nil {
		return err
	}
	a.File("init", 0o755, init)
	e2fsck, err := os.ReadFile(filepath.Join(root, "sbin", "e2fsck.static"))
	if err != nil {
		return fmt.Errorf("liken-boot checks the boot partition with Debian's e2fsck-static: %w", err)
	}
	a.Dir("sbin")
	a.File("sbin/e2fsck", 0o755, e2fsck)
	if err := a.Modules(mods); err != nil {
		return err
	}
	initrd, err := a.Gzip()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.out, image.Initramfs), initrd, 0o644); err != nil {
		return err
	}
	if err := os.Rename(kernel, filepath.Join(b.out, image.Kernel)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.out, image.Packages), packages, 0o644); err != nil {
		return err
	}
	b.step("Compressing the root into rootfs.squashfs (%s)", squashfsCompressor)
	squash := filepath.Join(b.out, image.RootFS)
	if err := run("", "mksquashfs", root, squash+".tmp", "-noappend", "-comp", squashfsCompressor, "-quiet", "-no-progress"); err != nil {
		return err
	}
	if err := os.Rename(squash+".tmp", squash); err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	for _, f := range image.Files {
		st, err := os.Stat(filepath.Join(b.out, f))
		if err != nil {
			return err
		}
		b.step("%s: %.1f MiB", filepath.Join(b.out, f), float64(st.Size())/(1<<20))
	}
	b.step("Image %s built. Publish it with:\n  liken release %s --channel DIR --version %s --artifact %s",
		b.version, squash, b.version, strings.Join(image.ArtifactFlags(b.out), " --artifact "))
	return nil
}

// sourceDigest is the first 12 hex digits of the SHA-256 of the agent's
// binaries' names and dir's Go sources and module files: the agent is
// built again when a binary is added or hack/kube's multi-call binary
// changes (a component added), as make build does.
func sourceDigest(dir string, names []string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", err
	}
	files = append(files, filepath.Join(dir, "go.mod"), filepath.Join(dir, "go.sum"))
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", strings.Join(names, " "))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// agent builds the node agent (kubelet, containerd, runc, CNI plugins)
// into the cache, once per set of versions, and returns each binary's path
// by name.
func (b *builder) agent() (map[string]string, error) {
	names := []string{"kubelet", "kube", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "bridge", "host-local", "loopback", "portmap", "coredns"}
	src, err := sourceDigest(filepath.Join(b.repo, "hack", "kube"), names)
	if err != nil {
		return nil, err
	}
	dns, err := sourceDigest(filepath.Join(b.repo, "hack", "coredns"), nil)
	if err != nil {
		return nil, err
	}
	key := strings.Join([]string{kubeVersion, etcdVersion, containerdVersion, runcVersion, cniPluginsVersion, corednsVersion, src, dns}, "-")
	dir := filepath.Join(b.cache, "agent-"+key)
	bins := map[string]string{}
	for _, n := range names {
		bins[n] = filepath.Join(dir, n)
	}
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		b.step("Node agent %s: cached in %s", key, dir)
		return bins, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	env := []string{"GOBIN=" + dir, "GOFLAGS=-mod=mod"}
	b.step("Building kubelet %s from the sources pinned in hack/kube (minutes, once)", kubeVersion)
	minor := strings.Split(strings.TrimPrefix(kubeVersion, "v"), ".")[1]
	ldflags := "-s -w -X k8s.io/component-base/version.gitVersion=" + kubeVersion +
		" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=" + minor +
		" -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.gitCommit=liken-pinned"
	if err := runEnv(filepath.Join(b.repo, "hack", "kube"), nil, "go", "build", "-ldflags", ldflags, "-o", bins["kubelet"], "k8s.io/kubernetes/cmd/kubelet"); err != nil {
		return nil, err
	}
	// The leader's control plane: hack/kube's multi-call binary (etcd,
	// kube-apiserver, kube-controller-manager, kube-scheduler) without
	// kwok, built as make build builds it, so its packages come from the
	// same build cache.
	b.step("Building the control plane (etcd %s, Kubernetes %s) from hack/kube", etcdVersion, kubeVersion)
	kubeLdflags := ldflags + " -X k8s.io/client-go/pkg/version.gitVersion=" + kubeVersion +
		" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=" + minor
	if err := runEnv(filepath.Join(b.repo, "hack", "kube"), nil, "go", "build", "-tags", "nokwok", "-ldflags", kubeLdflags, "-o", bins["kube"], "."); err != nil {
		return nil, err
	}
	b.step("Building containerd %s", containerdVersion)
	var pkgs []string
	for _, c := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		pkgs = append(pkgs, "github.com/containerd/containerd/v2/cmd/"+c+"@"+containerdVersion)
	}
	if err := runEnv("", append(env, "CGO_ENABLED=0"), "go", append([]string{"install", "-tags", "no_btrfs", "-ldflags", "-s -w -X github.com/containerd/containerd/v2/version.Version=" + containerdVersion}, pkgs...)...); err != nil {
		return nil, err
	}
	b.step("Building the CNI plugins %s", cniPluginsVersion)
	pkgs = nil
	for _, p := range []string{"main/bridge", "ipam/host-local", "main/loopback", "meta/portmap"} {
		pkgs = append(pkgs, "github.com/containernetworking/plugins/plugins/"+p+"@"+cniPluginsVersion)
	}
	if err := runEnv("", append(env, "CGO_ENABLED=0"), "go", append([]string{"install", "-ldflags", "-s -w"}, pkgs...)...); err != nil {
		return nil, err
	}
	// CoreDNS from hack/coredns, a module of its own: its requirements
	// never move the control plane's.
	b.step("Building CoreDNS %s from hack/coredns", corednsVersion)
	if err := runEnv(filepath.Join(b.repo, "hack", "coredns"), []string{"CGO_ENABLED=0"}, "go", "build", "-ldflags", "-s -w", "-o", bins["coredns"], "."); err != nil {
		return nil, err
	}
	b.step("Building runc %s (static, with seccomp)", runcVersion)
	if err := b.runc(bins["runc"]); err != nil {
		return nil, err
	}
	return bins, os.WriteFile(filepath.Join(dir, ".done"), []byte(key+"\n"), 0o644)
}

// runc builds runc from a copy of its module: its go.mod replaces a module
// with a folder its module archive lacks, so go install refuses it.
func (b *builder) runc(out string) error {
	src, err := exec.Command("go", "mod", "download", "-json", "github.com/opencontainers/runc@"+runcVersion).Output()
	if err != nil {
		return fmt.Errorf("downloading runc %s: %w", runcVersion, err)
	}
	var dir string
	for _, l := range strings.Split(string(src), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), `"Dir": "`); ok {
			dir = strings.TrimSuffix(v, `",`)
		}
	}
	if dir == "" {
		return fmt.Errorf("go mod download gave no folder for runc %s", runcVersion)
	}
	work, err := os.MkdirTemp("", "liken-runc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := run("", "cp", "-r", dir+"/.", work); err != nil {
		return err
	}
	if err := run("", "chmod", "-R", "u+w", work); err != nil {
		return err
	}
	if err := run(work, "go", "mod", "edit", "-dropreplace", "github.com/opencontainers/selinux"); err != nil {
		return err
	}
	return runEnv(work, []string{"CGO_ENABLED=1"}, "go", "build", "-mod=mod", "-trimpath", "-tags", "seccomp netgo osusergo",
		"-ldflags", "-s -w -X main.version="+strings.TrimPrefix(runcVersion, "v")+" -extldflags -static", "-o", out, ".")
}

// ownBinaries builds liken-node, liken-boot and the preloaded images'
// programs, and returns their paths by name. liken-node is built as make
// build builds it (sharing its build cache; the root has the C library);
// the others run where there is no C library (the initramfs, containers)
// and are static.
func (b *builder) ownBinaries() (map[string]string, error) {
	dir := filepath.Join(b.cache, "liken")
	bins := map[string]string{}
	b.step("Building liken-node, liken-boot, cluster-operator, pause and workload")
	version, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
	b.likenVersion = strings.TrimSpace(string(version))
	ldflags := "-X liken.sh/liken/version.Version=" + b.likenVersion
	for _, p := range []struct {
		name, pkg string
		static    bool
	}{
		{"liken-node", "./node/cmd/liken-node", false},
		{"liken-boot", "./node/cmd/liken-boot", true},
		{"cluster-operator", "./controllers/cmd/cluster-operator", true},
		{"pause", "./image/containers/pause", true},
		{"workload", "./image/containers/workload", true},
	} {
		bins[p.name] = filepath.Join(dir, p.name)
		var env []string
		flags := ldflags
		if p.static {
			// Small: GRUB reads the initramfs through the BIOS.
			env, flags = []string{"CGO_ENABLED=0"}, "-s -w "+ldflags
		}
		if err := runEnv(b.repo, env, "go", "build", "-ldflags", flags, "-o", bins[p.name], p.pkg); err != nil {
			return nil, err
		}
	}
	return bins, nil
}

// debianRoot returns the Debian root tarball, building it with mmdebstrap
// when the cache has none for this package list.
func (b *builder) debianRoot() (string, error) {
	return debian.Root(b.cache, suite, debianPackages, []string{
		// Debian's initramfs is not used: liken's is built from liken-boot.
		`chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs && ln -s /bin/true "$1/usr/sbin/update-initramfs"`,
	}, b.step)
}

// takeKernel moves the kernel out of the root's /boot and returns it with
// the root's modules folder.
func takeKernel(root, work string) (kernel, modulesDir string, err error) {
	matches, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(matches) != 1 {
		return "", "", fmt.Errorf("the Debian root holds %d kernels, want 1", len(matches))
	}
	ver := strings.TrimPrefix(filepath.Base(matches[0]), "vmlinuz-")
	kernel = filepath.Join(work, image.Kernel)
	if err := os.Rename(matches[0], kernel); err != nil {
		return "", "", err
	}
	// /boot is where the boot partition is mounted.
	entries, _ := os.ReadDir(filepath.Join(root, "boot"))
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, "boot", e.Name())); err != nil {
			return "", "", err
		}
	}
	for _, l := range []string{"vmlinuz", "vmlinuz.old", "initrd.img", "initrd.img.old"} {
		_ = os.Remove(filepath.Join(root, l))
	}
	return kernel, filepath.Join(root, "usr", "lib", "modules", ver), nil
}

// customize puts liken's files, the node agent and the preloaded images
// into the root, and enables the services.
func (b *builder) customize(root string, agent, own map[string]string) error {
	b.step("Adding liken-node, the node agent, the preloaded images and the services")
	err := fs.WalkDir(rootfs, "rootfs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(root, strings.TrimPrefix(p, "rootfs"))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		data, err := rootfs.ReadFile(p)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "rootfs/usr/lib/liken/") {
			mode = 0o755
		}
		return os.WriteFile(dst, data, mode)
	})
	if err != nil {
		return err
	}
	install := map[string]string{
		"usr/bin/kubelet": agent["kubelet"], "usr/bin/kube": agent["kube"], "usr/bin/containerd": agent["containerd"],
		"usr/bin/containerd-shim-runc-v2": agent["containerd-shim-runc-v2"], "usr/bin/ctr": agent["ctr"],
		"usr/bin/runc": agent["runc"], "opt/cni/bin/bridge": agent["bridge"],
		"opt/cni/bin/host-local": agent["host-local"], "opt/cni/bin/loopback": agent["loopback"], "opt/cni/bin/portmap": agent["portmap"],
		"usr/bin/liken-node": own["liken-node"],
	}
	for dst, src := range install {
		if err := copyFile(src, filepath.Join(root, dst), 0o755); err != nil {
			return err
		}
	}
	images := filepath.Join(root, "usr", "share", "liken", "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return err
	}
	operator, err := manifests.OperatorDeployment()
	if err != nil {
		return err
	}
	coredns, err := manifests.DNSDeployment()
	if err != nil {
		return err
	}
	// The public CAs, which cluster-operator reads an https channel with.
	cas, err := os.ReadFile(filepath.Join(root, caBundle))
	if err != nil {
		return fmt.Errorf("the root's CA bundle (ca-certificates): %w", err)
	}
	for _, img := range []struct {
		name, file, bin, user string
		data                  map[string][]byte
	}{
		{name: pauseImage, file: "pause.tar", bin: own["pause"]},
		{name: workloadImage, file: "workload.tar", bin: own["workload"]},
		// The names manifests/ gives them; a user that is not root, as
		// their Deployments require.
		{name: operator.Spec.Template.Spec.Containers[0].Image, file: "cluster-operator.tar", bin: own["cluster-operator"], user: "65532:65532",
			data: map[string][]byte{caBundle: cas}},
		{name: coredns.Spec.Template.Spec.Containers[0].Image, file: "coredns.tar", bin: agent["coredns"], user: "65532:65532"},
	} {
		bin, err := os.ReadFile(img.bin)
		if err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(images, img.file))
		if err != nil {
			return err
		}
		entry := "/" + filepath.Base(img.bin)
		werr := oci.Image{Name: img.name, Files: map[string][]byte{entry[1:]: bin}, Data: img.data, Entrypoint: []string{entry}, User: img.user}.Write(f)
		if err := errors.Join(werr, f.Close()); err != nil {
			return err
		}
	}
	for _, d := range []string{"var/lib/kubelet", "var/lib/containerd", "var/lib/etcd", "var/lib/liken", "var/lib/liken-layer"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		image.ReleaseFile: image.ReleaseFileContent(b.version),
		"etc/hostname":    "liken\n",
		// liken-boot writes the machine's own, kept on the slot store
		// (boot.MachineIDFile).
		"etc/machine-id": "",
		"etc/fstab":      "# liken-boot mounts every file system before systemd starts.\n",
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			return err
		}
		_ = os.Remove(filepath.Join(root, p))
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// Programs read names through the machine's resolver (its stub at
	// 127.0.0.53 with the servers it was given).
	_ = os.Remove(filepath.Join(root, "etc/resolv.conf"))
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(root, "etc/resolv.conf")); err != nil {
		return err
	}
	// The root's own systemctl, so the host needs none.
	if err := run("", "chroot", append([]string{root, "systemctl", "enable", "--quiet"}, units...)...); err != nil {
		return err
	}
	// The disk's partitions are mounted by liken-boot alone: systemd's
	// GPT generator must never mount the EFI system partition on /boot or
	// /efi (it would when a boot loader tells it the disk through UEFI).
	gen := filepath.Join(root, "etc/systemd/system-generators")
	if err := os.MkdirAll(gen, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/dev/null", filepath.Join(gen, "systemd-gpt-auto-generator")); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// No login: a machine offers no getty on any terminal. Masking
	// getty.target also stops what systemd's generator adds to it (a
	// serial getty on the kernel's console, a container's console getty);
	// the kernel and systemd still write their messages to the console.
	return run("", "chroot", append([]string{root, "systemctl", "mask", "--quiet"}, noLogin...)...)
}

// noLogin are the units masked so that no terminal offers a login.
var noLogin = []string{"getty.target", "getty@.service", "autovt@.service", "serial-getty@.service", "console-getty.service", "container-getty@.service"}

// packageList lists the Debian packages of the root and the components
// built from source, with their versions.
func (b *builder) packageList(root string) ([]byte, error) {
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f", "${Package} ${Version}\n").Output()
	if err != nil {
		return nil, fmt.Errorf("listing the root's packages: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, l := range []string{
		"kubelet " + kubeVersion, "kube-apiserver " + kubeVersion, "kube-controller-manager " + kubeVersion, "kube-scheduler " + kubeVersion,
		"etcd " + etcdVersion, "containerd " + containerdVersion, "runc " + runcVersion, "cni-plugins " + cniPluginsVersion, "coredns " + corednsVersion,
		"liken-node " + b.likenVersion,
	} {
		lines = append(lines, "built:"+l)
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n") + "\n"), nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}

func run(dir, name string, args ...string) error { return runEnv(dir, nil, name, args...) }

func runEnv(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}
