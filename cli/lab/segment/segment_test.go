package segment

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// machine is one QEMU port as the switch sees it: a unix datagram socket
// of its own that sends to the switch.
type machine struct {
	t    *testing.T
	mac  net.HardwareAddr
	conn *net.UnixConn
	sw   *net.UnixAddr
}

func newMachine(t *testing.T, dir, name, mac string, sw string) *machine {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unixgram"})
	assert.NilError(t, err)
	t.Cleanup(func() { conn.Close() })
	hw, err := net.ParseMAC(mac)
	assert.NilError(t, err)
	return &machine{t: t, mac: hw, conn: conn, sw: &net.UnixAddr{Name: sw, Net: "unixgram"}}
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// send sends an Ethernet frame to dst whose payload is body.
func (m *machine) send(dst net.HardwareAddr, body string) {
	m.t.Helper()
	frame := append(append(append(append([]byte(nil), dst...), m.mac...), 0x08, 0x00), body...)
	_, err := m.conn.WriteToUnix(frame, m.sw)
	assert.NilError(m.t, err)
}

// receive returns the payloads of the frames that arrive within wait.
func (m *machine) receive(wait time.Duration) []string {
	m.t.Helper()
	var got []string
	buf := make([]byte, maxFrame)
	deadline := time.Now().Add(wait)
	for {
		assert.NilError(m.t, m.conn.SetReadDeadline(deadline))
		n, err := m.conn.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return got
		}
		assert.NilError(m.t, err)
		assert.Assert(m.t, n >= 14)
		assert.Check(m.t, bytes.Equal(buf[0:6], m.mac) || buf[0]&1 == 1, "a frame for %s reached %s", net.HardwareAddr(buf[0:6]), m.mac)
		got = append(got, string(buf[14:n]))
		// Once one frame arrived, the rest are already queued.
		deadline = time.Now().Add(100 * time.Millisecond)
	}
}

// TestSwitch: the segment's machines reach one another as on one
// Ethernet segment: a broadcast reaches every other machine, a frame for
// a known address reaches that machine only, and a machine that was off
// (its socket gone, its frames lost) takes part again once it sends.
func TestSwitch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "switch.sock")
	// A socket left by a switch that was killed is replaced.
	assert.NilError(t, os.WriteFile(path, nil, 0o600))
	sw, err := Listen(path)
	assert.NilError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- sw.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NilError(t, <-done)
	})

	a := newMachine(t, dir, "a.sock", "52:54:00:4c:00:01", path)
	b := newMachine(t, dir, "b.sock", "52:54:00:4c:00:02", path)
	c := newMachine(t, dir, "c.sock", "52:54:00:4c:00:03", path)
	// Each announces itself; each other one already heard hears it.
	a.send(broadcast, "a here")
	b.send(broadcast, "b here")
	c.send(broadcast, "c here")
	assert.Check(t, is.DeepEqual(a.receive(5*time.Second), []string{"b here", "c here"}))
	assert.Check(t, is.DeepEqual(b.receive(5*time.Second), []string{"c here"}))
	assert.Check(t, is.Len(c.receive(200*time.Millisecond), 0))

	// Known addresses: one machine each.
	a.send(c.mac, "a to c")
	c.send(b.mac, "c to b")
	assert.Check(t, is.DeepEqual(c.receive(5*time.Second), []string{"a to c"}))
	assert.Check(t, is.DeepEqual(b.receive(5*time.Second), []string{"c to b"}))
	assert.Check(t, is.Len(a.receive(200*time.Millisecond), 0))

	// b powers off: frames for it are lost and nobody waits. It powers
	// on again behind the same socket and is reached once it sends.
	b.conn.Close()
	assert.NilError(t, os.Remove(filepath.Join(dir, "b.sock")))
	a.send(b.mac, "lost")
	a.send(c.mac, "still there")
	assert.Check(t, is.DeepEqual(c.receive(5*time.Second), []string{"still there"}))
	b = newMachine(t, dir, "b.sock", "52:54:00:4c:00:02", path)
	b.send(broadcast, "b back")
	assert.Check(t, is.DeepEqual(a.receive(5*time.Second), []string{"b back"}))
	a.send(b.mac, "a to b")
	assert.Check(t, is.DeepEqual(b.receive(5*time.Second), []string{"a to b"}))
}
