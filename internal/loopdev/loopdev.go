// Package loopdev attaches a file to a loop device, as a boot does with a slot's squashfs.
package loopdev

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Attach attaches file to a free loop device, read-only, and returns the
// device. The device detaches itself when its last user is gone: call
// release once it is mounted.
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
	if err := unix.IoctlLoopConfigure(int(l.Fd()), cfg); err != nil {
		l.Close()
		return "", nil, fmt.Errorf("attaching %s to %s: %w", file, dev, err)
	}
	return dev, func() { l.Close() }, nil
}
