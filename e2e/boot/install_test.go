package boote2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/layer"
	clirelease "liken.sh/liken/cli/release"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/boot/diskimage"
)

// TestInstalledDisk boots, with the real GRUB, a disk written by liken
// install from a release whose kernel and initramfs are artifacts, once
// from BIOS (SeaBIOS) and once from UEFI (OVMF): the same disk boots
// either way. The boot state arms a trial of slot B, which holds no
// release and so no kernel: GRUB clears the flag, cannot load B, and boots
// slot A with the kernel and initramfs liken install put on the boot
// partition.
func TestInstalledDisk(t *testing.T) {
	t.Parallel()
	for _, uefi := range []bool{false, true} {
		name := "BIOS"
		if uefi {
			name = "UEFI"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bootInstalledDisk(t, uefi)
		})
	}
}

func bootInstalledDisk(t *testing.T, uefi bool) {
	k := kit(t)
	dir := t.TempDir()

	// The release: a small OS image, the kit's kernel, an initramfs
	// whose init reports.
	tree := filepath.Join(dir, "rootfs")
	assert.NilError(t, os.MkdirAll(filepath.Join(tree, "etc"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(tree, "etc", "liken-release"), []byte("test\n"), 0o644))
	image := filepath.Join(dir, "rootfs.squashfs")
	if out, err := exec.Command("mksquashfs", tree, image, "-quiet", "-noappend").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v\n%s", err, out)
	}
	initrd, err := k.Initramfs(boot.SlotA, "report")
	assert.NilError(t, err)
	initrdFile := filepath.Join(dir, "initrd.img")
	assert.NilError(t, os.WriteFile(initrdFile, initrd, 0o644))
	rel, err := clirelease.Build(clirelease.BuildOptions{
		Image: image, Channel: filepath.Join(dir, "channel"), Version: "2026.12.01-001",
		Artifacts: []string{"boot/vmlinuz=" + k.Kernel, "boot/initrd.img=" + initrdFile},
	}, clocktesting.NewFakePassiveClock(time.Now()))
	assert.NilError(t, err)

	// The layer: a Cluster that catalogues the release, one machine.
	docs := fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata: {name: vmcluster}
spec:
  version: %q
  releases:
    source: http://10.0.2.2:8080
    catalog: [{version: %q, digest: %q}]
  network: {endpoint: "https://10.0.2.2:6443"}
---
apiVersion: liken.sh/v1alpha1
kind: Machine
metadata: {name: vm-1}
spec: {cluster: vmcluster, role: Leader, rebootPolicy: Auto}
`, rel.Version, rel.Version, rel.Digest)
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(t, len(errs) == 0, "%v", errs)
	cluster, machines, errs := layer.CheckFleet(parsed)
	assert.Assert(t, len(errs) == 0, "%v", errs)
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: "vmcluster"})
	assert.NilError(t, err)
	tokens, err := layer.MachineTokens(machines, time.Now().Add(layer.DefaultJoinTokenTTL), nil)
	assert.NilError(t, err)
	layerFile := filepath.Join(dir, "layer.tgz")
	assert.NilError(t, (&layer.Layer{Cluster: cluster, Machines: machines, Identity: id, Tokens: tokens}).WriteFile(layerFile, false))

	// liken install, with the kit's GRUB.
	code, err := install.BootCodeOf(diskimage.UnpackedGRUB(k.Root))
	assert.NilError(t, err)
	diskPath := filepath.Join(dir, "disk.img")
	res, err := install.Install(context.Background(), install.Options{
		Disk: diskPath, Release: rel.Dir, Layer: layerFile, Machine: "vm-1",
		GRUB: code, TempDir: dir,
	})
	assert.NilError(t, err)
	if uefi {
		checkESP(t, k, diskPath, res.Partitions[install.PartESP], code.EFIImg)
	}

	// Arm a trial of B in both copies, in place.
	bootOffset := int64(res.Partitions[install.PartBoot].First) * diskimage.SectorSize
	d := &Disk{Path: diskPath, envOffset: map[string]int64{}}
	for _, name := range []string{boot.EnvFile, boot.BackupFile} {
		blk, err := bmap(fmt.Sprintf("%s?offset=%d", diskPath, bootOffset), "/grub/"+name)
		assert.NilError(t, err)
		d.envOffset[name] = bootOffset + blk*fsBlock
	}
	primary, backup := armed(t, boot.SlotA, boot.SlotB)
	assert.NilError(t, d.WriteEnv(boot.EnvFile, primary))
	assert.NilError(t, d.WriteEnv(boot.BackupFile, backup))

	m := &machine{t: t, kit: k, disk: d, spec: DiskSpec{Primary: primary, Backup: backup}}
	if uefi {
		m.uefiVars = filepath.Join(dir, "uefi-vars.fd")
		assert.NilError(t, k.NewUEFIVars(m.uefiVars))
	}
	m.powerOn()
	if uefi {
		m.expectLine(`BdsDxe: starting Boot0001 "UEFI Misc Device"`) // OVMF boots the disk's EFI/BOOT/BOOTX64.EFI
	}
	m.expectLine("liken: slot B could not be loaded")
	f := m.expectBoot(boot.SlotA, false)
	assert.Equal(t, f["state"], "A/-")
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotA})
}

// checkESP checks the EFI system partition p of disk with Debian's own
// FAT tools: fsck.fat finds nothing to repair, and mtools reads GRUB's EFI
// image back from where UEFI firmware looks for it.
func checkESP(t *testing.T, k *Kit, disk string, p diskimage.GPTPartition, efi []byte) {
	t.Helper()
	b, err := os.ReadFile(disk)
	assert.NilError(t, err)
	esp := filepath.Join(t.TempDir(), "esp.img")
	assert.NilError(t, os.WriteFile(esp, b[p.First*diskimage.SectorSize:(p.Last+1)*diskimage.SectorSize], 0o644))
	out, err := k.Command("fsck.fat", "-n", "-V", esp).CombinedOutput()
	assert.NilError(t, err, "fsck.fat on the EFI system partition:\n%s", out)
	got := filepath.Join(t.TempDir(), "bootx64.efi")
	cmd := k.Command("mcopy", "-i", esp, "::/"+install.EFIBootFile, got)
	cmd.Env = append(cmd.Env, "MTOOLS_SKIP_CHECK=1")
	out, err = cmd.CombinedOutput()
	assert.NilError(t, err, "mcopy from the EFI system partition:\n%s", out)
	read, err := os.ReadFile(got)
	assert.NilError(t, err)
	assert.Check(t, bytes.Equal(read, efi), "GRUB's EFI image read back from the EFI system partition differs (%d bytes, want %d)", len(read), len(efi))
}
