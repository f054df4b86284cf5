// Package diskimage writes the parts of a boot disk without root or loop devices: a GUID partition table (GPT) or an MBR one, GRUB's boot code for BIOS and UEFI, and ext2/ext4 and FAT32 file systems.
//
// The disk is an image file or a block device. liken install writes a GPT
// disk that boots both ways (WriteGPT): GRUB's boot.img in the protective
// MBR loads the BIOS core image from a BIOS boot partition
// (BIOSBootCode), and UEFI firmware starts GRUB's EFI image from the EFI
// system partition (WriteFAT32); both images find the boot partition by
// its label. The MBR table with GRUB's core image from sector 1
// (WriteBootCode) is what e2e/boot's own test disks use.
package diskimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// SectorSize is the size of a disk sector.
const SectorSize = 512

// FirstSector is where the first partition may start (1 MiB): GRUB's
// core image lives in the sectors before it.
const FirstSector = 2048

// Modules go into GRUB's BIOS core image, so GRUB reads nothing but
// grub.cfg, grubenv and the kernels from the boot partition. part_gpt
// reads liken's disks, part_msdos the test disks of e2e/boot; search
// finds the boot partition by its label.
var Modules = []string{
	"biosdisk", "part_msdos", "part_gpt", "ext2", "normal", "configfile", "linux", "loadenv",
	"test", "echo", "reboot", "halt", "sleep", "serial", "terminal", "search", "search_label",
}

// EFIModules go into GRUB's EFI image: the same, with the EFI console
// and the firmware's disks instead of the BIOS's.
var EFIModules = []string{
	"part_gpt", "ext2", "normal", "configfile", "linux", "loadenv",
	"test", "echo", "reboot", "halt", "sleep", "serial", "terminal", "search", "search_label", "efi_gop",
}

// Partition is one entry of an MBR partition table.
type Partition struct {
	// Start and Sectors place the partition, in sectors.
	Start, Sectors uint32
	// Type is the MBR partition type (0x83: Linux).
	Type byte
	// Active marks the partition the BIOS considers bootable.
	Active bool
}

// TypeLinux is the MBR partition type of a Linux file system.
const TypeLinux = 0x83

// BootSector returns GRUB's boot.img made into a hard disk's MBR holding
// parts (at most four), as grub-bios-setup does: the jump over the BIOS
// drive-number check becomes two NOPs, and the partition table replaces
// boot.img's floppy code.
func BootSector(bootImg []byte, parts []Partition) ([]byte, error) {
	if len(bootImg) != SectorSize {
		return nil, fmt.Errorf("GRUB's boot.img is %d bytes, want %d: is it the i386-pc boot.img of grub-pc-bin?", len(bootImg), SectorSize)
	}
	if len(parts) > 4 {
		return nil, fmt.Errorf("an MBR holds 4 partitions, not %d", len(parts))
	}
	mbr := append([]byte(nil), bootImg...)
	mbr[0x66], mbr[0x67] = 0x90, 0x90
	for i := 0x1be; i < 0x1fe; i++ {
		mbr[i] = 0
	}
	for i, p := range parts {
		if p.Start < 1 || p.Sectors == 0 {
			return nil, fmt.Errorf("partition %d: start %d, %d sectors", i+1, p.Start, p.Sectors)
		}
		e := mbr[0x1be+16*i : 0x1be+16*(i+1)]
		if p.Active {
			e[0] = 0x80
		}
		// CHS fields unused: the maximum, as for any disk past 8 GiB.
		e[1], e[2], e[3] = 0xfe, 0xff, 0xff
		e[4] = p.Type
		e[5], e[6], e[7] = 0xfe, 0xff, 0xff
		binary.LittleEndian.PutUint32(e[8:], p.Start)
		binary.LittleEndian.PutUint32(e[12:], p.Sectors)
	}
	mbr[510], mbr[511] = 0x55, 0xaa
	return mbr, nil
}

