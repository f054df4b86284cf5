package boote2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"liken.sh/liken/image/initramfs"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/boot/diskimage"
)

const (
	sectorSize = diskimage.SectorSize
	// partStart is the first sector of the boot partition (1 MiB): GRUB's
	// core image lives in the gap before it.
	partStart = diskimage.FirstSector
	// fsBlock is the ext2 block size: with 1 KiB blocks each copy of the
	// environment is exactly one block.
	fsBlock = 1024
)

// DiskSpec describes a test disk.
type DiskSpec struct {
	// Scenario is what each slot's init does on a trial boot (see bootinit).
	Scenario map[boot.Slot]string
	// Primary and Backup are the two environment copies, written as they
	// are. A copy must be EnvBlockSize bytes, so that GRUB's save_env and
	// the tests find it in one block.
	Primary, Backup []byte
	// Files are more files for the boot partition, by path from its root
	// (such as boot/grub/liken-args.cfg); they replace a slot's own
	// (such as B/vmlinuz).
	Files map[string][]byte
	// Omit are slot files left off the partition, by path from its root
	// (such as B/vmlinuz): a slot GRUB cannot load.
	Omit []string
}

// Disk is a raw disk image: MBR, GRUB's core image, one ext2 partition with
// /boot/grub (liken's grub.cfg, grubenv, grubenv.bak) and /A, /B (kernel,
// initramfs with bootinit).
type Disk struct {
	Path string
	// envOffset is the byte offset of each environment copy in the image.
	envOffset map[string]int64
}

// BuildDisk builds a disk in dir.
func (k *Kit) BuildDisk(dir string, spec DiskSpec) (*Disk, error) {
	for name, b := range map[string][]byte{boot.EnvFile: spec.Primary, boot.BackupFile: spec.Backup} {
		if len(b) != boot.EnvBlockSize {
			return nil, fmt.Errorf("test disk: %s must be %d bytes, is %d", name, boot.EnvBlockSize, len(b))
		}
	}
	tree := filepath.Join(dir, "tree")
	grubDir := filepath.Join(tree, "boot", "grub")
	if err := os.MkdirAll(grubDir, 0o755); err != nil {
		return nil, err
	}
	files := map[string][]byte{
		filepath.Join(grubDir, "grub.cfg"):      boot.GrubConfig(),
		filepath.Join(grubDir, boot.EnvFile):    spec.Primary,
		filepath.Join(grubDir, boot.BackupFile): spec.Backup,
	}
	kernel, err := os.ReadFile(k.Kernel)
	if err != nil {
		return nil, err
	}
	for _, slot := range []boot.Slot{boot.SlotA, boot.SlotB} {
		scenario := spec.Scenario[slot]
		if scenario == "" {
			scenario = "report"
		}
		initrd, err := k.Initramfs(slot, scenario)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Join(tree, string(slot)), 0o755); err != nil {
			return nil, err
		}
		files[filepath.Join(tree, string(slot), "vmlinuz")] = kernel
		files[filepath.Join(tree, string(slot), "initrd.img")] = initrd
	}
	for rel, b := range spec.Files {
		p := filepath.Join(tree, filepath.FromSlash(rel))
		if !strings.HasPrefix(p, tree+string(filepath.Separator)) {
			return nil, fmt.Errorf("test disk: file %q is outside the partition", rel)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		files[p] = b
	}
	for _, rel := range spec.Omit {
		p := filepath.Join(tree, filepath.FromSlash(rel))
		if _, ok := files[p]; !ok {
			return nil, fmt.Errorf("test disk: cannot omit %q, which the disk does not hold", rel)
		}
		delete(files, p)
	}
	size := int64(0)
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
		size += int64(len(b))
	}

	// The file system: sized for the files plus room, in 1 KiB blocks.
	fsImg := filepath.Join(dir, "part.img")
	blocks := (size*5/4)/fsBlock + 4096
	if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext2", "-b", strconv.Itoa(fsBlock), "-L", "liken-boot",
		"-d", tree, fsImg, strconv.FormatInt(blocks, 10)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mke2fs: %v\n%s", err, out)
	}
	d := &Disk{Path: filepath.Join(dir, "disk.img"), envOffset: map[string]int64{}}
	for _, name := range []string{boot.EnvFile, boot.BackupFile} {
		blk, err := bmap(fsImg, "/boot/grub/"+name)
		if err != nil {
			return nil, err
		}
		d.envOffset[name] = partStart*sectorSize + blk*fsBlock
	}
	if err := k.assemble(d.Path, fsImg, blocks*fsBlock); err != nil {
		return nil, err
	}
	os.Remove(fsImg)
	os.RemoveAll(tree)
	// The copies must read back from where the tests will look.
	for name, want := range map[string][]byte{boot.EnvFile: spec.Primary, boot.BackupFile: spec.Backup} {
		got, err := d.ReadEnv(name)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(got, want) {
			return nil, fmt.Errorf("test disk: %s is not at the block debugfs reported", name)
		}
	}
	return d, nil
}

