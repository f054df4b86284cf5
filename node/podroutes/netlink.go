package podroutes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The tunnel's port: VXLAN network 1 on flannel's UDP port, so that a
// fleet's firewall rules written for flannel fit.
const (
	TunnelPort    = "liken.vxlan"
	TunnelVNI     = 1
	TunnelUDPPort = 8472
)

// tunnelMAC is the tunnel port's hardware address of the machine at node,
// derived from its address (locally administered, unicast), so that every
// machine knows every other's without asking.
func tunnelMAC(node netip.Addr) net.HardwareAddr {
	b := node.As4()
	return net.HardwareAddr{0x0e, 0x4c, b[0], b[1], b[2], b[3]}
}

// nodeOfMAC is the machine's address a tunnelMAC was derived from.
func nodeOfMAC(mac net.HardwareAddr) (netip.Addr, bool) {
	if len(mac) != 6 || mac[0] != 0x0e || mac[1] != 0x4c {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(mac[2:])), true
}

// Netlink is the Table of the kernel's main routing table and the tunnel's
// port, in the network namespace of the calling thread. A route through
// the tunnel is three entries on the port: the route to the range through
// its first address (onlink), that address's neighbour entry with the
// other machine's tunnelMAC, and the forwarding entry that sends that MAC
// to the other machine's address.
type Netlink struct{}

// List returns the main table's routes of Protocol. A tunnel route whose
// neighbour or forwarding entry is missing is listed with no Via, so
// that the next Replace mends it.
func (Netlink) List() ([]Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	tunnel := -1
	var neigh, fdb []netlink.Neigh
	if l, err := netlink.LinkByName(TunnelPort); err == nil {
		tunnel = l.Attrs().Index
		if neigh, err = netlink.NeighList(tunnel, netlink.FAMILY_V4); err != nil {
			return nil, err
		}
		if fdb, err = netlink.NeighList(tunnel, unix.AF_BRIDGE); err != nil {
			return nil, err
		}
	}
	var out []Route
	for _, r := range rs {
		if r.Dst == nil || r.Gw == nil {
			continue
		}
		dst, ok := prefix(r.Dst)
		via, ok2 := netip.AddrFromSlice(r.Gw)
		if !ok || !ok2 {
			continue
		}
		if r.LinkIndex != tunnel || tunnel < 0 {
			out = append(out, Route{Dst: dst, Via: via.Unmap()})
			continue
		}
		out = append(out, Route{Dst: dst, Via: tunnelNode(via.Unmap(), neigh, fdb), Tunnel: true})
	}
	return out, nil
}

// tunnelNode is the machine a tunnel route's gateway leads to: its
// neighbour entry's MAC, when the forwarding entry sends that MAC there.
func tunnelNode(gw netip.Addr, neigh, fdb []netlink.Neigh) netip.Addr {
	for _, n := range neigh {
		if a, ok := netip.AddrFromSlice(n.IP); !ok || a.Unmap() != gw {
			continue
		}
		node, ok := nodeOfMAC(n.HardwareAddr)
		if !ok {
			return netip.Addr{}
		}
		for _, f := range fdb {
			if d, ok := netip.AddrFromSlice(f.IP); ok && d.Unmap() == node && f.HardwareAddr.String() == n.HardwareAddr.String() {
				return node
			}
		}
	}
	return netip.Addr{}
}

// Replace adds or changes the route to r.Dst.
func (Netlink) Replace(r Route) error {
	if !r.Tunnel {
		return netlink.RouteReplace(kernelRoute(r))
	}
	l, err := netlink.LinkByName(TunnelPort)
	if err != nil {
		return fmt.Errorf("the tunnel's port %s: %w", TunnelPort, err)
	}
	mac, idx := tunnelMAC(r.Via), l.Attrs().Index
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, IP: r.Via.AsSlice(), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("the tunnel's forwarding entry to %s: %w", r.Via, err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: r.Dst.Addr().AsSlice(), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("the tunnel's neighbour entry of %s: %w", r.Dst.Addr(), err)
	}
	return netlink.RouteReplace(kernelRoute(r))
}

// Delete removes r (and a tunnel route's neighbour entry; the forwarding
// entry goes with the port, or stays for another range of the machine).
func (Netlink) Delete(r Route) error {
	if err := netlink.RouteDel(kernelRoute(r)); err != nil {
		return err
	}
	if r.Tunnel {
		if l, err := netlink.LinkByName(TunnelPort); err == nil {
			_ = netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: r.Dst.Addr().AsSlice()})
		}
	}
	return nil
}

// OnLink says whether the kernel reaches a without a gateway.
func (Netlink) OnLink(a netip.Addr) bool {
	rs, err := netlink.RouteGet(a.AsSlice())
	return err == nil && len(rs) > 0 && rs[0].Gw == nil && rs[0].LinkIndex > 0
}

// Tunnel makes TunnelPort a VXLAN port from ep.Node with ep's MAC and
// ep.Addr, up; a port of that name with other settings is made again.
// With ep nil it removes the port, if any.
func (Netlink) Tunnel(ep *Endpoint) error {
	l, err := netlink.LinkByName(TunnelPort)
	var notFound netlink.LinkNotFoundError
	exists := err == nil
	if err != nil && !errors.As(err, &notFound) {
		return err
	}
	if ep == nil {
		if exists {
			return netlink.LinkDel(l)
		}
		return nil
	}
	mac := tunnelMAC(ep.Node)
	if v, ok := l.(*netlink.Vxlan); exists && (!ok || v.VxlanId != TunnelVNI || v.Port != TunnelUDPPort || !v.SrcAddr.Equal(ep.Node.AsSlice()) || v.Learning) {
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		exists = false
	}
	if !exists {
		v := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: TunnelPort, HardwareAddr: mac},
			VxlanId: TunnelVNI, Port: TunnelUDPPort, SrcAddr: ep.Node.AsSlice(), Learning: false}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if l, err = netlink.LinkByName(TunnelPort); err != nil {
			return err
		}
	}
	if l.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
			return err
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ep.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

func kernelRoute(r Route) *netlink.Route {
	kr := &netlink.Route{
		Dst:      &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Gw:       r.Via.AsSlice(),
		Protocol: Protocol,
		Table:    unix.RT_TABLE_MAIN,
	}
	if r.Tunnel {
		if l, err := netlink.LinkByName(TunnelPort); err == nil {
			kr.LinkIndex = l.Attrs().Index
		}
		kr.Gw = r.Dst.Addr().AsSlice()
		kr.Flags = int(netlink.FLAG_ONLINK)
	}
	return kr
}

func prefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	p, err := a.Unmap().Prefix(bits)
	return p, err == nil
}
