// Package segment is the VM lab's network segment: a learning Ethernet switch whose ports are the unix datagram sockets of QEMU's dgram network backends.
package segment

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// maxFrame is the largest datagram read: an Ethernet frame of QEMU's
// virtio port, which offloads nothing to the backend, is at most 1514
// bytes; a jumbo MTU fits too.
const maxFrame = 65536

// Switch forwards each frame it receives to the port that last sent from
// the frame's destination address, and floods broadcasts, multicasts and
// unknown destinations to every other port it has heard from. A port is
// a machine's socket; it joins by sending its first frame. A frame a port
// cannot take at once (its machine is busy, paused or off) is dropped, as
// a busy switch does, so that one machine never holds up the others.
type Switch struct {
	conn *net.UnixConn
	raw  syscall.RawConn
	// ports are the sockets heard from; where maps a MAC address (its 6
	// bytes as a string) to the socket it last sent from.
	ports map[string]unix.Sockaddr
	where map[string]string
}

// Listen makes the switch's socket at path, replacing one a switch that
// was killed left behind.
func Listen(path string) (*Switch, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old switch socket: %w", err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("the segment's switch socket: %w", err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &Switch{conn: conn, raw: raw, ports: map[string]unix.Sockaddr{}, where: map[string]string{}}, nil
}

// Addr is the switch socket's path.
func (s *Switch) Addr() string { return s.conn.LocalAddr().String() }

// Serve forwards frames until ctx ends.
func (s *Switch) Serve(ctx context.Context) error {
	log := klog.FromContext(ctx)
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer stop()
	buf := make([]byte, maxFrame)
	for {
		n, from, err := s.conn.ReadFromUnix(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading a frame: %w", err)
		}
		if n < 14 || from == nil || from.Name == "" {
			// Not an Ethernet frame, or from a socket with no name to
			// answer to.
			continue
		}
		frame := buf[:n]
		dst, src := string(frame[0:6]), string(frame[6:12])
		if _, ok := s.ports[from.Name]; !ok {
			s.ports[from.Name] = &unix.SockaddrUnix{Name: from.Name}
			log.Info("A machine joined the segment", "socket", from.Name, "mac", net.HardwareAddr(frame[6:12]).String())
		}
		if frame[6]&1 == 0 {
			s.where[src] = from.Name
		}
		if to, known := s.where[dst]; known && frame[0]&1 == 0 {
			if to != from.Name {
				s.send(frame, s.ports[to])
			}
			continue
		}
		for name, to := range s.ports {
			if name != from.Name {
				s.send(frame, to)
			}
		}
	}
}

// send gives one frame to a port without waiting: a full queue or a
// machine that is off (its socket gone) loses it; the machine joins
// again with its next frame.
func (s *Switch) send(frame []byte, to unix.Sockaddr) {
	_ = s.raw.Write(func(fd uintptr) bool {
		_ = unix.Sendto(int(fd), frame, unix.MSG_DONTWAIT, to)
		return true
	})
}
