// Package podroutes routes each other machine's pod range through that machine's address: directly on the network the machines share, as flannel's host-gw backend and kind's kindnetd do, and through a VXLAN tunnel to a machine on another network, as flannel's vxlan backend does.
package podroutes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"liken.sh/liken/internal/worker"
)

// Protocol marks the routes the controller owns in the main routing
// table (`ip route show proto 76` lists them); it changes no other route.
const Protocol = 76

// Route is one Node's pod range, reached through that Node's address.
type Route struct {
	// Dst is the pod range, Via the Node's internal address.
	Dst netip.Prefix
	Via netip.Addr
	// Tunnel: Via is not on a network this machine is on, and the range
	// is reached through the VXLAN tunnel to Via (IPv4 only).
	Tunnel bool
}

func (r Route) String() string {
	if r.Tunnel {
		return r.Dst.String() + " through the tunnel to " + r.Via.String()
	}
	return r.Dst.String() + " via " + r.Via.String()
}

// Endpoint is this machine's end of the VXLAN tunnel: the first address
// of its own pod range, which the others route its range through, and its
// Node's address, which they send the tunnel's packets to.
type Endpoint struct {
	Addr, Node netip.Addr
}

// Desired is a route to each pod range of every Node but self, through
// that Node's first internal address of the range's family: directly when
// onLink says the address is on a network of this machine's, through the
// tunnel otherwise (an IPv4 range; an IPv6 one is routed directly, which
// fails off the segment). A Node with no range yet (the controller manager
// has not given it one) or no address (its kubelet has not reported) gets
// none until it has both. The Endpoint is self's, when a route needs the
// tunnel and self has an IPv4 range and address.
func Desired(self string, nodes []*corev1.Node, onLink func(netip.Addr) bool) ([]Route, *Endpoint) {
	var out []Route
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		ranges := n.Spec.PodCIDRs
		if len(ranges) == 0 && n.Spec.PodCIDR != "" {
			ranges = []string{n.Spec.PodCIDR}
		}
		for _, cidr := range ranges {
			dst, err := netip.ParsePrefix(cidr)
			if err != nil {
				continue
			}
			for _, a := range n.Status.Addresses {
				via, err := netip.ParseAddr(a.Address)
				if a.Type != corev1.NodeInternalIP || err != nil || via.Is4() != dst.Addr().Is4() {
					continue
				}
				out = append(out, Route{Dst: dst.Masked(), Via: via, Tunnel: via.Is4() && !onLink(via)})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
	if !slices.ContainsFunc(out, func(r Route) bool { return r.Tunnel }) {
		return out, nil
	}
	var ep *Endpoint
	for _, n := range nodes {
		if n.Name != self {
			continue
		}
		if r, via, ok := first4(n); ok {
			ep = &Endpoint{Addr: r.Masked().Addr(), Node: via}
		}
	}
	if ep == nil {
		// Without its own end, this machine cannot use the tunnel.
		out = slices.DeleteFunc(out, func(r Route) bool { return r.Tunnel })
	}
	return out, ep
}

// first4 is a Node's IPv4 pod range and internal address.
func first4(n *corev1.Node) (netip.Prefix, netip.Addr, bool) {
	ranges := n.Spec.PodCIDRs
	if len(ranges) == 0 && n.Spec.PodCIDR != "" {
		ranges = []string{n.Spec.PodCIDR}
	}
	for _, cidr := range ranges {
		p, err := netip.ParsePrefix(cidr)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		for _, a := range n.Status.Addresses {
			if via, err := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && err == nil && via.Is4() {
				return p, via, true
			}
		}
	}
	return netip.Prefix{}, netip.Addr{}, false
}

// Table is the machine's routing table, as far as the routes of Protocol,
// and its end of the tunnel.
type Table interface {
	// List returns the routes of Protocol.
	List() ([]Route, error)
	// Replace adds r, or changes the route to r.Dst to go through r.Via.
	Replace(r Route) error
	// Delete removes r.
	Delete(r Route) error
	// OnLink says whether a is on a network this machine is on (the
	// kernel reaches it without a gateway).
	OnLink(a netip.Addr) bool
	// Tunnel makes the tunnel's port exist with this machine's end, or
	// removes it when ep is nil.
	Tunnel(ep *Endpoint) error
}

// ReasonPodRouteFailed is the reason of the Warning event on this
// machine's Node when a pod range of another machine cannot be routed.
const ReasonPodRouteFailed = "PodRouteFailed"

// key is the queue's only key: every Node's change is one resync of the
// whole table.
const key = "routes"

// Controller keeps the Table's routes of Protocol equal to Desired.
type Controller struct {
	self   string
	nodes  corelisters.NodeLister
	synced cache.DoneChecker
	table  Table
	resync time.Duration
	queue  *worker.Queue
	events events.EventRecorder
	// failed is the last failure an event told; the same one again is
	// not told again.
	failed string
}

// New returns the controller of machine self's routes, fed by an informer
// of every Node; a failure is an event on self's Node. Every resync it
// compares the table again, so that a route someone else removed (a
// network reconfigured) comes back.
func New(self string, informer coreinformers.NodeInformer, table Table, recorder events.EventRecorder, resync time.Duration) *Controller {
	c := &Controller{self: self, nodes: informer.Lister(), synced: informer.Informer().HasSyncedChecker(), table: table, resync: resync, events: recorder}
	c.queue = worker.New("podroutes", clock.RealClock{}, c.sync)
	enqueue := func(any) { c.queue.Add(key) }
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, DeleteFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Node), cur.(*corev1.Node)
			if !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) || o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Status.Addresses, n.Status.Addresses) {
				c.queue.Add(key)
			}
		},
	})
	return c
}

