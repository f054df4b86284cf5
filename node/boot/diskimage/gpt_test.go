package diskimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// testDisk is a sparse image file of size bytes.
func testDisk(t *testing.T, size int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	assert.NilError(t, err)
	t.Cleanup(func() { f.Close() })
	assert.NilError(t, f.Truncate(size))
	return f
}

// testTable is a UEFI-and-BIOS disk's table: a BIOS boot partition, an
// ESP and two Linux file systems, with their own GUIDs.
func testTable(t *testing.T, sectors uint64) GPT {
	t.Helper()
	id := func() GUID {
		g, err := NewGUID()
		assert.NilError(t, err)
		return g
	}
	_, last := GPTUsable(sectors)
	return GPT{DiskID: id(), Partitions: []GPTPartition{
		{Type: GUIDBIOSBoot, ID: id(), First: 2048, Last: 4095, Name: "bios"},
		{Type: GUIDESP, ID: id(), First: 4096, Last: 8191, Name: "EFI system"},
		{Type: GUIDLinuxFS, ID: id(), First: 8192, Last: 16383, Name: "liken-boot"},
		{Type: GUIDLinuxFS, ID: id(), First: 16384, Last: last, Name: "liken-slots", Attributes: 1 << 60},
	}}
}

// TestGPTAgreesWithUtilLinux: the table WriteGPT writes is the one
// util-linux reads (partx: each partition's place, type, name and GUID;
// blkid: a GPT with the disk's GUID), and ReadGPT reads it back whole.
func TestGPTAgreesWithUtilLinux(t *testing.T) {
	const size = 64 << 20
	d := testDisk(t, size)
	g := testTable(t, size/SectorSize)
	assert.NilError(t, WriteGPT(d, size, g, nil))

	out, err := exec.Command("partx", "--raw", "--noheadings", "--output", "NR,START,END,TYPE,NAME,UUID", d.Name()).CombinedOutput()
	assert.NilError(t, err, "%s", out)
	var want []string
	for i, p := range g.Partitions {
		want = append(want, fmt.Sprintf("%d %d %d %s %s %s", i+1, p.First, p.Last, strings.ToLower(p.Type.String()),
			strings.ReplaceAll(p.Name, " ", `\x20`), strings.ToLower(p.ID.String())))
	}
	assert.DeepEqual(t, strings.Split(strings.TrimSpace(string(out)), "\n"), want)

	out, err = exec.Command("blkid", "-p", "-o", "export", d.Name()).CombinedOutput()
	assert.NilError(t, err, "%s", out)
	assert.Check(t, is.Contains(string(out), "PTTYPE=gpt\n"))
	assert.Check(t, is.Contains(string(out), "PTUUID="+strings.ToLower(g.DiskID.String())+"\n"))

	got, err := ReadGPT(d, size)
	assert.NilError(t, err)
	assert.DeepEqual(t, got, g)
}

