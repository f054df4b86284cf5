// Package diskread makes the next reads of a file come from the disk, not
// from the page cache, so that a verification sees the bytes the boot
// loader will read.
package diskread

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Uncached writes f's dirty pages to the disk and drops its pages from
// the page cache: the next read of f reads the disk. A write the disk
// acknowledged but lost is then seen by the reader, as GRUB would see it.
// File systems that keep files in memory (tmpfs) keep them.
func Uncached(f *os.File) error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("writing %s to the disk before reading it back: %w", f.Name(), err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping %s from the page cache: %w", f.Name(), err)
	}
	return nil
}
