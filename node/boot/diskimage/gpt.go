package diskimage

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"unicode/utf16"
)

// GUID is a GPT GUID in its on-disk byte order: the first three fields
// little-endian, the last two as written.
type GUID [16]byte

// ParseGUID reads a GUID in its text form, such as
// C12A7328-F81F-11D2-BA4B-00A0C93EC93B.
func ParseGUID(s string) (GUID, error) {
	var g GUID
	parts := strings.Split(s, "-")
	if len(parts) != 5 || len(parts[0]) != 8 || len(parts[1]) != 4 || len(parts[2]) != 4 || len(parts[3]) != 4 || len(parts[4]) != 12 {
		return g, fmt.Errorf("GUID %q: want 8-4-4-4-12 hexadecimal digits", s)
	}
	b, err := hex.DecodeString(strings.Join(parts, ""))
	if err != nil {
		return g, fmt.Errorf("GUID %q: %w", s, err)
	}
	// The first three fields are stored little-endian.
	g[0], g[1], g[2], g[3] = b[3], b[2], b[1], b[0]
	g[4], g[5] = b[5], b[4]
	g[6], g[7] = b[7], b[6]
	copy(g[8:], b[8:])
	return g, nil
}

// mustGUID is ParseGUID of a constant.
func mustGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// String is the GUID's text form, in upper case as the specification
// writes it.
func (g GUID) String() string {
	return strings.ToUpper(fmt.Sprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%s-%s",
		g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], hex.EncodeToString(g[8:10]), hex.EncodeToString(g[10:])))
}

// NewGUID is a random (version 4) GUID.
func NewGUID() (GUID, error) {
	var g GUID
	if _, err := rand.Read(g[:]); err != nil {
		return g, err
	}
	g[7] = g[7]&0x0f | 0x40 // version 4, in the little-endian third field
	g[8] = g[8]&0x3f | 0x80 // RFC 4122 variant
	return g, nil
}

