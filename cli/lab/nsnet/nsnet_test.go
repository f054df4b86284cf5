package nsnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// prefix exists only inside the tests' namespaces.
var prefix = netip.MustParsePrefix("10.77.0.0/24")

var (
	addrA = netip.MustParseAddr("10.77.0.10")
	addrB = netip.MustParseAddr("10.77.0.11")
)

// testSegment is a segment in the test's folder, deleted with the test.
func testSegment(t *testing.T) *Segment {
	t.Helper()
	s, err := Create(filepath.Join(t.TempDir(), "net"), prefix)
	assert.NilError(t, err, "a segment (run as root)")
	t.Cleanup(func() { assert.Check(t, s.Delete()) })
	return s
}

func addMachine(t *testing.T, s *Segment, name string, addr netip.Addr) string {
	t.Helper()
	path, err := s.AddMachine(name, addr)
	assert.NilError(t, err)
	return path
}

// in runs a function in a machine's namespace, or in the lab's for "".
func in(s *Segment, name string) func(func() error) error {
	if name == "" {
		return s.Do
	}
	return func(fn func() error) error { return s.DoIn(name, fn) }
}

// listen listens on host:0 with do and answers each connection with tag,
// ':' and the line it sent; it returns the listener's address.
func listen(t *testing.T, do func(func() error) error, host, tag string) string {
	t.Helper()
	var ln net.Listener
	err := do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
		return err
	})
	assert.NilError(t, err)
	serve(t, ln, tag)
	return ln.Addr().String()
}

func serve(t *testing.T, ln net.Listener, tag string) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					io.WriteString(c, tag+":"+line)
				}
			}()
		}
	}()
}

// talk connects to address with do, sends msg and returns the answer.
func talk(do func(func() error) error, address, msg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var c net.Conn
	err := do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", address)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	reply, err := io.ReadAll(c)
	return string(reply), err
}

// host runs fn where the test runs: in the host's namespace.
func host(fn func() error) error { return fn() }

func TestReach(t *testing.T) {
	s := testSegment(t)
	addMachine(t, s, "a", addrA)
	addMachine(t, s, "b", addrB)
	// An address off the segment, in the lab's namespace: only the
	// machines' default route leads there.
	off := netip.MustParseAddr("10.78.0.1")
	assert.NilError(t, s.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(off, 32)})
	}))

	tests := []struct {
		name     string
		listenIn string // a machine, or "" for the lab
		host     netip.Addr
		from     string // a machine, or "" for the lab
	}{
		{name: "machine to machine", listenIn: "a", host: addrA, from: "b"},
		{name: "and back", listenIn: "b", host: addrB, from: "a"},
		{name: "machine to the gateway", listenIn: "", host: s.Gateway(), from: "a"},
		{name: "machine off the segment via the gateway", listenIn: "", host: off, from: "b"},
		{name: "lab to machine", listenIn: "a", host: addrA, from: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			address := listen(t, in(s, tc.listenIn), tc.host.String(), "at "+tc.listenIn)
			reply, err := talk(in(s, tc.from), address, "from "+tc.from)
			assert.NilError(t, err)
			assert.Equal(t, reply, "at "+tc.listenIn+":from "+tc.from+"\n")
		})
	}
}

func TestLabNotInHost(t *testing.T) {
	s := testSegment(t)
	addMachine(t, s, "a", addrA)

	// The gateway answers a machine...
	gw := listen(t, s.Do, s.Gateway().String(), "lab")
	reply, err := talk(in(s, "a"), gw, "a")
	assert.NilError(t, err)
	assert.Equal(t, reply, "lab:a\n")
	// ...but the host has neither its address nor a route to the prefix.
	// (The host is not made to dial it: with a default route, that would
	// send a packet off the host.)
	_, err = net.Listen("tcp", gw)
	assert.Check(t, errors.Is(err, syscall.EADDRNOTAVAIL), "listening on %s in the host: %v", gw, err)
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	assert.NilError(t, err)
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP)
		bits, _ := r.Dst.Mask.Size()
		if ok && bits > 0 {
			assert.Check(t, !netip.PrefixFrom(dst.Unmap(), bits).Overlaps(prefix), "the host's route %s", r)
		}
	}

	// A loopback port the host listens on is free in the lab's
	// namespace, and each listener answers its own namespace's dial.
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	serve(t, hostLn, "host")
	labLn, err := s.Listen("tcp", hostLn.Addr().String())
	assert.NilError(t, err, "the host's port in the lab's namespace")
	serve(t, labLn, "lab")
	reply, err = talk(host, hostLn.Addr().String(), "host")
	assert.NilError(t, err)
	assert.Equal(t, reply, "host:host\n")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := s.Dial(ctx, "tcp", labLn.Addr().String())
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "lab\n")
	assert.NilError(t, err)
	got, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Equal(t, string(got), "lab:lab\n")
}

