package changes

import (
	"context"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/internal/netnstest"
)

// TestServiceRouteYieldsToKubeProxy, on the kernel's nftables in a network
// namespace the test makes: a connection from the machine to the
// kubernetes Service reaches the endpoint through liken's table, reaches
// the address of a table at kube-proxy's priority (dstnat, -100, as
// kube-proxy writes its nat-output chain) once one routes the Service,
// and the endpoint again when that table goes; a Boot with another
// endpoint replaces liken's rule rather than adding one. It needs root
// and nft (make test installs nftables).
func TestServiceRouteYieldsToKubeProxy(t *testing.T) {
	netnstest.New(t).Run(func() { serviceRouteInNamespace(t) })
}

func serviceRouteInNamespace(t *testing.T) {
	port := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lab0"}}
	assert.NilError(t, netlink.LinkAdd(port))
	for _, a := range []string{"10.0.0.10/24", "10.0.0.11/24", "10.0.0.12/24"} {
		addr, _ := netlink.ParseAddr(a)
		assert.NilError(t, netlink.AddrAdd(port, addr))
	}
	assert.NilError(t, netlink.LinkSetUp(port))
	// The service range leaves through the machine's port, as through a
	// default route.
	_, services, _ := net.ParseCIDR("10.96.0.0/16")
	assert.NilError(t, netlink.RouteAdd(&netlink.Route{Dst: services, LinkIndex: port.Attrs().Index}))
	// Each address answers with its own name.
	for addr, name := range map[string]string{"10.0.0.10:6443": "endpoint", "10.0.0.12:6443": "new endpoint", "10.0.0.11:6443": "kube-proxy"} {
		l, err := net.Listen("tcp", addr)
		assert.NilError(t, err)
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, name)
				c.Close()
			}
		}()
	}
	reached := func() string {
		t.Helper()
		c, err := net.DialTimeout("tcp", "10.96.0.1:443", 5*time.Second)
		assert.NilError(t, err)
		defer c.Close()
		b, err := io.ReadAll(c)
		assert.NilError(t, err)
		return string(b)
	}
	nft := func(script string) string {
		t.Helper()
		out, err := exec.Command("nft", script).CombinedOutput()
		assert.NilError(t, err, "nft %s: %s (make test installs nftables)", script, out)
		return string(out)
	}

	o := &OS{}
	cfg := base()
	cfg.Network.Endpoint, cfg.Network.ServiceCIDR = "https://10.0.0.10:6443", "10.96.0.0/16"
	ctx := context.Background()
	assert.NilError(t, o.serviceRoute(ctx, cfg.Network))
	assert.Equal(t, reached(), "endpoint")

	nft("table ip kube-proxy { chain nat-output { type nat hook output priority -100; policy accept; ip daddr 10.96.0.1 tcp dport 443 dnat to 10.0.0.11:6443; }; }")
	assert.Equal(t, reached(), "kube-proxy")
	// Every boot installs the table again: kube-proxy keeps the Service.
	assert.NilError(t, o.serviceRoute(ctx, cfg.Network))
	assert.Equal(t, reached(), "kube-proxy")

	nft("delete table ip kube-proxy")
	assert.Equal(t, reached(), "endpoint")

	cfg.Network.Endpoint = "10.0.0.12:6443"
	assert.NilError(t, o.serviceRoute(ctx, cfg.Network))
	assert.Equal(t, reached(), "new endpoint")
	table := nft("list table ip liken")
	assert.Check(t, is.Equal(strings.Count(table, "dnat to"), 2), table)
	assert.Check(t, is.Equal(strings.Count(table, "dnat to 10.0.0.12:6443"), 2), table)
}
