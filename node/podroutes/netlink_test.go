package podroutes

import (
	"net"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"gotest.tools/v3/assert"
)

// inNetworkNamespace runs f on a thread in a new network namespace with
// one port, lab0, at 10.77.0.11/24: the machine of a segment, made by the
// test and gone with it.
func inNetworkNamespace(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread never returns to the pool: it ends in the test's
		// namespace with this goroutine.
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			t.Errorf("a network namespace for the test (run as root): %v", err)
			return
		}
		defer ns.Close()
		port := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lab0"}}
		if err := netlink.LinkAdd(port); err != nil {
			t.Errorf("adding lab0: %v", err)
			return
		}
		addr, _ := netlink.ParseAddr("10.77.0.11/24")
		if err := netlink.AddrAdd(port, addr); err != nil {
			t.Errorf("addressing lab0: %v", err)
			return
		}
		if err := netlink.LinkSetUp(port); err != nil {
			t.Errorf("lab0 up: %v", err)
			return
		}
		f()
	}()
	<-done
}

// TestNetlink: on the kernel's routing table, the routes go through the
// segment's port, a route through an address on no network of the
// machine's is refused with the kernel's reason, and the table lists only
// the routes of Protocol, never the machine's own.
func TestNetlink(t *testing.T) {
	inNetworkNamespace(t, func() {
		var table Netlink
		_, other, _ := net.ParseCIDR("10.99.0.0/16")
		assert.NilError(t, netlink.RouteAdd(&netlink.Route{Dst: other, Gw: net.ParseIP("10.77.0.1")}))

		assert.NilError(t, table.Replace(route("10.244.1.0/24", "10.77.0.12")))
		assert.NilError(t, table.Replace(route("10.244.2.0/24", "10.77.0.13")))
		// A machine's new address replaces its route.
		assert.NilError(t, table.Replace(route("10.244.2.0/24", "10.77.0.14")))
		err := table.Replace(route("10.244.3.0/24", "192.0.2.7"))
		assert.ErrorContains(t, err, "network is unreachable")
		got, err := table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), route("10.244.2.0/24", "10.77.0.14")}, cmpRoutes)

		assert.NilError(t, table.Delete(route("10.244.1.0/24", "10.77.0.12")))
		got, err = table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.2.0/24", "10.77.0.14")}, cmpRoutes)
		// The kernel routes a pod's address through the other machine.
		rs, err := netlink.RouteGet(net.ParseIP("10.244.2.9"))
		assert.NilError(t, err)
		assert.Equal(t, rs[0].Gw.String(), "10.77.0.14")
	})
}
