// Package netnstest gives a test network namespaces of its own.
package netnstest

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"gotest.tools/v3/assert"
)

// NS is a network namespace a test made, gone with the test: one thread
// locked in it runs the functions given to Run, and the commands they
// start run in it too.
type NS struct {
	do chan func()
	// Handle is the namespace, to move a port into it.
	Handle netns.NsHandle
}

// New starts a thread in a new network namespace, with lo up. It needs
// root.
func New(t *testing.T) *NS {
	t.Helper()
	n := &NS{do: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.New()
		if err == nil {
			n.Handle = ns
			if lo, lerr := netlink.LinkByName("lo"); lerr == nil {
				err = netlink.LinkSetUp(lo)
			}
		}
		ready <- err
		for f := range n.do {
			f()
		}
		// The thread never returns to the pool: it ends in the namespace
		// with the goroutine.
	}()
	assert.NilError(t, <-ready, "a network namespace for the test (run as root)")
	t.Cleanup(func() {
		close(n.do)
		n.Handle.Close()
	})
	return n
}

// Run runs f on the namespace's thread and waits for it.
func (n *NS) Run(f func()) {
	done := make(chan struct{})
	n.do <- func() { defer close(done); f() }
	<-done
}