// BIOSBootCode is GRUB's boot.img and core image made to boot a GPT disk
// from BIOS with the core image at sector coreSector (a BIOS boot
// partition), as grub-bios-setup does: boot.img reads the core image's
// first sector from coreSector, and that sector (diskboot.img) reads the
// rest from the sectors after it. The boot code returned goes into the
// protective MBR (WriteGPT), the core image at coreSector.
func BIOSBootCode(bootImg, coreImg []byte, coreSector uint64) (boot, core []byte, err error) {
	if len(bootImg) != SectorSize {
		return nil, nil, fmt.Errorf("GRUB's boot.img is %d bytes, want %d: is it the i386-pc boot.img of grub-pc-bin?", len(bootImg), SectorSize)
	}
	if len(coreImg) < SectorSize {
		return nil, nil, fmt.Errorf("GRUB's core image is %d bytes, shorter than its first sector", len(coreImg))
	}
	boot = append([]byte(nil), bootImg...)
	boot[0x66], boot[0x67] = 0x90, 0x90
	binary.LittleEndian.PutUint64(boot[bootKernelSector:], coreSector)
	core = append([]byte(nil), coreImg...)
	// The first block list entry sits at the end of the first sector:
	// its start (8 bytes), length and segment. grub-mkimage leaves the
	// start at 2, the sector after a core image written at sector 1.
	list := core[SectorSize-blockListSize:]
	if start := binary.LittleEndian.Uint64(list); start != 2 {
		return nil, nil, fmt.Errorf("GRUB's core image starts its block list at sector %d, not 2: not a core image of grub-mkimage -O i386-pc", start)
	}
	binary.LittleEndian.PutUint64(list, coreSector+1)
	return boot, core, nil
}

// Offsets in GRUB's BIOS boot code (grub's include/grub/i386/pc/boot.h).
const (
	// bootKernelSector is where boot.img keeps the sector of the core
	// image's first sector.
	bootKernelSector = 0x5c
	// blockListSize is the size of one block list entry of diskboot.img.
	blockListSize = 12
)

// ReadPartitions reads the partition table of an MBR sector.
func ReadPartitions(mbr []byte) ([]Partition, error) {
	if len(mbr) < SectorSize || mbr[510] != 0x55 || mbr[511] != 0xaa {
		return nil, errors.New("no MBR signature in the first sector")
	}
	var out []Partition
	for i := 0; i < 4; i++ {
		e := mbr[0x1be+16*i : 0x1be+16*(i+1)]
		if e[4] == 0 {
			continue
		}
		out = append(out, Partition{
			Start: binary.LittleEndian.Uint32(e[8:]), Sectors: binary.LittleEndian.Uint32(e[12:]),
			Type: e[4], Active: e[0] == 0x80,
		})
	}
	return out, nil
}

// WriteBootCode writes GRUB's boot sector with the partition table to
// sector 0 and its core image from sector 1.
func WriteBootCode(w io.WriterAt, bootImg, coreImg []byte, parts []Partition) error {
	mbr, err := BootSector(bootImg, parts)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if int64(len(coreImg)) > (int64(p.Start)-1)*SectorSize {
			return fmt.Errorf("GRUB's core image (%d bytes) does not fit before the partition at sector %d", len(coreImg), p.Start)
		}
	}
	// The core image first: the boot sector that jumps to it comes last.
	if _, err := w.WriteAt(coreImg, SectorSize); err != nil {
		return err
	}
	_, err = w.WriteAt(mbr, 0)
	return err
}

// GRUB is GRUB's BIOS and EFI builds: grub-mkimage, the i386-pc folder
// of grub-pc-bin (boot.img and the modules) and the x86_64-efi folder of
// grub-efi-amd64-bin.
type GRUB struct {
	// Mkimage is the grub-mkimage program.
	Mkimage string
	// Env is added to grub-mkimage's environment (LD_LIBRARY_PATH for an
	// unpacked package).
	Env []string
	// Dir is the i386-pc folder (/usr/lib/grub/i386-pc).
	Dir string
	// EFIDir is the x86_64-efi folder (/usr/lib/grub/x86_64-efi).
	EFIDir string
}

