package podroutes

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"liken.sh/liken/internal/netnstest"
)

// inNetworkNamespace runs f on a thread in a new network namespace with
// one port, lab0, at 10.77.0.11/24: the machine of a segment, made by the
// test and gone with it.
func inNetworkNamespace(t *testing.T, f func()) {
	t.Helper()
	netnstest.New(t).Run(func() {
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
	})
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

// TestNetlinkTunnel: on the kernel, a route through the tunnel is the
// onlink route through the range's first address on the tunnel's port,
// that address's neighbour entry and the forwarding entry to the other
// machine; the table lists it back, lists a route whose entries someone
// removed as one to mend, and the port goes when no route needs it.
func TestNetlinkTunnel(t *testing.T) {
	inNetworkNamespace(t, func() {
		var table Netlink
		_, all, _ := net.ParseCIDR("0.0.0.0/0")
		assert.NilError(t, netlink.RouteAdd(&netlink.Route{Dst: all, Gw: net.ParseIP("10.77.0.1")}))
		assert.Check(t, table.OnLink(netip.MustParseAddr("10.77.0.12")))
		assert.Check(t, !table.OnLink(netip.MustParseAddr("192.0.2.7")), "an address behind the gateway")

		ep := &Endpoint{Addr: netip.MustParseAddr("10.244.0.0"), Node: netip.MustParseAddr("10.77.0.11")}
		assert.NilError(t, table.Tunnel(ep))
		assert.NilError(t, table.Tunnel(ep), "a second time changes nothing")
		l, err := netlink.LinkByName(TunnelPort)
		assert.NilError(t, err)
		v := l.(*netlink.Vxlan)
		assert.Check(t, is.Equal(v.VxlanId, TunnelVNI))
		assert.Check(t, is.Equal(v.Port, TunnelUDPPort))
		assert.Check(t, is.Equal(v.HardwareAddr.String(), "0e:4c:0a:4d:00:0b"))

		far := tunnel("10.244.3.0/24", "192.0.2.7")
		assert.NilError(t, table.Replace(far))
		assert.NilError(t, table.Replace(route("10.244.1.0/24", "10.77.0.12")))
		got, err := table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), far}, cmpRoutes)
		rs, err := netlink.RouteGet(net.ParseIP("10.244.3.9"))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(rs[0].LinkIndex, l.Attrs().Index))
		assert.Check(t, is.Equal(rs[0].Gw.String(), "10.244.3.0"))

		// A neighbour entry someone removed: listed with no address, so
		// that the sync replaces it.
		assert.NilError(t, netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: net.ParseIP("10.244.3.0")}))
		got, err = table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), {Dst: far.Dst, Tunnel: true}}, cmpRoutes)
		assert.NilError(t, table.Replace(far))
		got, err = table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), far}, cmpRoutes)

		assert.NilError(t, table.Delete(far))
		assert.NilError(t, table.Tunnel(nil))
		_, err = netlink.LinkByName(TunnelPort)
		assert.Assert(t, err != nil, "the tunnel's port is gone")
		got, err = table.List()
		assert.NilError(t, err)
		assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12")}, cmpRoutes)
	})
}

// TestTunnelAcrossSubnets: two machines on two subnets joined by a router
// (three network namespaces the test makes): with each one's sync on its
// own table, a pod address of one reaches a pod address of the other
// through the tunnel, and back.
func TestTunnelAcrossSubnets(t *testing.T) {
	a, b, r := netnstest.New(t), netnstest.New(t), netnstest.New(t)
	// veth pairs: a's eth0 to the router's a0, b's eth0 to its b0.
	for _, m := range []struct {
		ns       *netnstest.NS
		port     string
		addr, gw string
		podAddr  string
	}{
		{a, "a0", "10.1.0.2/24", "10.1.0.1", "10.244.1.1/24"},
		{b, "b0", "10.2.0.2/24", "10.2.0.1", "10.244.2.1/24"},
	} {
		r.Run(func() {
			assert.NilError(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.port}, PeerName: "eth0"}))
			peer, err := netlink.LinkByName("eth0")
			assert.NilError(t, err)
			assert.NilError(t, netlink.LinkSetNsFd(peer, int(m.ns.Handle)))
			port, err := netlink.LinkByName(m.port)
			assert.NilError(t, err)
			gw, _ := netlink.ParseAddr(m.gw + "/24")
			assert.NilError(t, netlink.AddrAdd(port, gw))
			assert.NilError(t, netlink.LinkSetUp(port))
		})
		m.ns.Run(func() {
			eth0, err := netlink.LinkByName("eth0")
			assert.NilError(t, err)
			addr, _ := netlink.ParseAddr(m.addr)
			assert.NilError(t, netlink.AddrAdd(eth0, addr))
			assert.NilError(t, netlink.LinkSetUp(eth0))
			_, all, _ := net.ParseCIDR("0.0.0.0/0")
			assert.NilError(t, netlink.RouteAdd(&netlink.Route{Dst: all, Gw: net.ParseIP(m.gw)}))
			// The pods' bridge, with the machine's pod range.
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}
			assert.NilError(t, netlink.LinkAdd(br))
			pod, _ := netlink.ParseAddr(m.podAddr)
			assert.NilError(t, netlink.AddrAdd(br, pod))
			assert.NilError(t, netlink.LinkSetUp(br))
		})
	}
	r.Run(func() { assert.NilError(t, os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)) })

	nodes := []*corev1.Node{
		node("a", "10.244.1.0/24", internal("10.1.0.2")),
		node("b", "10.244.2.0/24", internal("10.2.0.2")),
	}
	for _, m := range []struct {
		ns   *netnstest.NS
		self string
	}{{a, "a"}, {b, "b"}} {
		m.ns.Run(func() {
			c := &Controller{self: m.self, nodes: lister(t, nodes), table: Netlink{}, events: events.NewFakeRecorder(10)}
			_, err := c.sync(context.Background(), key)
			assert.NilError(t, err)
		})
	}

	var l net.PacketConn
	b.Run(func() {
		var err error
		l, err = net.ListenPacket("udp4", "10.244.2.1:9999")
		assert.NilError(t, err)
	})
	defer l.Close()
	a.Run(func() {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.244.1.1")}, &net.UDPAddr{IP: net.ParseIP("10.244.2.1"), Port: 9999})
		assert.NilError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("hello"))
		assert.NilError(t, err)
	})
	buf := make([]byte, 16)
	assert.NilError(t, l.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, from, err := l.ReadFrom(buf)
	assert.NilError(t, err, "the pod address of b hears the pod address of a")
	assert.Check(t, is.Equal(string(buf[:n]), "hello"))
	assert.Check(t, is.Equal(from.(*net.UDPAddr).IP.String(), "10.244.1.1"), "the pod's own address, not masqueraded")
}

// lister is a Node lister holding nodes.
func lister(t *testing.T, nodes []*corev1.Node) corelisters.NodeLister {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		assert.NilError(t, idx.Add(n))
	}
	return corelisters.NewNodeLister(idx)
}