// Run keeps the routes until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.queue.Add(key)
	return c.queue.Run(ctx, 1, c.synced)
}

// sync makes the table's routes of Protocol the desired ones: it replaces
// the missing and changed ones and deletes those of Nodes that are gone,
// and asks to run again after the resync.
func (c *Controller) sync(ctx context.Context, _ string) (time.Duration, error) {
	log := klog.FromContext(ctx)
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	want, ep := Desired(c.self, nodes, c.table.OnLink)
	var errs []error
	if ep != nil {
		if err := c.table.Tunnel(ep); err != nil {
			errs = append(errs, fmt.Errorf("making this machine's end of the tunnel (%s, %s): %w", ep.Addr, ep.Node, err))
			want = slices.DeleteFunc(want, func(r Route) bool { return r.Tunnel })
		}
	}
	have, err := c.table.List()
	if err != nil {
		return 0, fmt.Errorf("reading the routing table: %w", err)
	}
	for _, r := range want {
		if slices.Contains(have, r) {
			continue
		}
		if err := c.table.Replace(r); err != nil {
			errs = append(errs, fmt.Errorf("routing pod range %s: %w; that machine's address must be reachable from this machine", r, err))
			continue
		}
		log.Info("Routed another machine's pod range", "range", r.Dst, "via", r.Via, "tunnel", r.Tunnel)
	}
	for _, r := range have {
		if slices.ContainsFunc(want, func(w Route) bool { return w.Dst == r.Dst }) {
			continue
		}
		if err := c.table.Delete(r); err != nil {
			errs = append(errs, fmt.Errorf("removing the route %s of a pod range no Node has: %w", r, err))
			continue
		}
		log.Info("Removed the route of a pod range no Node has", "range", r.Dst, "via", r.Via)
	}
	if ep == nil {
		// No route needs the tunnel: its port goes, if there is one.
		if err := c.table.Tunnel(nil); err != nil {
			errs = append(errs, fmt.Errorf("removing the tunnel's port no route needs: %w", err))
		}
	}
	err = errors.Join(errs...)
	if err != nil && err.Error() != c.failed {
		c.events.Eventf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.self}}, nil, corev1.EventTypeWarning, ReasonPodRouteFailed, "Route",
			"Pods of this machine cannot reach some pods of other machines: %v", err)
	}
	if err == nil {
		c.failed = ""
	} else {
		c.failed = err.Error()
	}
	return c.resync, err
}