// hostNet lists the links, addresses and routes of the test's namespace.
func hostNet(t *testing.T) []string {
	t.Helper()
	var lines []string
	links, err := netlink.LinkList()
	assert.NilError(t, err)
	for _, l := range links {
		a := l.Attrs()
		lines = append(lines, fmt.Sprintf("link %d %s %s", a.Index, a.Name, l.Type()))
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	assert.NilError(t, err)
	for _, a := range addrs {
		lines = append(lines, fmt.Sprintf("addr %d %s", a.LinkIndex, a.IPNet))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	assert.NilError(t, err)
	for _, r := range routes {
		lines = append(lines, fmt.Sprintf("route %d %v %v %d", r.Table, r.Dst, r.Gw, r.LinkIndex))
	}
	slices.Sort(lines)
	return lines
}

func TestHostUnchanged(t *testing.T) {
	before := hostNet(t)
	s := testSegment(t)
	addMachine(t, s, "a", addrA)
	addMachine(t, s, "b", addrB)
	assert.DeepEqual(t, hostNet(t), before)
	assert.NilError(t, s.RemoveMachine("a"))
	assert.NilError(t, s.Delete())
	assert.DeepEqual(t, hostNet(t), before)
}

// files lists the segment's folder.
func files(t *testing.T, s *Segment) []string {
	t.Helper()
	entries, err := os.ReadDir(s.Dir())
	assert.NilError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// labLinks lists the links of the lab's namespace.
func labLinks(t *testing.T, s *Segment) []string {
	t.Helper()
	var names []string
	assert.NilError(t, s.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	}))
	return names
}

func TestAddMachineRefuses(t *testing.T) {
	s := testSegment(t)
	addMachine(t, s, "a", addrA)
	tests := []struct {
		name string
		addr netip.Addr
		err  string
	}{
		{name: "b", addr: netip.MustParseAddr("10.78.0.5"), err: "machine b: address 10.78.0.5 is outside the segment's prefix 10.77.0.0/24"},
		{name: "b", addr: s.Gateway(), err: "machine b: address 10.77.0.1 is the segment's gateway"},
		{name: "b", addr: netip.MustParseAddr("10.77.0.0"), err: "network address"},
		{name: "b", addr: netip.MustParseAddr("10.77.0.255"), err: "broadcast address"},
		{name: "b", addr: netip.Addr{}, err: "machine b: no address"},
		{name: "a", addr: netip.MustParseAddr("10.77.0.20"), err: "machine a is already on the segment"},
		{name: "lab", addr: addrB, err: `machine name "lab": the name of the lab's own namespace`},
		{name: "", addr: addrB, err: `machine name "" is not a simple file name`},
		{name: "..", addr: addrB, err: `machine name ".." is not a simple file name`},
		{name: "../b", addr: addrB, err: `machine name "../b" is not a simple file name`},
		{name: "x/b", addr: addrB, err: `machine name "x/b" is not a simple file name`},
		{name: ".b", addr: addrB, err: `machine name ".b" is not a simple file name`},
		{name: "b c", addr: addrB, err: `machine name "b c" is not a simple file name`},
	}
	for _, tc := range tests {
		t.Run(tc.name+" "+tc.addr.String(), func(t *testing.T) {
			filesBefore, linksBefore := files(t, s), labLinks(t, s)
			_, err := s.AddMachine(tc.name, tc.addr)
			assert.ErrorContains(t, err, tc.err)
			assert.DeepEqual(t, files(t, s), filesBefore)
			assert.DeepEqual(t, labLinks(t, s), linksBefore)
		})
	}
	// The refusals left machine a as it was.
	address := listen(t, in(s, "a"), addrA.String(), "a")
	reply, err := talk(s.Do, address, "lab")
	assert.NilError(t, err)
	assert.Equal(t, reply, "a:lab\n")
}

func TestAddMachineCleansUp(t *testing.T) {
	s := testSegment(t)
	// A broken segment: its bridge is a link that takes no ports, so the
	// machine's veth pair fails to attach once it is made.
	assert.NilError(t, s.Do(func() error {
		br, err := netlink.LinkByName(Bridge)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(br); err != nil {
			return err
		}
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: Bridge}, PeerName: "peer0"})
	}))
	filesBefore, linksBefore := files(t, s), labLinks(t, s)
	_, err := s.AddMachine("a", addrA)
	assert.ErrorContains(t, err, "machine a: attaching m-a to the bridge liken0")
	assert.DeepEqual(t, files(t, s), filesBefore)
	assert.DeepEqual(t, labLinks(t, s), linksBefore)
}

// mounts lists the mount points under dir.
func mounts(t *testing.T, dir string) []string {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	assert.NilError(t, err)
	var under []string
	for _, line := range strings.Split(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			under = append(under, f[4])
		}
	}
	slices.Sort(under)
	return under
}

