package sdnotify

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
)

// listen stands in for the service manager's notification socket.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	assert.NilError(t, err)
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

func read(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	assert.NilError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	b := make([]byte, 256)
	n, err := conn.Read(b)
	assert.NilError(t, err)
	return string(b[:n])
}

func TestNotifyReachesTheServiceManager(t *testing.T) {
	conn := listen(t)
	assert.NilError(t, Notify("READY=1"))
	assert.Equal(t, read(t, conn), "READY=1")
}

func TestNotifyWithoutServiceManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	assert.NilError(t, Notify("READY=1"))
}

func TestWatchdogInterval(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "60000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	assert.Equal(t, WatchdogInterval(), 30*time.Second)
	// Meant for another process (a parent that did not unset it).
	t.Setenv("WATCHDOG_PID", "1")
	assert.Equal(t, WatchdogInterval(), time.Duration(0))
	t.Setenv("WATCHDOG_USEC", "")
	assert.Equal(t, WatchdogInterval(), time.Duration(0))
}

// TestKeepaliveUntilStopped: keepalives arrive every interval, and none
// after the process stops answering.
func TestKeepaliveUntilStopped(t *testing.T) {
	conn := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Keepalive(ctx, 10*time.Millisecond, func() error { return nil }); close(done) }()
	assert.Equal(t, read(t, conn), "WATCHDOG=1")
	assert.Equal(t, read(t, conn), "WATCHDOG=1")
	cancel()
	<-done
	// Drain what was sent before it stopped, then expect silence.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		assert.NilError(t, conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		if _, err := conn.Read(make([]byte, 64)); err != nil {
			return poll.Success()
		}
		return poll.Continue("still receiving keepalives")
	}, poll.WithTimeout(5*time.Second))
}

// TestNoKeepaliveWhileStuck: while alive reports the process stuck, no
// keepalive leaves; once it recovers they resume.
func TestNoKeepaliveWhileStuck(t *testing.T) {
	conn := listen(t)
	var mu sync.Mutex
	stuck, asked := true, 0
	alive := func() error {
		mu.Lock()
		defer mu.Unlock()
		asked++
		if stuck {
			return errors.New("a reconcile has run for 11m0s")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Keepalive(ctx, 10*time.Millisecond, alive)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		mu.Lock()
		defer mu.Unlock()
		if asked < 5 {
			return poll.Continue("asked %d times", asked)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second))
	assert.NilError(t, conn.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := conn.Read(make([]byte, 64))
	assert.Assert(t, err != nil, "a keepalive left while stuck")
	mu.Lock()
	stuck = false
	mu.Unlock()
	assert.Equal(t, read(t, conn), "WATCHDOG=1")
}
