package install

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// host is where liken install learns what uses a disk. Its zero value
// reads the running system.
type host struct {
	// mountinfo, swaps and sysfs default to /proc/self/mountinfo,
	// /proc/swaps and /sys.
	mountinfo, swaps, sysfs string
}

func (h host) paths() (mountinfo, swaps, sysfs string) {
	mountinfo, swaps, sysfs = h.mountinfo, h.swaps, h.sysfs
	if mountinfo == "" {
		mountinfo = "/proc/self/mountinfo"
	}
	if swaps == "" {
		swaps = "/proc/swaps"
	}
	if sysfs == "" {
		sysfs = "/sys"
	}
	return
}

// disk is the disk being written.
type disk struct {
	path    string
	f       *os.File
	device  bool  // a block device, else an image file
	size    int64 // of a block device
	created bool  // a new image file, removed if the install fails
}

// reopen opens the disk again after mke2fs wrote to it (mke2fs opens a
// block device exclusively too, so the disk is closed while it runs).
func (d *disk) reopen() error {
	flags := os.O_RDWR
	if d.device {
		flags |= os.O_EXCL
	}
	f, err := os.OpenFile(d.path, flags, 0)
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("%s became busy while it was written: another program opened or mounted it; run liken install again once it is free", d.path)
	}
	if err != nil {
		return err
	}
	d.f = f
	return nil
}

func (d *disk) Close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

// openDisk opens the disk for writing after checking that nothing uses
// it. A block device is opened with O_EXCL, which the kernel refuses while
// it or one of its partitions is mounted or held; the file stays open
// until the disk is written.
func (h host) openDisk(path string) (*disk, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// A new image file: nothing can use it yet.
		f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, fmt.Errorf("creating the image file: %w", err)
		}
		return &disk{path: abs, f: f, created: true}, nil
	case err != nil:
		return nil, err
	case fi.Mode().IsRegular():
		if err := h.fileInUse(abs, fi); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(abs, os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		return &disk{path: abs, f: f}, nil
	case fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0:
		if err := h.deviceInUse(abs, fi); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(abs, os.O_RDWR|os.O_EXCL, 0)
		if errors.Is(err, syscall.EBUSY) {
			return nil, fmt.Errorf("%s is in use: another program holds it open exclusively (a mounted file system, a RAID or device-mapper member, a partitioning tool); stop it and retry", path)
		}
		if err != nil {
			return nil, fmt.Errorf("opening %s for writing: %w", path, err)
		}
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("reading the size of %s: %w", path, err)
		}
		return &disk{path: abs, f: f, device: true, size: size}, nil
	default:
		return nil, fmt.Errorf("%s is neither an image file nor a block device", path)
	}
}

// prepare sizes an image file (emptied first: every byte reads zero) and
// wipes the first and the last MiB of a block device: the boot code and
// the partition tables are written last.
func (d *disk) prepare(size int64) error {
	if !d.device {
		if err := d.f.Truncate(0); err != nil {
			return fmt.Errorf("emptying %s: %w", d.path, err)
		}
		if err := d.f.Truncate(size); err != nil {
			return fmt.Errorf("sizing %s to %d bytes: %w", d.path, size, err)
		}
		return nil
	}
	// Both ends: a backup GPT left at the end of the disk would let
	// firmware find the old partitions while the new ones are written.
	for _, at := range []int64{0, size - mib} {
		if _, err := d.f.WriteAt(make([]byte, mib), at); err != nil {
			return fmt.Errorf("wiping the partition tables of %s: %w", d.path, err)
		}
	}
	return d.f.Sync()
}

// fileInUse refuses an image file attached to a loop device or mounted
// (or bind-mounted) somewhere.
func (h host) fileInUse(path string, fi os.FileInfo) error {
	mountinfo, _, sysfs := h.paths()
	loops, _ := filepath.Glob(filepath.Join(sysfs, "block", "loop*", "loop", "backing_file"))
	for _, l := range loops {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if backing == path || sameFile(backing, fi) {
			dev := filepath.Base(filepath.Dir(filepath.Dir(l)))
			return fmt.Errorf("%s is in use: it is attached to /dev/%s (unmount what uses it and run losetup -d /dev/%s)", path, dev, dev)
		}
	}
	mounts, err := readMountinfo(mountinfo)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if m.source == path || m.point == path {
			return fmt.Errorf("%s is in use: it is mounted on %s; unmount it first", path, m.point)
		}
	}
	return nil
}

func sameFile(p string, fi os.FileInfo) bool {
	o, err := os.Stat(p)
	return err == nil && os.SameFile(o, fi)
}

// deviceInUse refuses a partition, and a disk that is (or has a partition
// that is) mounted, used as swap, or held by another device (device
// mapper, RAID, LVM).
func (h host) deviceInUse(path string, fi os.FileInfo) error {
	mountinfo, swaps, sysfs := h.paths()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: cannot read its device number", path)
	}
	self := devName(uint64(st.Rdev))
	dir := filepath.Join(sysfs, "dev", "block", self)
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		return fmt.Errorf("%s is a partition: give the whole disk (liken install writes its own partition table)", path)
	}
	// The disk and its partitions, by device number and name.
	devs := map[string]string{self: path}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "dev")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, e.Name(), "partition")); err == nil {
				devs[strings.TrimSpace(string(b))] = "/dev/" + e.Name()
			}
		}
	}
	mounts, err := readMountinfo(mountinfo)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if name, ok := devs[m.dev]; ok {
			return fmt.Errorf("%s is in use: %s is mounted on %s; unmount it first", path, name, m.point)
		}
	}
	if b, err := os.ReadFile(swaps); err == nil {
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if s, err := os.Stat(f[0]); err == nil {
				if ss, ok := s.Sys().(*syscall.Stat_t); ok && s.Mode()&os.ModeDevice != 0 {
					if name, ok := devs[devName(uint64(ss.Rdev))]; ok {
						return fmt.Errorf("%s is in use: %s is swap space; swapoff %s first", path, name, f[0])
					}
				}
			}
		}
	}
	for dev, name := range devs {
		held, _ := os.ReadDir(filepath.Join(sysfs, "dev", "block", dev, "holders"))
		if len(held) > 0 {
			return fmt.Errorf("%s is in use: %s is held by %s (device mapper, RAID or LVM); release it first", path, name, held[0].Name())
		}
	}
	return nil
}

// devName is a device number as the kernel writes it: major:minor.
func devName(rdev uint64) string {
	major := (rdev>>8)&0xfff | (rdev>>32)&0xfffff000
	minor := rdev&0xff | (rdev>>12)&0xffffff00
	return fmt.Sprintf("%d:%d", major, minor)
}

type mount struct{ dev, point, source string }

// readMountinfo reads the mounts of /proc/self/mountinfo: the device
// number, the mount point and the mount source of each.
func readMountinfo(path string) ([]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the mounts to check the disk is free: %w", err)
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		m := mount{dev: fields[2], point: unescape(fields[4])}
		for i, f := range fields {
			if f == "-" && i+2 < len(fields) {
				m.source = unescape(fields[i+2])
				break
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			ok := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					ok = false
					break
				}
				c = c*8 + byte(d-'0')
			}
			if ok {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
