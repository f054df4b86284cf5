// Package install holds liken install: write a machine's disk (an image file or a block device) with slot A, the boot partition and the deployment layer.
package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/boot/diskimage"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/join"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// The disk layout liken install writes (docs/guides/install.md): a GPT
// disk that boots from BIOS and from UEFI. Sizes and offsets are in
// bytes; every partition but the BIOS boot partition starts on a MiB.
const (
	mib = 1 << 20
	// BootLabel, LayerLabel and SlotsLabel are the file system labels of
	// the boot partition (1), the layer partition (2) and the slot store
	// partition (3), by which GRUB (the boot partition) and the machine's
	// initramfs find them.
	BootLabel  = "liken-boot"
	LayerLabel = "liken-layer"
	SlotsLabel = "liken-slots"
	// BootSize, LayerSize and ESPSize are the sizes of the boot, the
	// layer and the EFI system partitions; the slot store takes the rest
	// of the disk.
	BootSize  = 256 * mib
	LayerSize = 64 * mib
	ESPSize   = 64 * mib
	// ESPLabel is the EFI system partition's FAT label.
	ESPLabel = "LIKEN-EFI"
	// EFIBootFile is GRUB's EFI image on the EFI system partition: the
	// path UEFI firmware boots from a disk without a boot entry of its own.
	EFIBootFile = "EFI/BOOT/BOOTX64.EFI"
	// bootBlock is the boot partition's block size: each copy of the
	// GRUB environment is then exactly one block, which GRUB's save_env
	// rewrites in place.
	bootBlock = 1024
	// LayerFile and MachineFile are the files of the layer partition: the
	// deployment layer, and the name of the machine the disk is for.
	LayerFile   = "layer.tgz"
	MachineFile = "machine"
	// MachineDocFile is the machine's own Machine document from the layer,
	// which liken-node holds the API's Machine against (its LayerMatches
	// condition: the role and ports the machine boots with).
	MachineDocFile = "machine.yaml"
	// BootstrapFile is the kubeconfig the machine's kubelet and liken-node
	// join with: the Cluster's endpoint, the server CA and the bootstrap
	// token of the layer's join token.
	BootstrapFile = "bootstrap.kubeconfig"
	// ClientCAFile is the identity's client CA certificate, which the
	// kubelet checks callers' certificates against: the API server's, for
	// kubectl logs and exec.
	ClientCAFile = "client-ca.crt"
	// LeaderDir is a Leader's folder on the layer partition (mode 0700,
	// files 0600): controlplane.ConfigFile, the control plane's
	// configuration, and controlplane.IdentityDir, the cluster identity
	// unpacked. A Worker's disk has none.
	LeaderDir = "leader"
	// NetworkDir holds the Machine's ports as systemd-networkd files
	// (changes.PortNetwork), which the machine's setup puts in place
	// before its network starts: its static addresses apply before it
	// joins.
	NetworkDir = "network"
)

