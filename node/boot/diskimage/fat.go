package diskimage

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// FAT32 layout of the file systems WriteFAT32 makes: one sector per
// cluster, the reserved sectors and backup boot sector FAT32 expects.
const (
	fatReserved     = 32
	fatCopies       = 2
	fatBackupBoot   = 6
	fatFSInfo       = 1
	fatRootCluster  = 2
	fatMinClusters  = 65525 // fewer make it FAT16 by the specification's rule
	fatDirEntrySize = 32
	fatEOC          = 0x0FFFFFFF
)

// MinFAT32Size is the smallest file system WriteFAT32 makes, in bytes (33
// MiB: FAT32 needs 65,525 clusters).
const MinFAT32Size = 33 << 20

// WriteFAT32 makes a FAT32 file system of size bytes at offset on w,
// labelled label, holding files: each path ("EFI/BOOT/BOOTX64.EFI") is
// made of 8.3 names in upper case, and its folders are made for it. It
// writes every sector of the file system's metadata (the region may hold
// anything before) and the files' clusters; the rest of the data area is
// left as it is, free in the table. It is what an EFI system partition
// needs, no more: no long names, one sector per cluster.
func WriteFAT32(w io.WriterAt, offset, size int64, label string, files map[string][]byte) error {
	if size%SectorSize != 0 || offset%SectorSize != 0 {
		return fmt.Errorf("a FAT32 file system at %d of %d bytes: not whole %d-byte sectors", offset, size, SectorSize)
	}
	if size < MinFAT32Size {
		return fmt.Errorf("a FAT32 file system of %d bytes is too small: it needs at least %d (65,525 clusters)", size, MinFAT32Size)
	}
	vol, err := fatName(label, true)
	if err != nil {
		return fmt.Errorf("label %q: %w", label, err)
	}
	total := uint64(size / SectorSize)
	if total > 0xffffffff {
		return fmt.Errorf("a FAT32 file system of %d bytes is too large", size)
	}
	// The table's size, as the specification computes it for FAT32.
	fatSize := (total - fatReserved + (256+fatCopies)/2 - 1) / ((256 + fatCopies) / 2)
	dataStart := uint64(fatReserved + fatCopies*fatSize)
	clusters := total - dataStart
	if clusters < fatMinClusters {
		return fmt.Errorf("a FAT32 file system of %d bytes holds %d clusters, fewer than FAT32's %d", size, clusters, fatMinClusters)
	}

	// The tree: every folder of every path, and the files.
	tree, err := fatTree(files)
	if err != nil {
		return err
	}
	table := make([]uint32, clusters+2)
	table[0], table[1] = 0x0FFFFFF8, fatEOC
	next := uint32(fatRootCluster)
	full := false
	alloc := func(bytes int) uint32 {
		n := uint32(max(1, (bytes+SectorSize-1)/SectorSize))
		if uint64(next)+uint64(n) > uint64(len(table)) {
			full = true
			return 0
		}
		first := next
		for c := first; c < first+n; c++ {
			table[c] = c + 1
		}
		table[first+n-1] = fatEOC
		next += n
		return first
	}
	type extent struct {
		cluster uint32
		data    []byte
	}
	var extents []extent
	// Folders first (root at cluster 2), breadth first, then files.
	var place func(d *fatDir, self, parent uint32, root bool)
	place = func(d *fatDir, self, parent uint32, root bool) {
		var entries []byte
		if root {
			entries = append(entries, fatEntry(vol, 0x08, 0, 0)...)
		} else {
			entries = append(entries, fatEntry(".          ", 0x10, self, 0)...)
			entries = append(entries, fatEntry("..         ", 0x10, parent, 0)...)
		}
		names := slices.Sorted(maps.Keys(d.dirs))
		firsts := map[string]uint32{}
		for _, n := range names {
			sub := d.dirs[n]
			c := alloc(fatDirEntrySize * (2 + len(sub.dirs) + len(sub.files)))
			firsts[n] = c
			entries = append(entries, fatEntry(n, 0x10, c, 0)...)
		}
		files := slices.Sorted(maps.Keys(d.files))
		for _, n := range files {
			data := d.files[n]
			var c uint32
			if len(data) > 0 {
				c = alloc(len(data))
				extents = append(extents, extent{c, data})
			}
			entries = append(entries, fatEntry(n, 0x20, c, uint32(len(data)))...)
		}
		extents = append(extents, extent{self, entries})
		// ".." of a folder in the root names cluster 0.
		parentOfSubs := self
		if root {
			parentOfSubs = 0
		}
		for _, n := range names {
			place(d.dirs[n], firsts[n], parentOfSubs, false)
		}
	}
	rootEntries := 1 + len(tree.dirs) + len(tree.files)
	root := alloc(fatDirEntrySize * rootEntries)
	place(tree, root, 0, true)
	if full {
		return fmt.Errorf("the files do not fit in a FAT32 file system of %d bytes", size)
	}
	used := uint64(next) - fatRootCluster

	// The reserved sectors: boot sector, FSInfo, their backups.
	reserved := make([]byte, fatReserved*SectorSize)
	bs := reserved[:SectorSize]
	copy(bs, []byte{0xEB, 0x58, 0x90})
	copy(bs[3:], "LIKEN   ")
	binary.LittleEndian.PutUint16(bs[11:], SectorSize)
	bs[13] = 1 // sectors per cluster
	binary.LittleEndian.PutUint16(bs[14:], fatReserved)
	bs[16] = fatCopies
	bs[21] = 0xF8 // fixed disk
	binary.LittleEndian.PutUint16(bs[24:], 63)
	binary.LittleEndian.PutUint16(bs[26:], 255)
	binary.LittleEndian.PutUint32(bs[28:], uint32(offset/SectorSize))
	binary.LittleEndian.PutUint32(bs[32:], uint32(total))
	binary.LittleEndian.PutUint32(bs[36:], uint32(fatSize))
	binary.LittleEndian.PutUint32(bs[44:], fatRootCluster)
	binary.LittleEndian.PutUint16(bs[48:], fatFSInfo)
	binary.LittleEndian.PutUint16(bs[50:], fatBackupBoot)
	bs[64] = 0x80
	bs[66] = 0x29
	binary.LittleEndian.PutUint32(bs[67:], fatVolumeID(label, total))
	copy(bs[71:], vol)
	copy(bs[82:], "FAT32   ")
	bs[510], bs[511] = 0x55, 0xAA
	fsinfo := reserved[fatFSInfo*SectorSize : (fatFSInfo+1)*SectorSize]
	binary.LittleEndian.PutUint32(fsinfo[0:], 0x41615252)
	binary.LittleEndian.PutUint32(fsinfo[484:], 0x61417272)
	binary.LittleEndian.PutUint32(fsinfo[488:], uint32(clusters-used))
	binary.LittleEndian.PutUint32(fsinfo[492:], next)
	binary.LittleEndian.PutUint32(fsinfo[508:], 0xAA550000)
	copy(reserved[fatBackupBoot*SectorSize:], reserved[:2*SectorSize])

	fat := make([]byte, fatSize*SectorSize)
	for i, v := range table {
		binary.LittleEndian.PutUint32(fat[4*i:], v)
	}
	if _, err := w.WriteAt(reserved, offset); err != nil {
		return fmt.Errorf("writing the FAT32 boot sectors: %w", err)
	}
	for i := range uint64(fatCopies) {
		if _, err := w.WriteAt(fat, offset+int64(fatReserved+i*fatSize)*SectorSize); err != nil {
			return fmt.Errorf("writing FAT %d: %w", i+1, err)
		}
	}
	for _, e := range extents {
		padded := make([]byte, (len(e.data)+SectorSize-1)/SectorSize*SectorSize)
		if len(padded) == 0 {
			padded = make([]byte, SectorSize)
		}
		copy(padded, e.data)
		at := offset + int64(dataStart+uint64(e.cluster-fatRootCluster))*SectorSize
		if _, err := w.WriteAt(padded, at); err != nil {
			return fmt.Errorf("writing the FAT32 data: %w", err)
		}
	}
	return nil
}