// Partition types of the GUID partition table.
var (
	// GUIDLinuxFS is a Linux file system.
	GUIDLinuxFS = mustGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
	// GUIDESP is the EFI system partition, a FAT file system UEFI
	// firmware boots from.
	GUIDESP = mustGUID("C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	// GUIDBIOSBoot holds GRUB's core image on a GPT disk that BIOS boots.
	GUIDBIOSBoot = mustGUID("21686148-6449-6E6F-744E-656564454649")
)

// GPT layout: 128 entries of 128 bytes, 32 sectors, after the header.
const (
	gptEntries    = 128
	gptEntrySize  = 128
	gptEntrySecs  = gptEntries * gptEntrySize / SectorSize
	gptHeaderSize = 92
	// gptMaxEntryBytes bounds the entries a header read from a disk
	// may ask for.
	gptMaxEntryBytes = 1 << 20
)

// GPTPartition is one entry of a GUID partition table.
type GPTPartition struct {
	// Type is the partition type, such as GUIDLinuxFS.
	Type GUID
	// ID is the partition's own unique GUID (PARTUUID).
	ID GUID
	// First and Last are its first and last sectors, both included.
	First, Last uint64
	// Attributes are the entry's attribute bits.
	Attributes uint64
	// Name is the partition's name (PARTLABEL), at most 36 UTF-16 units.
	Name string
}

// GPT is a GUID partition table.
type GPT struct {
	// DiskID is the disk's GUID (PTUUID).
	DiskID GUID
	// Partitions are the table's used entries, in order.
	Partitions []GPTPartition
}

// GPTUsable are the first and last sectors a partition may use on a disk
// of sectors sectors: after the primary table, before the backup.
func GPTUsable(sectors uint64) (first, last uint64) {
	return 2 + gptEntrySecs, sectors - 2 - gptEntrySecs
}

// WriterAtSyncer is a disk being written: an image file or a block
// device (an *os.File).
type WriterAtSyncer interface {
	io.WriterAt
	Sync() error
}

// WriteGPT writes g to a disk of size bytes: its protective MBR, which
// keeps the boot code (the first 440 bytes) of bootSector when it is not
// nil (GRUB's BIOS boot.img), the primary table at sector 1 and the
// backup at the disk's end. It writes and flushes the backup first, then
// the primary, then the MBR: a power cut in between leaves one whole copy
// that a reader takes, the old or the new.
func WriteGPT(d WriterAtSyncer, size int64, g GPT, bootSector []byte) error {
	if size%SectorSize != 0 {
		return fmt.Errorf("a GPT disk of %d bytes: not a whole number of %d-byte sectors", size, SectorSize)
	}
	sectors := uint64(size / SectorSize)
	if sectors < 2*(2+gptEntrySecs)+1 {
		return fmt.Errorf("a GPT disk of %d bytes is too small for its two tables", size)
	}
	if bootSector != nil && len(bootSector) != SectorSize {
		return fmt.Errorf("the boot sector is %d bytes, want %d", len(bootSector), SectorSize)
	}
	entries, err := gptEntryArray(g.Partitions, sectors)
	if err != nil {
		return err
	}
	last := sectors - 1
	backupEntries := last - gptEntrySecs
	primary := gptHeader(g.DiskID, 1, last, 2, sectors, entries)
	backup := gptHeader(g.DiskID, last, 1, backupEntries, sectors, entries)
	for _, w := range []struct {
		what    string
		at      uint64
		entries uint64
		header  []byte
	}{
		{"backup", last, backupEntries, backup},
		{"primary", 1, 2, primary},
	} {
		if _, err := d.WriteAt(entries, int64(w.entries)*SectorSize); err != nil {
			return fmt.Errorf("writing the %s partition entries: %w", w.what, err)
		}
		if _, err := d.WriteAt(w.header, int64(w.at)*SectorSize); err != nil {
			return fmt.Errorf("writing the %s GPT header: %w", w.what, err)
		}
		if err := d.Sync(); err != nil {
			return fmt.Errorf("flushing the %s GPT: %w", w.what, err)
		}
	}
	if _, err := d.WriteAt(protectiveMBR(bootSector, sectors), 0); err != nil {
		return fmt.Errorf("writing the protective MBR: %w", err)
	}
	return d.Sync()
}

// gptEntryArray is the entries of parts, checked to lie in the usable
// sectors without overlapping.
func gptEntryArray(parts []GPTPartition, sectors uint64) ([]byte, error) {
	if len(parts) > gptEntries {
		return nil, fmt.Errorf("a GPT holds %d partitions, not %d", gptEntries, len(parts))
	}
	first, last := GPTUsable(sectors)
	b := make([]byte, gptEntries*gptEntrySize)
	for i, p := range parts {
		n := i + 1
		switch {
		case p.Type == GUID{}:
			return nil, fmt.Errorf("partition %d (%q) has no type", n, p.Name)
		case p.First > p.Last || p.First < first || p.Last > last:
			return nil, fmt.Errorf("partition %d (%q): sectors %d to %d are outside %d to %d, where partitions may lie on a disk of %d sectors", n, p.Name, p.First, p.Last, first, last, sectors)
		}
		for j, q := range parts[:i] {
			if p.First <= q.Last && q.First <= p.Last {
				return nil, fmt.Errorf("partition %d (%q) overlaps partition %d (%q)", n, p.Name, j+1, q.Name)
			}
		}
		name := utf16.Encode([]rune(p.Name))
		if len(name) > 36 {
			return nil, fmt.Errorf("partition %d: name %q is longer than 36 UTF-16 units", n, p.Name)
		}
		e := b[i*gptEntrySize : (i+1)*gptEntrySize]
		copy(e[0:], p.Type[:])
		copy(e[16:], p.ID[:])
		binary.LittleEndian.PutUint64(e[32:], p.First)
		binary.LittleEndian.PutUint64(e[40:], p.Last)
		binary.LittleEndian.PutUint64(e[48:], p.Attributes)
		for k, u := range name {
			binary.LittleEndian.PutUint16(e[56+2*k:], u)
		}
	}
	return b, nil
}

// gptHeader is the sector of a GPT header at sector at, whose other copy
// is at alt and whose entries start at sector entriesAt.
func gptHeader(disk GUID, at, alt, entriesAt, sectors uint64, entries []byte) []byte {
	h := make([]byte, SectorSize)
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint32(h[8:], 0x00010000)
	binary.LittleEndian.PutUint32(h[12:], gptHeaderSize)
	binary.LittleEndian.PutUint64(h[24:], at)
	binary.LittleEndian.PutUint64(h[32:], alt)
	first, last := GPTUsable(sectors)
	binary.LittleEndian.PutUint64(h[40:], first)
	binary.LittleEndian.PutUint64(h[48:], last)
	copy(h[56:], disk[:])
	binary.LittleEndian.PutUint64(h[72:], entriesAt)
	binary.LittleEndian.PutUint32(h[80:], gptEntries)
	binary.LittleEndian.PutUint32(h[84:], gptEntrySize)
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:gptHeaderSize]))
	return h
}

