package boot

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// The boot partition stays read-only but while liken-node writes to it
// (liken-boot mounts it so, after e2fsck -p): ext2 has no journal, and a
// power cut while it is mounted read-write can leave its bitmaps wrong
// even when nothing was being written. Writable makes it writable for the
// time of a write; the last writer to finish makes it read-only again.
var writable = struct {
	sync.Mutex
	mounts map[string]*writers
}{mounts: map[string]*writers{}}

// writers counts the writes under way to one mount.
type writers struct {
	n          int
	remounted  bool
	mountPoint string
}

// extMagic is the ext2/3/4 file systems' magic number in statfs.
const extMagic = 0xEF53

// Writable makes the file system that holds path writable until release
// is called; calls may overlap and nest. Only a read-only ext file system
// mounted on its own (the boot partition on a machine) is remounted: a
// folder on any other file system (a test's, the lab's) is left as it is,
// and so is a boot partition liken-boot could not repair and did not
// mount, whose writes then fail with the error of the file system below.
func Writable(path string) (release func(), err error) {
	mp, err := mountPoint(path)
	if err != nil {
		return nil, err
	}
	writable.Lock()
	defer writable.Unlock()
	w := writable.mounts[mp]
	if w == nil {
		w = &writers{mountPoint: mp}
		writable.mounts[mp] = w
	}
	if w.n == 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(mp, &st); err != nil {
			return nil, fmt.Errorf("reading the file system of %s: %w", mp, err)
		}
		if st.Type == extMagic && st.Flags&unix.ST_RDONLY != 0 {
			if err := unix.Mount("", mp, "", unix.MS_REMOUNT, ""); err != nil {
				return nil, fmt.Errorf("making the boot partition %s writable: %w", mp, err)
			}
			w.remounted = true
		}
	}
	w.n++
	var once sync.Once
	return func() { once.Do(func() { w.release() }) }, nil
}

// release ends one write; the last one syncs the file system and mounts
// it read-only again when Writable had made it writable.
func (w *writers) release() {
	writable.Lock()
	defer writable.Unlock()
	w.n--
	if w.n > 0 || !w.remounted {
		return
	}
	w.remounted = false
	if f, err := os.Open(w.mountPoint); err == nil {
		_ = unix.Syncfs(int(f.Fd()))
		f.Close()
	}
	if err := unix.Mount("", w.mountPoint, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		// It stays writable until the next write ends, or the next boot.
		klog.ErrorS(err, "The boot partition stays writable: it could not be mounted read-only again", "mountPoint", w.mountPoint)
	}
}

// mountPoint is the root of the mount that holds path (or its nearest
// folder that exists): the highest folder above it on the same device.
func mountPoint(path string) (string, error) {
	p, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	for {
		err := unix.Stat(p, &st)
		if err == nil {
			break
		}
		if err != unix.ENOENT || p == "/" {
			return "", fmt.Errorf("reading %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
	for p != "/" {
		var up unix.Stat_t
		if err := unix.Stat(filepath.Dir(p), &up); err != nil {
			return "", fmt.Errorf("reading %s: %w", filepath.Dir(p), err)
		}
		if up.Dev != st.Dev {
			break
		}
		p = filepath.Dir(p)
	}
	return p, nil
}