// NewCommand returns liken install.
func NewCommand() *cobra.Command {
	var o Options
	var size string
	cmd := &cobra.Command{
		Use:   "install --disk PATH --release URL|DIR --layer layer.tgz --machine NAME",
		Short: "Write a machine's disk: GRUB, slot A with a release, and the deployment layer",
		Long: `Write a liken machine's disk: an image file (created or resized) or a block
device (all of it is overwritten). The disk gets a GPT partition table
and boots from UEFI (GRUB on an EFI system partition) and from BIOS (GRUB
in a BIOS boot partition) alike, a boot partition (grub.cfg, the boot state with slot A
proven, and slot A's kernel and initramfs), the deployment layer (a
worker's without the identity's private keys: it joins with the token and
never signs) and the name of the machine, and the slot store: slot A holds the release, slot B
is empty until the first upgrade. A leader's layer partition also gets
leader/: its control plane's configuration (config.yaml: the Cluster's
endpoint and service range, and how every leader is reached) and the
cluster identity, unpacked.

The release must be one the layer's Cluster catalogues: its release.yaml is
checked against the catalog digest, and every artifact against release.yaml,
before a byte is written to the disk. The machine must be in the layer.
liken install refuses a disk that is mounted, used as swap, held by the
device mapper, RAID or LVM, opened exclusively by another program, or an
image file attached to a loop device.

GRUB comes from this computer (grub-mkimage, /usr/lib/grub/i386-pc and
/usr/lib/grub/x86_64-efi, from Debian's grub-pc-bin and grub-efi-amd64-bin)
or, when it has either build missing, is fetched with apt-get download and
unpacked under the user's cache folder. Writing the partitions needs
mke2fs (e2fsprogs) and no root, except for the permission to write a block
device.`,
		Example: `  # A disk image for a virtual machine
  liken install --disk node-1.img --release /srv/liken/2026.10.12-001 --layer layer.tgz --machine node-1

  # A real disk, from a channel on the web
  liken install --disk /dev/sdb --release https://releases.example.com/2026.10.12-001/ --layer layer.tgz --machine node-2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size != "" {
				q, err := resource.ParseQuantity(size)
				if err != nil || q.Value() <= 0 {
					return fmt.Errorf("--size %q: give a size such as 4Gi or 8G", size)
				}
				o.Size = q.Value()
			}
			o.Progress = cmd.ErrOrStderr()
			res, err := Install(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s (%s) for machine %s: slot A holds release %s, slot B is empty.\n",
				o.Disk, cmdutil.HumanBytes(res.Size), o.Machine, res.Version)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Disk, "disk", "", "The disk to write: an image file (created if missing) or a block device such as /dev/sdb. Everything on it is lost.")
	f.StringVar(&o.Release, "release", "", "The release for slot A: the URL of its folder on a channel (or of its release.yaml), or a local release folder.")
	f.StringVar(&o.Layer, "layer", "", "The deployment layer (liken layer pack), holding the Cluster that catalogues the release and the machine.")
	f.StringVar(&o.Machine, "machine", "", "The machine this disk is for: a Machine in the layer.")
	f.StringVar(&size, "size", "", "Size of an image file, such as 8Gi. Default: room for two releases of this size. Not for a block device.")
	for _, n := range []string{"disk", "release", "layer", "machine"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

// Options say what to write where.
type Options struct {
	// Disk is the image file or block device.
	Disk string
	// Folder, set instead of Disk, receives the three partitions' content
	// as folders named by their labels (liken-boot, liken-layer,
	// liken-slots): the disk of a lab machine whose OS runs in Linux
	// namespaces. It must not exist; it appears only once complete.
	Folder string
	// Release is the release for slot A: a URL or a local folder.
	Release string
	// Layer is the deployment layer file.
	Layer string
	// Machine is the machine's name.
	Machine string
	// Size is the size of an image file; 0 picks one.
	Size int64
	// Progress receives a line per step; nil discards them.
	Progress io.Writer
	// GRUB is GRUB's boot.img and core image; nil finds GRUB on the host
	// or fetches it (diskimage.FindGRUB).
	GRUB *BootCode
	// HTTPClient downloads a release given by URL; nil uses a default.
	HTTPClient *http.Client
	// TempDir is where the partitions' content is assembled; "" is the
	// system's temporary folder.
	TempDir string
	// ExternalControlPlane is for tests only: it leaves LeaderDir off a
	// Leader's disk, so that the Leader runs no control plane of its own
	// and joins one that runs on the host.
	ExternalControlPlane bool

	host host // the machine's view of mounts and devices; zero is the real one
}

// BootCode is GRUB for BIOS and UEFI (BootCodeOf).
type BootCode struct {
	// BootImg is GRUB's boot.img (512 bytes).
	BootImg []byte
	// CoreImg is the BIOS core image, which finds the boot partition by
	// its label (BootLabel).
	CoreImg []byte
	// EFIImg is GRUB's EFI image (EFIBootFile), which finds the boot
	// partition the same way.
	EFIImg []byte
}

// BootCodeOf builds the boot code of liken's disks from g: both images
// find the boot partition by BootLabel and read grub.cfg from its grub
// folder (mounted at /boot, that is /boot/grub, liken-node's --boot-dir).
func BootCodeOf(g diskimage.GRUB) (*BootCode, error) {
	bootImg, err := g.BootImage()
	if err != nil {
		return nil, err
	}
	core, err := g.CoreImageFor(BootLabel)
	if err != nil {
		return nil, err
	}
	efi, err := g.EFIImageFor(BootLabel)
	if err != nil {
		return nil, err
	}
	return &BootCode{BootImg: bootImg, CoreImg: core, EFIImg: efi}, nil
}

// Result describes a written disk.
type Result struct {
	// Version is the release in slot A.
	Version string
	// Size is the disk's size in bytes.
	Size int64
	// Partitions are the GPT's entries: boot, layer, slot store, BIOS
	// boot, EFI system (Part* name their indexes).
	Partitions []diskimage.GPTPartition
}

// Install writes the disk (see the command's help). It checks everything
// it can (layer, machine, release and catalog, the disk not in use) before
// it writes to the disk.
func Install(ctx context.Context, o Options) (_ *Result, err error) {
	start := time.Now()
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	step := func(format string, args ...any) {
		fmt.Fprintf(progress, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	dest := o.Disk
	if o.Folder != "" {
		if o.Disk != "" {
			return nil, errors.New("give a disk or a folder, not both")
		}
		if _, err := os.Lstat(o.Folder); err == nil {
			return nil, fmt.Errorf("%s already exists: a machine's folder is written new, so that nothing on it is lost", o.Folder)
		}
		dest = o.Folder
	}
	for flag, v := range map[string]string{"--disk": dest, "--release": o.Release, "--layer": o.Layer, "--machine": o.Machine} {
		if v == "" {
			return nil, fmt.Errorf("%s is missing", flag)
		}
	}

	// 1. The layer and the machine.
	lay, err := layer.ReadFile(o.Layer, layer.DefaultLimits)
	if err != nil {
		return nil, fmt.Errorf("reading the layer %s: %w", o.Layer, err)
	}
	if lay.Machine(o.Machine) == nil {
		var names []string
		for _, d := range lay.Machines {
			names = append(names, d.Name)
		}
		return nil, fmt.Errorf("machine %q is not in the layer %s (it holds %s): add its Machine to the layer with liken layer pack, or pick one of those names",
			o.Machine, o.Layer, listOrNone(names))
	}
	cluster := lay.Cluster.Cluster
	keys := "the identity's private keys, as a leader's disk carries them"
	var leader *controlplane.Config
	if lay.Machine(o.Machine).Spec.Role != v1alpha1.RoleLeader {
		keys = "no private keys: a worker's disk carries only the certificates and the join token"
	} else if !o.ExternalControlPlane {
		cfg, err := lay.ControlPlaneConfig(o.Machine)
		if err != nil {
			return nil, fmt.Errorf("the layer %s: %w", o.Layer, err)
		}
		leader = &cfg
		keys += ", and its control plane's configuration"
	}
	step("Layer %s: Cluster %s, machine %s (%s)", o.Layer, cluster.Name, o.Machine, keys)

	// 2. The release, against the Cluster's catalog.
	ref := o.Release
	if isURL(ref) && !strings.HasSuffix(ref, ".yaml") {
		ref = strings.TrimSuffix(ref, "/") + "/" + release.DocumentName
	}
	client := o.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Minute}
	}
	digest, doc, err := release.DigestOf(ctx, client, ref)
	if err != nil {
		return nil, fmt.Errorf("reading the release document %s: %w", ref, err)
	}
	target := release.Target{Version: doc.Version, Digest: digest}
	if err := catalogued(cluster, target, o.Release); err != nil {
		return nil, err
	}
	step("Release %s (%s) is in Cluster %s's catalog with this digest", doc.Version, cmdutil.HumanBytes(doc.TotalSize()), cluster.Name)

	if o.Folder != "" {
		return installFolder(ctx, o, step, client, ref, target, doc, lay, leader)
	}

	// 3. The disk: not in use, big enough.
	d, err := o.host.openDisk(o.Disk)
	if err != nil {
		return nil, err
	}
	defer func() {
		d.Close()
		if err != nil && d.created {
			os.Remove(d.path)
		}
	}()
	minSize := minDiskSize(doc.TotalSize())
	size := d.size
	switch {
	case d.device && o.Size != 0:
		return nil, fmt.Errorf("--size is for an image file; %s is a block device of %s", o.Disk, cmdutil.HumanBytes(d.size))
	case d.device && d.size < minSize:
		return nil, fmt.Errorf("%s holds %s; a machine with release %s needs at least %s (room for two releases)", o.Disk, cmdutil.HumanBytes(d.size), doc.Version, cmdutil.HumanBytes(minSize))
	case !d.device && o.Size == 0:
		size = minSize
	case !d.device && o.Size < minSize:
		return nil, fmt.Errorf("--size %s is too small: a machine with release %s needs at least %s (room for two releases)", cmdutil.HumanBytes(o.Size), doc.Version, cmdutil.HumanBytes(minSize))
	case !d.device:
		size = o.Size
	}
	parts, err := layout(size)
	if err != nil {
		return nil, err
	}
	step("Disk %s: %s %s, not in use", o.Disk, diskKind(d.device), cmdutil.HumanBytes(size))

	// 4. GRUB.
	code := o.GRUB
	if code == nil {
		if code, err = findBootCode(func(f string, a ...any) { step(f, a...) }); err != nil {
			return nil, err
		}
	}

	// 5. The partitions' content, verified, in a temporary folder.
	work, err := os.MkdirTemp(o.TempDir, "liken-install-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	trees, err := writeTrees(ctx, o, step, client, ref, target, doc, lay, leader, work)
	if err != nil {
		return nil, err
	}

	// 6. The disk. The boot sector comes last, after it is wiped first: a
	// disk whose writing stopped half-way does not boot.
	step("Writing the disk")
	if err := d.prepare(size); err != nil {
		return nil, err
	}
	// mke2fs opens a block device exclusively itself, and refuses a
	// mounted one: the disk stays closed while it runs.
	if err := d.Close(); err != nil {
		return nil, err
	}
	fss := []diskimage.FS{
		{Type: "ext2", Label: BootLabel, BlockSize: bootBlock, Tree: trees[BootLabel]},
		{Type: "ext4", Label: LayerLabel, Tree: trees[LayerLabel]},
		{Type: "ext4", Label: SlotsLabel, Tree: trees[SlotsLabel]},
	}
	for i := range fss {
		fs := &fss[i]
		fs.Offset, fs.Size = partBytes(parts.Partitions[i])
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		content, _ := treeSize(fs.Tree)
		step("Partition %d of %d, %s: %s file system of %s holding %s", i+1, len(fss), fs.Label, fs.Type, cmdutil.HumanBytes(fs.Size), cmdutil.HumanBytes(content))
		if err := fs.Make(d.path); err != nil {
			return nil, fmt.Errorf("writing partition %d (%s) of %s: %w", i+1, fs.Label, o.Disk, err)
		}
	}
	if err := d.reopen(); err != nil {
		return nil, err
	}
	espAt, espSize := partBytes(parts.Partitions[PartESP])
	step("Partition %d, the EFI system partition: FAT32 of %s holding GRUB for UEFI (%s)", PartESP+1, cmdutil.HumanBytes(espSize), EFIBootFile)
	if err := diskimage.WriteFAT32(d.f, espAt, espSize, ESPLabel, map[string][]byte{EFIBootFile: code.EFIImg}); err != nil {
		return nil, fmt.Errorf("writing the EFI system partition of %s: %w", o.Disk, err)
	}
	biosAt, biosSize := partBytes(parts.Partitions[PartBIOSBoot])
	bootSector, core, err := diskimage.BIOSBootCode(code.BootImg, code.CoreImg, uint64(biosAt/diskimage.SectorSize))
	if err != nil {
		return nil, err
	}
	if int64(len(core)) > biosSize {
		return nil, fmt.Errorf("GRUB's BIOS core image (%d bytes) does not fit in the BIOS boot partition (%d bytes)", len(core), biosSize)
	}
	step("Partition %d, the BIOS boot partition: GRUB for BIOS", PartBIOSBoot+1)
	if _, err := d.f.WriteAt(core, biosAt); err != nil {
		return nil, fmt.Errorf("writing GRUB's core image to %s: %w", o.Disk, err)
	}
	if err := d.f.Sync(); err != nil {
		return nil, fmt.Errorf("flushing %s: %w", o.Disk, err)
	}
	// The partition table last (it flushes each copy): a disk whose
	// writing stopped before it has none, and boots nothing.
	step("The partition table (GPT) and GRUB's boot sector")
	if err := diskimage.WriteGPT(d.f, size, parts, bootSector); err != nil {
		return nil, fmt.Errorf("writing the partition table of %s: %w", o.Disk, err)
	}
	if err := d.Close(); err != nil {
		return nil, err
	}
	step("Done")
	return &Result{Version: target.Version, Size: size, Partitions: parts.Partitions}, nil
}

// installFolder writes the partitions' content into o.Folder: first into
// a folder beside it, renamed once complete, so that a machine's folder
// that exists is whole.
func installFolder(ctx context.Context, o Options, step func(string, ...any), client *http.Client, ref string, target release.Target, doc *release.Document, lay *layer.Layer, leader *controlplane.Config) (*Result, error) {
	work, err := os.MkdirTemp(filepath.Dir(o.Folder), "."+filepath.Base(o.Folder)+".partial-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	trees, err := writeTrees(ctx, o, step, client, ref, target, doc, lay, leader, work)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(filepath.Join(work, "download")); err != nil {
		return nil, err
	}
	size, err := treeSize(work)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(work, o.Folder); err != nil {
		return nil, err
	}
	step("Done: %s holds %s, %s and %s", o.Folder, filepath.Base(trees[BootLabel]), filepath.Base(trees[LayerLabel]), filepath.Base(trees[SlotsLabel]))
	return &Result{Version: target.Version, Size: size}, nil
}

// writeTrees fills the three partitions' folders under work, named by
// their labels, and returns them: slot A with the release, downloaded
// first when it is a URL and verified file by file; the boot partition;
// the layer partition.
func writeTrees(ctx context.Context, o Options, step func(string, ...any), client *http.Client, ref string, target release.Target, doc *release.Document, lay *layer.Layer, leader *controlplane.Config, work string) (map[string]string, error) {
	releaseDir := o.Release
	if isURL(o.Release) {
		releaseDir = filepath.Join(work, "download")
		if err := download(ctx, client, ref, target, releaseDir, func(done, total int64) {
			step("Downloading release %s: %s of %s", target.Version, cmdutil.HumanBytes(done), cmdutil.HumanBytes(total))
		}); err != nil {
			return nil, err
		}
	}
	trees := map[string]string{}
	for _, label := range []string{BootLabel, LayerLabel, SlotsLabel} {
		trees[label] = filepath.Join(work, label)
		if err := os.MkdirAll(trees[label], 0o755); err != nil {
			return nil, err
		}
	}
	step("Copying release %s into slot A and verifying every file", target.Version)
	if err := slots.Install(ctx, trees[SlotsLabel], slots.A, releaseDir, target, slots.WithBootPartition(trees[BootLabel])); err != nil {
		return nil, fmt.Errorf("slot A: %w", err)
	}
	if doc.Artifact(release.KernelPath) == nil || doc.Artifact(release.InitrdPath) == nil {
		step("Warning: release %s has no %s and %s: GRUB will find no kernel to boot on this disk", target.Version, release.KernelPath, release.InitrdPath)
	}
	if err := writeBootTree(trees[BootLabel]); err != nil {
		return nil, err
	}
	if err := writeLayerTree(trees[LayerLabel], lay, o.Machine, leader); err != nil {
		return nil, err
	}
	return trees, nil
}

// catalogued refuses a release the Cluster does not catalogue with this
// digest.
func catalogued(c *v1alpha1.Cluster, t release.Target, ref string) error {
	var listed []string
	for _, e := range c.Spec.Releases.Catalog {
		if e.Version == t.Version {
			if e.Digest != t.Digest {
				return fmt.Errorf("release %s at %s has digest %s, but Cluster %s catalogues release %s with digest %s: the release is not the one the Cluster trusts; check the channel, or correct the catalog entry (liken release digest prints it) and pack the layer again",
					t.Version, ref, t.Digest, c.Name, t.Version, e.Digest)
			}
			return nil
		}
		listed = append(listed, e.Version)
	}
	return fmt.Errorf("release %s (%s) is not in Cluster %s's catalog (spec.releases.catalog lists %s): a machine installed with it would run a release its Cluster does not trust; add its entry (liken release digest %s) to the Cluster and pack the layer again",
		t.Version, ref, c.Name, listOrNone(listed), ref)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func isURL(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }

func diskKind(device bool) string {
	if device {
		return "block device of"
	}
	return "image file of"
}

// minDiskSize is the smallest disk for a release of total bytes: the
// partition tables' MiB at each end, the EFI system, boot and layer
// partitions, and a slot store for two releases with room for the file
// system and the machine's state.
func minDiskSize(total int64) int64 {
	store := 2*total + total/4 + 128*mib
	return roundMiB(2*mib + ESPSize + BootSize + LayerSize + store)
}

func roundMiB(n int64) int64 { return (n + mib - 1) / mib * mib }

// Indexes of Result.Partitions, in the order of the GPT's entries: the
// kernel names the boot partition sda1 (or vda1, nvme0n1p1) whatever the
// disk's firmware.
const (
	PartBoot = iota
	PartLayer
	PartSlots
	PartBIOSBoot
	PartESP
)

// layout places the partitions on a disk of size bytes: the BIOS boot
// partition in the sectors between the GPT and the first MiB, the EFI
// system partition, boot, layer, then the slot store up to the last whole
// MiB before the backup GPT. Each partition gets a random GUID.
func layout(size int64) (diskimage.GPT, error) {
	const s = diskimage.SectorSize
	first, last := diskimage.GPTUsable(uint64(size / s))
	sectors := func(bytes int64) uint64 { return uint64(bytes / s) }
	type span struct {
		name        string
		typ         diskimage.GUID
		first, last uint64
	}
	esp := sectors(mib)
	boot := esp + sectors(ESPSize)
	lay := boot + sectors(BootSize)
	store := lay + sectors(LayerSize)
	storeEnd := (last+1)/sectors(mib)*sectors(mib) - 1
	spans := []span{
		PartBoot:     {BootLabel, diskimage.GUIDLinuxFS, boot, lay - 1},
		PartLayer:    {LayerLabel, diskimage.GUIDLinuxFS, lay, store - 1},
		PartSlots:    {SlotsLabel, diskimage.GUIDLinuxFS, store, storeEnd},
		PartBIOSBoot: {"BIOS boot", diskimage.GUIDBIOSBoot, first, esp - 1},
		PartESP:      {"EFI system", diskimage.GUIDESP, esp, boot - 1},
	}
	g := diskimage.GPT{}
	var err error
	if g.DiskID, err = diskimage.NewGUID(); err != nil {
		return g, err
	}
	for _, sp := range spans {
		p := diskimage.GPTPartition{Type: sp.typ, First: sp.first, Last: sp.last, Name: sp.name}
		if p.ID, err = diskimage.NewGUID(); err != nil {
			return g, err
		}
		g.Partitions = append(g.Partitions, p)
	}
	return g, nil
}

// partBytes is where partition p starts and how long it is, in bytes.
func partBytes(p diskimage.GPTPartition) (offset, size int64) {
	return int64(p.First) * diskimage.SectorSize, int64(p.Last-p.First+1) * diskimage.SectorSize
}

// writeBootTree writes the boot partition's GRUB folder: grub.cfg and the
// boot state (slot A proven, no trial) in both copies. Slot A's kernel
// and initramfs are already there; B's folder is empty.
func writeBootTree(dir string) error {
	grub := filepath.Join(dir, "grub")
	for _, d := range []string{grub, filepath.Join(dir, slots.B)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	env, err := boot.Encode(boot.State{Proven: boot.SlotA}, nil)
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{"grub.cfg": boot.GrubConfig(), boot.EnvFile: env, boot.BackupFile: env} {
		if err := os.WriteFile(filepath.Join(grub, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeLayerTree writes the layer partition: the layer as the machine
// carries it (a worker's without private keys), the join kubeconfig
// (readable by root only: they hold the token, and a leader's layer the
// keys), the machine's name, the client CA certificate and, given a
// leader's control plane configuration, LeaderDir.
func writeLayerTree(dir string, lay *layer.Layer, machine string, leader *controlplane.Config) error {
	own, err := lay.ForMachine(machine)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := own.Write(&b); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, LayerFile), b.Bytes(), 0o600); err != nil {
		return err
	}
	join, err := BootstrapKubeconfig(lay, machine)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, BootstrapFile), join, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, MachineFile), []byte(machine+"\n"), 0o644); err != nil {
		return err
	}
	for _, d := range own.Machines {
		if d.Name == machine {
			if err := os.WriteFile(filepath.Join(dir, MachineDocFile), d.YAML, 0o644); err != nil {
				return err
			}
		}
	}
	for _, p := range own.Machine(machine).Spec.Ports {
		name, b, err := changes.PortNetwork(p)
		if err != nil {
			return fmt.Errorf("Machine %s: %w", machine, err)
		}
		if err := os.MkdirAll(filepath.Join(dir, NetworkDir), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, NetworkDir, name), b, 0o644); err != nil {
			return err
		}
	}
	clientCA, ok := own.Identity.Files[ClientCAFile]
	if !ok {
		return fmt.Errorf("the layer's identity has no %s: make it again with liken layer generate", ClientCAFile)
	}
	if err := os.WriteFile(filepath.Join(dir, ClientCAFile), clientCA, 0o644); err != nil {
		return err
	}
	if leader == nil {
		return nil
	}
	return writeLeaderDir(filepath.Join(dir, LeaderDir), own, *leader)
}

// writeLeaderDir writes a leader's LeaderDir: the control plane's
// configuration, the workers' join tokens, the layer's documents and every
// file of the identity,
// folders 0700 and files 0600, as liken-node's control plane setup and
// init read them.
func writeLeaderDir(dir string, lay *layer.Layer, cfg controlplane.Config) error {
	id := lay.Identity
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	tokens, err := yaml.Marshal(controlplane.JoinTokens{Tokens: lay.Tokens})
	if err != nil {
		return err
	}
	// The layer's documents, which the first leader's control-plane init
	// creates: the Cluster, then the Machines.
	var docs bytes.Buffer
	for _, d := range append([]*layer.Document{lay.Cluster}, lay.Machines...) {
		docs.WriteString("---\n")
		docs.Write(d.YAML)
		if !bytes.HasSuffix(d.YAML, []byte("\n")) {
			docs.WriteString("\n")
		}
	}
	files := map[string][]byte{controlplane.ConfigFile: b, controlplane.JoinTokensFile: tokens, controlplane.DocumentsFile: docs.Bytes()}
	for _, name := range layer.IdentityFiles() {
		b, ok := id.Files[name]
		if !ok {
			return fmt.Errorf("the leader's identity has no %s", name)
		}
		files[path.Join(controlplane.IdentityDir, name)] = b
	}
	dirs := []string{"."}
	for name := range files {
		for d := path.Dir(name); d != "." && !slices.Contains(dirs, d); d = path.Dir(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs) // parents first
	for _, d := range dirs {
		p := filepath.Join(dir, filepath.FromSlash(d))
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o700); err != nil { // a umask may have narrowed it
			return err
		}
	}
	for name, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// BootstrapKubeconfig returns the kubeconfig the named machine of the
// layer joins with: the Cluster's spec.network.endpoint, the identity's
// server CA, and the machine's join token (its own, or the fleet's shared
// one).
func BootstrapKubeconfig(lay *layer.Layer, machine string) ([]byte, error) {
	token, err := lay.JoinTokenOf(machine)
	if err != nil {
		return nil, err
	}
	server := lay.Cluster.Cluster.Spec.Network.EndpointURL()
	return clientcmd.Write(join.BootstrapKubeconfig(server, lay.Identity.Files["server-ca.crt"], token))
}

func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	return n, err
}

// findBootCode finds or fetches GRUB and builds its core image for liken's
// disks.
func findBootCode(logf func(string, ...any)) (*BootCode, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	g, err := diskimage.FindGRUB(filepath.Join(cache, "liken", "grub"), logf)
	if err != nil {
		return nil, err
	}
	return BootCodeOf(g)
}