func TestDelete(t *testing.T) {
	s := testSegment(t)
	pathA := addMachine(t, s, "a", addrA)
	pathB := addMachine(t, s, "b", addrB)
	assert.DeepEqual(t, files(t, s), []string{"a", "b", "lab"})
	assert.DeepEqual(t, mounts(t, s.Dir()), []string{pathA, pathB, filepath.Join(s.Dir(), "lab")})

	assert.NilError(t, s.Delete())
	_, err := os.Stat(s.Dir())
	assert.Check(t, errors.Is(err, fs.ErrNotExist), "the segment's folder: %v", err)
	assert.Check(t, is.Len(mounts(t, s.Dir()), 0))
	assert.NilError(t, s.Delete(), "a second Delete")

	_, err = Open(s.Dir(), prefix)
	assert.ErrorContains(t, err, "no network segment at "+s.Dir())
	assert.Check(t, errors.Is(err, fs.ErrNotExist))
	assert.ErrorContains(t, s.Do(func() error { return nil }), "lab")
	assert.ErrorContains(t, s.DoIn("a", func() error { return nil }), "machine a is not on the segment")
}

func TestRemoveMachine(t *testing.T) {
	s := testSegment(t)
	addMachine(t, s, "a", addrA)
	addMachine(t, s, "b", addrB)
	assert.NilError(t, s.RemoveMachine("a"))
	assert.DeepEqual(t, files(t, s), []string{"b", "lab"})
	assert.Check(t, !slices.Contains(labLinks(t, s), "m-a"), "%v", labLinks(t, s))
	assert.Check(t, slices.Contains(labLinks(t, s), "m-b"), "%v", labLinks(t, s))
	_, err := s.NetNS("a")
	assert.ErrorContains(t, err, "machine a is not on the segment")
	assert.NilError(t, s.RemoveMachine("a"), "again")
	assert.NilError(t, s.RemoveMachine("never-there"))
	assert.ErrorContains(t, s.RemoveMachine("../lab"), "not a simple file name")

	// The name and the address serve again.
	addMachine(t, s, "a", addrA)
	address := listen(t, in(s, "a"), addrA.String(), "a")
	reply, err := talk(in(s, "b"), address, "b")
	assert.NilError(t, err)
	assert.Equal(t, reply, "a:b\n")
}

func TestOpen(t *testing.T) {
	s := testSegment(t)
	pathA := addMachine(t, s, "a", addrA)

	o, err := Open(s.Dir(), prefix)
	assert.NilError(t, err)
	assert.Equal(t, o.Gateway(), s.Gateway())
	path, err := o.NetNS("a")
	assert.NilError(t, err)
	assert.Equal(t, path, pathA)
	addMachine(t, o, "b", addrB)
	address := listen(t, in(s, "b"), addrB.String(), "b")
	reply, err := talk(in(o, "a"), address, "a")
	assert.NilError(t, err)
	assert.Equal(t, reply, "b:a\n")

	_, err = Open(s.Dir(), netip.MustParsePrefix("10.78.0.0/24"))
	assert.ErrorContains(t, err, "its bridge does not hold the gateway 10.78.0.1/24")
	_, err = Open(t.TempDir(), prefix)
	assert.ErrorContains(t, err, "no network segment at")
	_, err = Create(s.Dir(), prefix)
	assert.ErrorContains(t, err, "a segment already exists at "+s.Dir())
}

func TestCreateRefusesPrefix(t *testing.T) {
	for _, p := range []string{"10.77.0.0/31", "10.77.0.4/32", "fd00::/64"} {
		t.Run(p, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "net")
			_, err := Create(dir, netip.MustParsePrefix(p))
			assert.ErrorContains(t, err, "the segment's prefix "+p+": not an IPv4 prefix of at most 30 bits")
			_, err = os.Stat(dir)
			assert.Check(t, errors.Is(err, fs.ErrNotExist))
		})
	}
	// A prefix given with host bits is the network's.
	s, err := Create(filepath.Join(t.TempDir(), "net"), netip.MustParsePrefix("10.77.0.9/24"))
	assert.NilError(t, err)
	defer s.Delete()
	assert.Equal(t, s.Gateway(), netip.MustParseAddr("10.77.0.1"))
	assert.Equal(t, s.Prefix(), prefix)
}

func TestVethName(t *testing.T) {
	names := []string{"a", "leader-1", "abcdefghijklm", "abcdefghijklmn", "abcdefghijklmno", strings.Repeat("x", 63)}
	seen := map[string]string{}
	for _, n := range names {
		v := vethName(n)
		assert.Check(t, len(v) <= unix.IFNAMSIZ-1, "%s: %s", n, v)
		assert.Check(t, is.Equal(vethName(n), v), "deterministic")
		if other, ok := seen[v]; ok {
			t.Errorf("%s and %s share %s", n, other, v)
		}
		seen[v] = n
	}
	assert.Equal(t, vethName("leader-1"), "m-leader-1")
	assert.Equal(t, vethName("abcdefghijklm"), "m-abcdefghijklm")
	assert.Check(t, strings.HasPrefix(vethName("abcdefghijklmn"), "h-"))
}
