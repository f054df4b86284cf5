package podroutes

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
)

var (
	cmpRoutes  = cmp.Comparer(func(a, b Route) bool { return a == b })
	everything = labels.Everything()
)

func node(name, podCIDR string, addrs ...corev1.NodeAddress) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	return n
}

func internal(a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a}
}

func route(dst, via string) Route {
	return Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
}

func TestDesired(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  []Route
	}{
		{"no other machine", []*corev1.Node{node("self", "10.244.0.0/24", internal("10.77.0.11"))}, nil},
		{"each other machine's range through its address", []*corev1.Node{
			node("self", "10.244.0.0/24", internal("10.77.0.11")),
			node("b", "10.244.2.0/24", internal("10.77.0.13")),
			node("a", "10.244.1.0/24", corev1.NodeAddress{Type: corev1.NodeHostName, Address: "a"}, internal("10.77.0.12")),
		}, []Route{route("10.244.1.0/24", "10.77.0.12"), route("10.244.2.0/24", "10.77.0.13")}},
		{"a machine with no range yet, or no address yet", []*corev1.Node{
			node("a", "", internal("10.77.0.12")),
			node("b", "10.244.2.0/24"),
		}, nil},
		{"each family through an address of its own", []*corev1.Node{{
			ObjectMeta: metav1.ObjectMeta{Name: "a"},
			Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{internal("fd00::12"), internal("10.77.0.12")}},
		}}, []Route{route("10.244.1.0/24", "10.77.0.12"), route("fd00:10:244:1::/64", "fd00::12")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ep := Desired("self", tc.nodes, segment)
			assert.DeepEqual(t, got, tc.want, cmpRoutes)
			assert.Check(t, ep == nil, "no route needs the tunnel")
		})
	}
}

// segment is the machines' network, 10.77.0.0/24: addresses on it are
// on link.
func segment(a netip.Addr) bool { return netip.MustParsePrefix("10.77.0.0/24").Contains(a) }

func tunnel(dst, via string) Route {
	r := route(dst, via)
	r.Tunnel = true
	return r
}

// TestDesiredThroughTheTunnel: a machine on another network is reached
// through the tunnel, whose end on this machine is its range's first
// address and its own address; an IPv6 range never is; without its own
// range this machine cannot use the tunnel and routes only the segment.
func TestDesiredThroughTheTunnel(t *testing.T) {
	nodes := []*corev1.Node{
		node("self", "10.244.0.0/24", internal("10.77.0.11")),
		node("near", "10.244.1.0/24", internal("10.77.0.12")),
		node("far", "10.244.2.0/24", internal("192.0.2.7")),
		node("far6", "fd00:10:244:3::/64", internal("fd00::7")),
	}
	got, ep := Desired("self", nodes, segment)
	assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), tunnel("10.244.2.0/24", "192.0.2.7"), route("fd00:10:244:3::/64", "fd00::7")}, cmpRoutes)
	assert.Assert(t, ep != nil)
	assert.Equal(t, *ep, Endpoint{Addr: netip.MustParseAddr("10.244.0.0"), Node: netip.MustParseAddr("10.77.0.11")})

	nodes[0] = node("self", "", internal("10.77.0.11"))
	got, ep = Desired("self", nodes, segment)
	assert.DeepEqual(t, got, []Route{route("10.244.1.0/24", "10.77.0.12"), route("fd00:10:244:3::/64", "fd00::7")}, cmpRoutes)
	assert.Check(t, ep == nil)
}

// fakeTable is a routing table that refuses a route through unreachable.
type fakeTable struct {
	routes      []Route
	unreachable netip.Addr
	tunnel      *Endpoint
}

func (f *fakeTable) OnLink(a netip.Addr) bool { return segment(a) }

func (f *fakeTable) Tunnel(ep *Endpoint) error {
	f.tunnel = ep
	return nil
}

func (f *fakeTable) List() ([]Route, error) { return slices.Clone(f.routes), nil }

func (f *fakeTable) Replace(r Route) error {
	if r.Via == f.unreachable {
		return errors.New("network is unreachable")
	}
	f.routes = slices.DeleteFunc(f.routes, func(o Route) bool { return o.Dst == r.Dst })
	f.routes = append(f.routes, r)
	return nil
}

func (f *fakeTable) Delete(r Route) error {
	f.routes = slices.DeleteFunc(f.routes, func(o Route) bool { return o == r })
	return nil
}

// TestSync: the table follows the Nodes: a machine that joins gets its
// route, one whose address changed gets it changed, one that leaves loses
// it; a machine off the segment is routed through the tunnel, and one the
// kernel cannot reach is named in the error while the others are routed
// anyway.
func TestSync(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(
		node("self", "10.244.0.0/24", internal("10.77.0.11")),
		node("a", "10.244.1.0/24", internal("10.77.0.12")),
		node("gone", "10.244.9.0/24", internal("10.77.0.19")),
		node("far", "10.244.3.0/24", internal("192.0.2.7")),
	)
	// The informer's watch is set up before the test deletes Nodes: the
	// fake clientset gives a watch no event from before it started.
	watching := make(chan struct{})
	kube.PrependWatchReactor("nodes", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := kube.Tracker().Watch(action.GetResource(), action.GetNamespace())
		close(watching)
		return true, w, err
	})
	factory := informers.NewSharedInformerFactory(kube, 0)
	table := &fakeTable{unreachable: netip.MustParseAddr("192.0.2.7"), routes: []Route{route("10.244.1.0/24", "10.77.0.99")}}
	recorder := events.NewFakeRecorder(10)
	c := New("self", factory.Core().V1().Nodes(), table, recorder, time.Minute)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	<-watching

	_, err := c.sync(ctx, key)
	assert.ErrorContains(t, err, "routing pod range 10.244.3.0/24 through the tunnel to 192.0.2.7: network is unreachable; that machine's address must be reachable from this machine")
	assert.Check(t, table.tunnel != nil && *table.tunnel == Endpoint{Addr: netip.MustParseAddr("10.244.0.0"), Node: netip.MustParseAddr("10.77.0.11")}, "the tunnel's end for the machine off the segment: %v", table.tunnel)
	assert.DeepEqual(t, table.routes, []Route{route("10.244.1.0/24", "10.77.0.12"), route("10.244.9.0/24", "10.77.0.19")}, cmpRoutes)
	// The Node tells whoever reads its events, once for the same failure.
	assert.Equal(t, <-recorder.Events, "Warning PodRouteFailed Pods of this machine cannot reach some pods of other machines: "+err.Error())
	_, err = c.sync(ctx, key)
	assert.Assert(t, err != nil)
	assert.Equal(t, len(recorder.Events), 0, "the same failure told twice")

	assert.NilError(t, kube.CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}))
	assert.NilError(t, kube.CoreV1().Nodes().Delete(ctx, "far", metav1.DeleteOptions{}))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if ns, _ := c.nodes.List(everything); len(ns) != 2 {
			return poll.Continue("%d Nodes in the cache", len(ns))
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	after, err := c.sync(ctx, key)
	assert.NilError(t, err)
	assert.Equal(t, after, time.Minute, "the table is compared again after the resync")
	assert.DeepEqual(t, table.routes, []Route{route("10.244.1.0/24", "10.77.0.12")}, cmpRoutes)
	assert.Check(t, table.tunnel == nil, "the tunnel's port goes with the last machine off the segment")
}
