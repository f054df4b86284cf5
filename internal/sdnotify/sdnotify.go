// Package sdnotify tells the service manager that runs a liken process (systemd on a liken machine) that it is ready and alive.
package sdnotify

import (
	"context"
	"net"
	"os"
	"strconv"
	"time"

	"k8s.io/klog/v2"
)

// Notify sends state (such as "READY=1") to the service manager. Without
// a service manager (NOTIFY_SOCKET unset) it does nothing.
func Notify(state string) error {
	socket := os.Getenv("NOTIFY_SOCKET")
	if socket == "" {
		return nil
	}
	if socket[0] == '@' {
		socket = "\x00" + socket[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// WatchdogInterval returns how often the service manager expects a
// keepalive (half its WatchdogSec), or 0 when it watches nothing.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}

// Keepalive sends WATCHDOG=1 every interval until ctx ends, while alive
// returns nil. A process that hangs, or whose alive says it is stuck,
// stops answering, and the service manager restarts it; alive's error is
// logged once per stuck spell.
func Keepalive(ctx context.Context, interval time.Duration, alive func() error) {
	if interval <= 0 {
		return
	}
	log := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	stuck := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := alive(); err != nil {
				if !stuck {
					log.Error(err, "Not answering the service manager's watchdog: it restarts this process")
				}
				stuck = true
				continue
			}
			stuck = false
			_ = Notify("WATCHDOG=1")
		}
	}
}