// fatDir is a folder of the tree WriteFAT32 writes, by 8.3 name.
type fatDir struct {
	dirs  map[string]*fatDir
	files map[string][]byte
}

// fatTree is files as folders, by 8.3 names; a path that is not 8.3 names
// in upper case, or a file where a folder is, is refused.
func fatTree(files map[string][]byte) (*fatDir, error) {
	root := &fatDir{dirs: map[string]*fatDir{}, files: map[string][]byte{}}
	// In order, so that the same files meet the same error.
	for _, path := range slices.Sorted(maps.Keys(files)) {
		data := files[path]
		parts := strings.Split(path, "/")
		d := root
		for i, p := range parts {
			name, err := fatName(p, false)
			if err != nil {
				return nil, fmt.Errorf("file %q: %w", path, err)
			}
			if i == len(parts)-1 {
				if _, ok := d.dirs[name]; ok {
					return nil, fmt.Errorf("file %q: a folder of that name is there too", path)
				}
				d.files[name] = data
				break
			}
			if _, ok := d.files[name]; ok {
				return nil, fmt.Errorf("file %q: %s is a file, not a folder", path, p)
			}
			sub := d.dirs[name]
			if sub == nil {
				sub = &fatDir{dirs: map[string]*fatDir{}, files: map[string][]byte{}}
				d.dirs[name] = sub
			}
			d = sub
		}
	}
	return root, nil
}