// TestGUIDText: a GUID's text form and its bytes on disk, whose first
// three fields are little-endian (the ESP's type as the specification
// gives it).
func TestGUIDText(t *testing.T) {
	assert.DeepEqual(t, GUIDESP[:], []byte{0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9, 0x3b})
	assert.Equal(t, GUIDESP.String(), "C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	g, err := NewGUID()
	assert.NilError(t, err)
	back, err := ParseGUID(strings.ToLower(g.String()))
	assert.NilError(t, err)
	assert.Equal(t, back, g)
	for _, bad := range []string{"", "C12A7328F81F11D2BA4B00A0C93EC93B", "C12A7328-F81F-11D2-BA4B-00A0C93EC93", "G12A7328-F81F-11D2-BA4B-00A0C93EC93B"} {
		_, err := ParseGUID(bad)
		assert.Check(t, err != nil, "ParseGUID(%q) took it", bad)
	}
}

// TestReadGPTFallsBackToTheBackup: a primary table whose header or
// entries a power cut left half-written is passed over for the backup;
// with both broken, the error says what is wrong with each.
func TestReadGPTFallsBackToTheBackup(t *testing.T) {
	const size = 16 << 20
	for _, tc := range []struct {
		name    string
		corrupt []int64 // byte offsets flipped
		wantErr string
	}{
		{name: "the primary header", corrupt: []int64{SectorSize + 60}},
		{name: "the primary entries", corrupt: []int64{2*SectorSize + 40}},
		{name: "both headers", corrupt: []int64{SectorSize + 60, size - SectorSize + 60},
			wantErr: "no valid GPT: primary: the GPT header at sector 1 fails its checksum; backup: the GPT header at sector 32767 fails its checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDisk(t, size)
			g := testTable(t, size/SectorSize)
			assert.NilError(t, WriteGPT(d, size, g, nil))
			for _, off := range tc.corrupt {
				b := make([]byte, 1)
				_, err := d.ReadAt(b, off)
				assert.NilError(t, err)
				b[0] ^= 0xff
				_, err = d.WriteAt(b, off)
				assert.NilError(t, err)
			}
			got, err := ReadGPT(d, size)
			if tc.wantErr != "" {
				assert.Error(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, g)
		})
	}
}

// TestProtectiveMBRKeepsTheBootCode: a BIOS boot sector's code stays in
// sector 0, whose one partition (type 0xEE) covers the disk for tools
// that know only MBR.
func TestProtectiveMBRKeepsTheBootCode(t *testing.T) {
	const size = 16 << 20
	d := testDisk(t, size)
	boot := make([]byte, SectorSize)
	for i := range boot {
		boot[i] = byte(i)
	}
	assert.NilError(t, WriteGPT(d, size, testTable(t, size/SectorSize), boot))
	mbr := make([]byte, SectorSize)
	_, err := d.ReadAt(mbr, 0)
	assert.NilError(t, err)
	assert.DeepEqual(t, mbr[:440], boot[:440])
	parts, err := ReadPartitions(mbr)
	assert.NilError(t, err)
	assert.DeepEqual(t, parts, []Partition{{Start: 1, Sectors: size/SectorSize - 1, Type: 0xee}})
}

// TestWriteGPTRefuses: a table that does not fit the disk is refused
// with the partition and the problem named, and nothing is written.
func TestWriteGPTRefuses(t *testing.T) {
	const size = 16 << 20
	sectors := uint64(size / SectorSize)
	_, last := GPTUsable(sectors)
	for _, tc := range []struct {
		name    string
		parts   []GPTPartition
		wantErr string
	}{
		{"over the primary table", []GPTPartition{{Type: GUIDLinuxFS, First: 33, Last: 100, Name: "a"}},
			`partition 1 ("a"): sectors 33 to 100 are outside 34 to 32734, where partitions may lie on a disk of 32768 sectors`},
		{"over the backup table", []GPTPartition{{Type: GUIDLinuxFS, First: 2048, Last: last + 1, Name: "a"}},
			`partition 1 ("a"): sectors 2048 to 32735 are outside 34 to 32734, where partitions may lie on a disk of 32768 sectors`},
		{"overlapping", []GPTPartition{{Type: GUIDLinuxFS, First: 2048, Last: 4096, Name: "a"}, {Type: GUIDLinuxFS, First: 4096, Last: 8191, Name: "b"}},
			`partition 2 ("b") overlaps partition 1 ("a")`},
		{"no type", []GPTPartition{{First: 2048, Last: 4095, Name: "a"}}, `partition 1 ("a") has no type`},
		{"a long name", []GPTPartition{{Type: GUIDLinuxFS, First: 2048, Last: 4095, Name: strings.Repeat("n", 37)}},
			`partition 1: name "` + strings.Repeat("n", 37) + `" is longer than 36 UTF-16 units`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDisk(t, size)
			assert.Error(t, WriteGPT(d, size, GPT{Partitions: tc.parts}, nil), tc.wantErr)
			_, err := ReadGPT(d, size)
			assert.ErrorContains(t, err, "no valid GPT")
		})
	}
}
