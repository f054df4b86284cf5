package podroutes

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is the Table of the kernel's main routing table, in the network
// namespace of the calling thread.
type Netlink struct{}

// List returns the main table's routes of Protocol.
func (Netlink) List() ([]Route, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
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
		out = append(out, Route{Dst: dst, Via: via.Unmap()})
	}
	return out, nil
}

// Replace adds or changes the route to r.Dst.
func (Netlink) Replace(r Route) error { return netlink.RouteReplace(kernelRoute(r)) }

// Delete removes r.
func (Netlink) Delete(r Route) error { return netlink.RouteDel(kernelRoute(r)) }

func kernelRoute(r Route) *netlink.Route {
	return &netlink.Route{
		Dst:      &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Gw:       r.Via.AsSlice(),
		Protocol: Protocol,
		Table:    unix.RT_TABLE_MAIN,
	}
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