// fatName is name as the 11 bytes of a directory entry: an 8.3 name in
// upper case letters, digits, '-' and '_' (a label: up to 11 of them,
// spaces allowed).
func fatName(name string, label bool) (string, error) {
	ok := func(s string, spaces bool) bool {
		for _, r := range s {
			if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || spaces && r == ' ') {
				return false
			}
		}
		return true
	}
	if label {
		if name == "" || len(name) > 11 || !ok(name, true) {
			return "", fmt.Errorf("want 1 to 11 upper case letters, digits, '-', '_' or spaces")
		}
		return fmt.Sprintf("%-11s", name), nil
	}
	base, ext, _ := strings.Cut(name, ".")
	if base == "" || len(base) > 8 || len(ext) > 3 || !ok(base, false) || !ok(ext, false) {
		return "", fmt.Errorf("%q is not an 8.3 name in upper case (such as BOOTX64.EFI)", name)
	}
	return fmt.Sprintf("%-8s%-3s", base, ext), nil
}

// fatEntry is a directory entry for name (11 bytes), with attributes attr,
// starting at cluster, of size bytes. Times are left at their zero,
// 1980-01-01, so that the same files make the same bytes.
func fatEntry(name string, attr byte, cluster, size uint32) []byte {
	e := make([]byte, fatDirEntrySize)
	copy(e, name)
	e[11] = attr
	binary.LittleEndian.PutUint16(e[16:], 1<<5|1) // created 1980-01-01
	binary.LittleEndian.PutUint16(e[18:], 1<<5|1)
	binary.LittleEndian.PutUint16(e[20:], uint16(cluster>>16))
	binary.LittleEndian.PutUint16(e[24:], 1<<5|1)
	binary.LittleEndian.PutUint16(e[26:], uint16(cluster))
	binary.LittleEndian.PutUint32(e[28:], size)
	return e
}

// fatVolumeID is a serial number derived from the label and size, so that
// the same file system makes the same bytes.
func fatVolumeID(label string, sectors uint64) uint32 {
	h := uint32(2166136261)
	for _, b := range []byte(label) {
		h = (h ^ uint32(b)) * 16777619
	}
	return h ^ uint32(sectors)
}