var bmapOut = regexp.MustCompile(`^\s*(\d+)\s*$`)

// bmap returns the file system block holding the first block of path.
func bmap(fsImg, path string) (int64, error) {
	out, err := exec.Command("debugfs", "-R", "bmap "+path+" 0", fsImg).Output()
	if err != nil {
		return 0, fmt.Errorf("debugfs bmap %s: %v", path, err)
	}
	m := bmapOut.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("debugfs bmap %s: unexpected output %q", path, out)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	if n == 0 {
		return 0, fmt.Errorf("debugfs bmap %s: the file has no first block", path)
	}
	return n, nil
}

// assemble writes the disk: GRUB's boot sector with one partition entry,
// the core image from sector 1 (where boot.img and core.img look for it by
// default), and the file system from partStart.
func (k *Kit) assemble(path, fsImg string, fsSize int64) error {
	mbr, err := os.ReadFile(k.BootImg)
	if err != nil {
		return err
	}
	core, err := os.ReadFile(k.CoreImg)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	parts := []diskimage.Partition{{Start: partStart, Sectors: uint32(fsSize / sectorSize), Type: diskimage.TypeLinux, Active: true}}
	if err := diskimage.WriteBootCode(f, mbr, core, parts); err != nil {
		return err
	}
	part, err := os.Open(fsImg)
	if err != nil {
		return err
	}
	defer part.Close()
	if _, err := f.Seek(partStart*sectorSize, 0); err != nil {
		return err
	}
	if _, err := f.ReadFrom(part); err != nil {
		return err
	}
	return f.Close()
}

// ReadEnv reads one environment copy (boot.EnvFile or boot.BackupFile)
// from the image.
func (d *Disk) ReadEnv(name string) ([]byte, error) {
	off, ok := d.envOffset[name]
	if !ok {
		return nil, fmt.Errorf("no environment copy %q", name)
	}
	f, err := os.Open(d.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, boot.EnvBlockSize)
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

// WriteEnv overwrites one environment copy in the image in place.
func (d *Disk) WriteEnv(name string, b []byte) error {
	off, ok := d.envOffset[name]
	if !ok {
		return fmt.Errorf("no environment copy %q", name)
	}
	if len(b) != boot.EnvBlockSize {
		return fmt.Errorf("environment copy must be %d bytes", boot.EnvBlockSize)
	}
	f, err := os.OpenFile(d.Path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		return err
	}
	return f.Close()
}

// Initramfs returns a gzip-compressed newc cpio archive with bootinit as
// /init, the scenario, the kernel modules with their load order, and a
// /slot file naming the slot whose folder the archive goes into: the init
// reports it, so a test sees which slot's files GRUB loaded, not only the
// slot the command line names.
func (k *Kit) Initramfs(slot boot.Slot, scenario string) ([]byte, error) {
	a := initramfs.New()
	a.Dir("mnt")
	init, err := os.ReadFile(k.Init)
	if err != nil {
		return nil, err
	}
	a.File("init", 0o755, init)
	a.File("scenario", 0o644, []byte(scenario+"\n"))
	a.File("slot", 0o644, []byte(string(slot)+"\n"))
	if err := a.Modules(k.Modules); err != nil {
		return nil, err
	}
	return a.Gzip()
}