// BootImage reads boot.img.
func (g GRUB) BootImage() ([]byte, error) {
	return os.ReadFile(filepath.Join(g.Dir, "boot.img"))
}

// CoreImage builds GRUB's BIOS core image with Modules that reads its
// configuration from prefix, such as (hd0,msdos1)/grub.
func (g GRUB) CoreImage(prefix string) ([]byte, error) {
	return g.mkimage("i386-pc", g.Dir, prefix, "", Modules)
}

// CoreImageFor builds GRUB's BIOS core image that finds the file system
// labelled label and reads grub.cfg from its grub folder.
func (g GRUB) CoreImageFor(label string) ([]byte, error) {
	return g.mkimage("i386-pc", g.Dir, "", searchConfig(label), Modules)
}

// EFIImageFor builds GRUB's EFI image (BOOTX64.EFI) that finds the file
// system labelled label and reads grub.cfg from its grub folder.
func (g GRUB) EFIImageFor(label string) ([]byte, error) {
	if g.EFIDir == "" {
		return nil, errors.New("no GRUB for EFI: install grub-efi-amd64-bin")
	}
	return g.mkimage("x86_64-efi", g.EFIDir, "", searchConfig(label), EFIModules)
}

// searchConfig is the configuration built into a GRUB image: find the
// boot partition by its label, whichever disk and partition number the
// firmware gives it, and take grub.cfg from there. GRUB's normal mode
// then reads ${prefix}/grub.cfg. Plain commands only: GRUB reads it with
// its rescue parser.
func searchConfig(label string) string {
	return fmt.Sprintf("search --no-floppy --set=root --label %s\nset prefix=($root)/grub\n", label)
}

// mkimage runs grub-mkimage for format with the modules of dir, prefix,
// and config built in when not empty.
func (g GRUB) mkimage(format, dir, prefix, config string, modules []string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "liken-grub-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "image")
	args := []string{"-O", format, "-d", dir, "-p", prefix, "-o", out}
	if config != "" {
		cfg := filepath.Join(tmp, "early.cfg")
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			return nil, err
		}
		args = append(args, "-c", cfg)
	}
	args = append(args, modules...)
	cmd := exec.Command(g.Mkimage, args...)
	cmd.Env = append(os.Environ(), g.Env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s %s: %v\n%s", g.Mkimage, strings.Join(args, " "), err, b)
	}
	return os.ReadFile(out)
}

// FS is a file system to make at an offset of a disk.
type FS struct {
	// Type is ext2 or ext4.
	Type string
	// Label is the file system's label (at most 16 bytes).
	Label string
	// BlockSize is the block size in bytes; 0 lets mke2fs choose.
	BlockSize int
	// Offset and Size place it on the disk, in bytes.
	Offset, Size int64
	// Tree is the folder whose content the file system receives.
	Tree string
}

// Make writes the file system to disk (an image file or a block device)
// with mke2fs -d: no mount, no loop device, no root.
func (f FS) Make(disk string) error {
	bs := f.BlockSize
	if bs == 0 {
		bs = 4096
	}
	if f.Size%int64(bs) != 0 || f.Offset%SectorSize != 0 {
		return fmt.Errorf("file system %s: size %d is not a multiple of its %d-byte blocks, or offset %d of %d-byte sectors", f.Label, f.Size, bs, f.Offset, SectorSize)
	}
	args := []string{"-q", "-F", "-t", f.Type, "-b", strconv.Itoa(bs), "-L", f.Label,
		"-E", "offset=" + strconv.FormatInt(f.Offset, 10) + ",root_owner=0:0",
		"-d", f.Tree, disk, strconv.FormatInt(f.Size/int64(bs), 10)}
	if b, err := exec.Command("mke2fs", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mke2fs %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}
