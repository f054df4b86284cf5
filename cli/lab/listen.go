package lab

import (
	"net"

	"github.com/spf13/pflag"

	"liken.sh/liken/cli/lab/nsnet"
)

// listenFlags say where a lab server listens: a free port of this
// computer's loopback, or of an address inside a network namespace (the
// namespace lab's segment, where its machines reach the lab's servers at
// the gateway).
type listenFlags struct {
	netns, address string
}

// add registers the flags.
func (l *listenFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&l.netns, "netns", "", "listen inside this network namespace (a file such as the namespace lab's net/lab) instead of this computer's")
	fs.StringVar(&l.address, "address", "127.0.0.1", "the address to listen on")
}

// in runs fn in the namespace of the flags, or here.
func (l *listenFlags) in(fn func() error) error {
	if l.netns == "" {
		return fn()
	}
	return nsnet.RunIn(l.netns, fn)
}

// listen opens a TCP listener on a free port.
func (l *listenFlags) listen() (ln net.Listener, err error) {
	err = l.in(func() error {
		ln, err = net.Listen("tcp", net.JoinHostPort(l.address, "0"))
		return err
	})
	return ln, err
}

// listenPacket opens a UDP socket on a free port.
func (l *listenFlags) listenPacket() (pc net.PacketConn, err error) {
	err = l.in(func() error {
		pc, err = net.ListenPacket("udp", net.JoinHostPort(l.address, "0"))
		return err
	})
	return pc, err
}