// protectiveMBR is sector 0 of a GPT disk: one partition of type 0xEE
// over the whole disk (as far as 32 bits reach), so that tools that know
// only MBR see a disk in use; boot code from bootSector, if any.
func protectiveMBR(bootSector []byte, sectors uint64) []byte {
	mbr := make([]byte, SectorSize)
	if bootSector != nil {
		copy(mbr, bootSector[:440])
	}
	e := mbr[0x1be:]
	e[1], e[2], e[3] = 0x00, 0x02, 0x00
	e[4] = 0xee
	e[5], e[6], e[7] = 0xff, 0xff, 0xff
	binary.LittleEndian.PutUint32(e[8:], 1)
	binary.LittleEndian.PutUint32(e[12:], uint32(min(sectors-1, 0xffffffff)))
	mbr[510], mbr[511] = 0x55, 0xaa
	return mbr
}

// ReadGPT reads the GUID partition table of a disk of size bytes: the
// primary, or the backup at the disk's end when the primary's header or
// entries fail their checksums (as after a power cut while it was
// written).
func ReadGPT(r io.ReaderAt, size int64) (GPT, error) {
	sectors := uint64(size / SectorSize)
	if sectors < 3 {
		return GPT{}, fmt.Errorf("a disk of %d bytes holds no GPT", size)
	}
	g, perr := readGPTCopy(r, 1, sectors)
	if perr == nil {
		return g, nil
	}
	g, berr := readGPTCopy(r, sectors-1, sectors)
	if berr != nil {
		return GPT{}, fmt.Errorf("no valid GPT: primary: %v; backup: %v", perr, berr)
	}
	return g, nil
}

// readGPTCopy reads the GPT copy whose header is at sector at.
func readGPTCopy(r io.ReaderAt, at, sectors uint64) (GPT, error) {
	h := make([]byte, SectorSize)
	if _, err := r.ReadAt(h, int64(at)*SectorSize); err != nil {
		return GPT{}, fmt.Errorf("reading the header at sector %d: %w", at, err)
	}
	if !bytes.Equal(h[:8], []byte("EFI PART")) {
		return GPT{}, fmt.Errorf("no GPT header at sector %d", at)
	}
	hsize := binary.LittleEndian.Uint32(h[12:])
	if hsize < gptHeaderSize || hsize > SectorSize {
		return GPT{}, fmt.Errorf("the GPT header at sector %d has a size of %d bytes", at, hsize)
	}
	want := binary.LittleEndian.Uint32(h[16:])
	c := bytes.Clone(h[:hsize])
	binary.LittleEndian.PutUint32(c[16:], 0)
	if crc32.ChecksumIEEE(c) != want {
		return GPT{}, fmt.Errorf("the GPT header at sector %d fails its checksum", at)
	}
	if my := binary.LittleEndian.Uint64(h[24:]); my != at {
		return GPT{}, fmt.Errorf("the GPT header at sector %d says it is at sector %d", at, my)
	}
	entriesAt := binary.LittleEndian.Uint64(h[72:])
	count := binary.LittleEndian.Uint32(h[80:])
	esize := binary.LittleEndian.Uint32(h[84:])
	if esize < gptEntrySize || esize%8 != 0 || uint64(count)*uint64(esize) > gptMaxEntryBytes {
		return GPT{}, fmt.Errorf("the GPT header at sector %d has %d entries of %d bytes", at, count, esize)
	}
	n := uint64(count) * uint64(esize)
	if entriesAt < 1 || entriesAt+(n+SectorSize-1)/SectorSize > sectors {
		return GPT{}, fmt.Errorf("the GPT header at sector %d places its entries at sector %d, past the disk's end", at, entriesAt)
	}
	entries := make([]byte, n)
	if _, err := r.ReadAt(entries, int64(entriesAt)*SectorSize); err != nil {
		return GPT{}, fmt.Errorf("reading the GPT entries at sector %d: %w", entriesAt, err)
	}
	if crc32.ChecksumIEEE(entries) != binary.LittleEndian.Uint32(h[88:]) {
		return GPT{}, fmt.Errorf("the GPT entries at sector %d fail their checksum", entriesAt)
	}
	var g GPT
	copy(g.DiskID[:], h[56:72])
	for i := uint32(0); i < count; i++ {
		e := entries[uint64(i)*uint64(esize):]
		var p GPTPartition
		copy(p.Type[:], e[0:16])
		if p.Type == (GUID{}) {
			continue
		}
		copy(p.ID[:], e[16:32])
		p.First = binary.LittleEndian.Uint64(e[32:])
		p.Last = binary.LittleEndian.Uint64(e[40:])
		p.Attributes = binary.LittleEndian.Uint64(e[48:])
		name := make([]uint16, 0, 36)
		for k := 0; k < 36; k++ {
			u := binary.LittleEndian.Uint16(e[56+2*k:])
			if u == 0 {
				break
			}
			name = append(name, u)
		}
		p.Name = string(utf16.Decode(name))
		g.Partitions = append(g.Partitions, p)
	}
	return g, nil
}
