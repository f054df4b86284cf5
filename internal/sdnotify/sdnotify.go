// Package sdnotify tells the service manager that runs a liken process (systemd on a liken machine) that it is ready and alive.
package sdnotify

import (
	"context"
	"net"
	"os"
	"strconv"
	"time"
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

// Keepalive sends WATCHDOG=1 every interval until ctx ends. A process
// that hangs stops answering, and the service manager restarts it.
func Keepalive(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = Notify("WATCHDOG=1")
		}
	}
}
