// Package watchdog keeps a trial boot's watchdog fed: the image's init arms it, liken-node feeds it and disarms it on commit.
package watchdog

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDevice is the Linux watchdog device (hardware, or the kernel's
// softdog when the machine has none).
const DefaultDevice = "/dev/watchdog"

// Watchdog is an armed watchdog: the machine resets unless it is fed
// within its timeout.
type Watchdog interface {
	// Keepalive feeds it: the timeout starts again.
	Keepalive() error
	// Disarm stops it for good (the magic close): the trial committed.
	Disarm() error
	// Close lets go of it without stopping it: the timer keeps running
	// and the machine resets unless someone opens and feeds it again.
	Close() error
}

// Device is a Linux watchdog device opened with Open.
type Device struct {
	f *os.File
}

var _ Watchdog = (*Device)(nil)

// Open opens the watchdog device, which arms it if it was not armed (the
// kernel allows one opener at a time), and sets its timeout when timeout
// is more than 0.
func Open(path string, timeout time.Duration) (*Device, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the watchdog %s: %w", path, err)
	}
	d := &Device{f: f}
	if timeout > 0 {
		secs := int(timeout / time.Second)
		if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.WDIOC_SETTIMEOUT, secs); err != nil {
			// The device keeps its own timeout: it still resets a hang.
			_ = d.Keepalive()
			return d, fmt.Errorf("setting the timeout of the watchdog %s to %ds (it keeps its own): %w", path, secs, err)
		}
	}
	return d, d.Keepalive()
}

// Keepalive feeds the watchdog (WDIOC_KEEPALIVE).
func (d *Device) Keepalive() error {
	if _, err := unix.IoctlGetInt(int(d.f.Fd()), unix.WDIOC_KEEPALIVE); err != nil {
		// Some drivers lack the ioctl; any write feeds them too.
		if _, werr := d.f.Write([]byte{0}); werr != nil {
			return fmt.Errorf("feeding the watchdog: %w", errors.Join(err, werr))
		}
	}
	return nil
}

// Disarm writes the magic character 'V' and closes the device, which stops
// the watchdog (unless the kernel was built with nowayout).
func (d *Device) Disarm() error {
	if _, err := d.f.Write([]byte("V")); err != nil {
		d.f.Close()
		return fmt.Errorf("disarming the watchdog: %w", err)
	}
	return d.f.Close()
}

// Close closes the device without the magic character: the watchdog
// stays armed.
func (d *Device) Close() error { return d.f.Close() }
