// Package loopdev attaches a file to a loop device, as a boot does with a slot's squashfs.
package loopdev

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// attempts bounds how often Attach asks for another free device when
// another process configured the one it was given first.
const attempts = 32

// Attach attaches file to a free loop device, read-only, and returns the
// device. The device detaches itself when its last user is gone: call
// release once it is mounted. Machines that boot at the same moment may
// be given the same free device: the one that configures it second asks
// for another.
func Attach(file string) (dev string, release func(), err error) {
	f, err := os.Open(file)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, err
	}
	defer ctl.Close()
	for range attempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("finding a free loop device: %w", err)
		}
		dev = fmt.Sprintf("/dev/loop%d", n)
		l, err := os.OpenFile(dev, os.O_RDONLY, 0)
		if err != nil {
			return "", nil, err
		}
		cfg := &unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY | unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(l.Fd()), cfg)
		if err == nil {
			return dev, func() { l.Close() }, nil
		}
		l.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("attaching %s to %s: %w", file, dev, err)
		}
	}
	return "", nil, fmt.Errorf("attaching %s: every free loop device was taken by another process first, %d times", file, attempts)
}
