package diskimage

import (
	"bytes"
	"encoding/binary"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// memDisk is a disk in memory.
type memDisk []byte

func (m memDisk) WriteAt(p []byte, off int64) (int, error) { return copy(m[off:], p), nil }

// TestWriteFAT32Layout: the file system lies where it is told, says FAT32
// with the table's geometry, and holds each file's bytes in the clusters
// its directory entry names (e2e/boot checks the whole with fsck.fat and
// mtools, and boots it with OVMF).
func TestWriteFAT32Layout(t *testing.T) {
	const offset, size = 1 << 20, 40 << 20
	disk := make(memDisk, offset+size+SectorSize)
	for i := range disk {
		disk[i] = 0xAA // what the disk held before
	}
	efi := bytes.Repeat([]byte("grub"), 700) // several clusters
	assert.NilError(t, WriteFAT32(disk, offset, size, "LIKEN-EFI", map[string][]byte{"EFI/BOOT/BOOTX64.EFI": efi}))
	assert.Check(t, disk[offset-1] == 0xAA && disk[offset+size] == 0xAA, "wrote outside its bytes")

	fs := disk[offset : offset+size]
	assert.Check(t, is.Equal(string(fs[82:90]), "FAT32   "))
	assert.Check(t, is.Equal(string(fs[71:82]), "LIKEN-EFI  "))
	assert.Check(t, is.Equal(binary.LittleEndian.Uint32(fs[32:]), uint32(size/SectorSize)))
	assert.Check(t, bytes.Equal(fs[fatBackupBoot*SectorSize:(fatBackupBoot+2)*SectorSize], fs[:2*SectorSize]), "the backup boot sectors")
	fatSize := int(binary.LittleEndian.Uint32(fs[36:]))
	data := (fatReserved + fatCopies*fatSize) * SectorSize
	fat := func(c uint32) uint32 { return binary.LittleEndian.Uint32(fs[fatReserved*SectorSize+4*int(c):]) }
	second := fs[(fatReserved+fatSize)*SectorSize : (fatReserved+2*fatSize)*SectorSize]
	assert.Check(t, bytes.Equal(fs[fatReserved*SectorSize:(fatReserved+fatSize)*SectorSize], second), "the two FATs")
	cluster := func(c uint32) []byte {
		at := data + int(c-fatRootCluster)*SectorSize
		return fs[at : at+SectorSize]
	}
	// find follows name from the folder at cluster dir.
	find := func(dir uint32, name string) (uint32, uint32) {
		t.Helper()
		b := cluster(dir)
		for i := 0; i < len(b); i += fatDirEntrySize {
			e := b[i : i+fatDirEntrySize]
			if string(e[:11]) == name {
				return uint32(binary.LittleEndian.Uint16(e[20:]))<<16 | uint32(binary.LittleEndian.Uint16(e[26:])), binary.LittleEndian.Uint32(e[28:])
			}
		}
		t.Fatalf("no %q in the folder at cluster %d", name, dir)
		return 0, 0
	}
	efiDir, _ := find(fatRootCluster, "EFI        ")
	bootDir, _ := find(efiDir, "BOOT       ")
	parent, _ := find(bootDir, "..         ")
	assert.Check(t, is.Equal(parent, efiDir))
	first, n := find(bootDir, "BOOTX64 EFI")
	assert.Check(t, is.Equal(n, uint32(len(efi))))
	var read []byte
	for c := first; ; c = fat(c) {
		read = append(read, cluster(c)...)
		if fat(c) == fatEOC {
			break
		}
	}
	assert.Check(t, bytes.Equal(read[:len(efi)], efi), "the file's bytes through its cluster chain")
	assert.Check(t, is.Equal(len(read), (len(efi)+SectorSize-1)/SectorSize*SectorSize))
}

// TestWriteFAT32Refuses: what WriteFAT32 cannot make is refused before it
// writes anything, with the reason.
func TestWriteFAT32Refuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int64
		label   string
		files   map[string][]byte
		wantErr string
	}{
		{"too small", 16 << 20, "ESP", nil, "too small: it needs at least"},
		{"long name", 40 << 20, "ESP", map[string][]byte{"EFI/BOOT/grubx64.efi": nil}, `"grubx64.efi" is not an 8.3 name in upper case`},
		{"file and folder", 40 << 20, "ESP", map[string][]byte{"EFI": {1}, "EFI/BOOT.EFI": {2}}, "is a file, not a folder"},
		{"bad label", 40 << 20, "liken", nil, `label "liken"`},
		{"too much", 40 << 20, "ESP", map[string][]byte{"BIG.BIN": make([]byte, 41<<20)}, "do not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := make(memDisk, tc.size)
			err := WriteFAT32(disk, 0, tc.size, tc.label, tc.files)
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Check(t, bytes.Equal(disk, make(memDisk, tc.size)), "wrote before refusing")
		})
	}
}

// TestBIOSBootCode: boot.img reads the core image from the BIOS boot
// partition, and the core image's block list goes on from the sector
// after it, as grub-bios-setup makes them; a core image whose block list
// is not grub-mkimage's is refused.
func TestBIOSBootCode(t *testing.T) {
	bootImg := bytes.Repeat([]byte{0xb0}, SectorSize)
	core := bytes.Repeat([]byte{0xc0}, 3*SectorSize)
	binary.LittleEndian.PutUint64(core[SectorSize-blockListSize:], 2)
	boot, placed, err := BIOSBootCode(bootImg, core, 34)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(binary.LittleEndian.Uint64(boot[bootKernelSector:]), uint64(34)))
	assert.Check(t, boot[0x66] == 0x90 && boot[0x67] == 0x90, "the drive check jumped over")
	assert.Check(t, is.Equal(binary.LittleEndian.Uint64(placed[SectorSize-blockListSize:]), uint64(35)))
	assert.Check(t, bytes.Equal(placed[SectorSize:], core[SectorSize:]))
	assert.Check(t, is.Equal(binary.LittleEndian.Uint64(core[SectorSize-blockListSize:]), uint64(2)), "the caller's core image changed")

	binary.LittleEndian.PutUint64(core[SectorSize-blockListSize:], 7)
	_, _, err = BIOSBootCode(bootImg, core, 34)
	assert.ErrorContains(t, err, "starts its block list at sector 7, not 2")
}
