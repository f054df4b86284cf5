// Package nsnet gives a lab of machines in namespaces one network segment, inside a network namespace of the lab's own.
package nsnet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Bridge is the name of the segment's bridge in the lab's namespace.
const Bridge = "liken0"

// labName is the lab's namespace's file in the segment's folder; no
// machine may take it.
const labName = "lab"

// Segment is one lab's network segment: a bridge holding the gateway's
// address in the lab's own network namespace, and a network namespace per
// machine joined to the bridge by a veth pair. The namespaces are files
// in the segment's folder (bind mounts, which outlive the process that
// made them): Dir/lab is the lab's, Dir/<machine> each machine's. Nothing
// is added to the host's network namespace.
type Segment struct {
	dir    string
	prefix netip.Prefix
	gw     netip.Addr
}

// Create makes a segment in dir (created if needed; it holds nothing
// else): the lab's namespace with lo up and the bridge up, holding the
// first host address of prefix, an IPv4 prefix of at most 30 bits. It
// refuses a folder that already has a segment. It needs root.
func Create(dir string, prefix netip.Prefix) (*Segment, error) {
	s, err := newSegment(dir, prefix)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("the segment's folder: %w", err)
	}
	lab := s.path(labName)
	if err := newNS(lab); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("a segment already exists at %s", dir)
		}
		return nil, fmt.Errorf("the lab's network namespace %s: %w", lab, err)
	}
	if err := s.setUpLab(); err != nil {
		return nil, errors.Join(fmt.Errorf("the lab's network namespace %s: %w", lab, err), removeNS(lab))
	}
	return s, nil
}

// Open returns the segment that Create made in dir with prefix, for a
// later command. It fails if there is none, or if its bridge does not
// hold prefix's gateway.
func Open(dir string, prefix netip.Prefix) (*Segment, error) {
	s, err := newSegment(dir, prefix)
	if err != nil {
		return nil, err
	}
	h, err := s.labHandle()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no network segment at %s: %w", dir, err)
		}
		return nil, err
	}
	defer h.Close()
	br, err := h.LinkByName(Bridge)
	if err != nil {
		return nil, fmt.Errorf("the segment at %s: the bridge %s: %w", dir, Bridge, err)
	}
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("the segment at %s: the bridge's addresses: %w", dir, err)
	}
	want := ipNet(s.gw, s.prefix.Bits()).String()
	for _, a := range addrs {
		if a.IPNet.String() == want {
			return s, nil
		}
	}
	return nil, fmt.Errorf("the segment at %s: its bridge does not hold the gateway %s (made with another prefix than %s?)", dir, want, s.prefix)
}

func newSegment(dir string, prefix netip.Prefix) (*Segment, error) {
	if !prefix.IsValid() || !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return nil, fmt.Errorf("the segment's prefix %s: not an IPv4 prefix of at most 30 bits", prefix)
	}
	prefix = prefix.Masked()
	return &Segment{dir: dir, prefix: prefix, gw: prefix.Addr().Next()}, nil
}

// Dir is the segment's folder.
func (s *Segment) Dir() string { return s.dir }

// Prefix is the segment's prefix.
func (s *Segment) Prefix() netip.Prefix { return s.prefix }

// LabNetNS is the path of the lab's network namespace, where the lab's
// servers listen on the gateway's address.
func (s *Segment) LabNetNS() string { return s.path(labName) }

// Gateway is the bridge's address in the lab's namespace, the machines'
// default gateway: the prefix's first host address.
func (s *Segment) Gateway() netip.Addr { return s.gw }

func (s *Segment) path(name string) string { return filepath.Join(s.dir, name) }

func (s *Segment) setUpLab() error {
	h, err := s.labHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	if err := setUp(h, "lo"); err != nil {
		return err
	}
	// An address of its own keeps the bridge's address from following
	// its ports' (the lowest of them) as machines come and go.
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return err
	}
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: Bridge, HardwareAddr: mac}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("the bridge %s: %w", Bridge, err)
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: ipNet(s.gw, s.prefix.Bits())}); err != nil {
		return fmt.Errorf("the gateway's address on %s: %w", Bridge, err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("the bridge %s up: %w", Bridge, err)
	}
	return nil
}

// AddMachine gives the machine name a network namespace on the segment
// and returns its path (for nsmachine.Machine.NetNS): lo up, and eth0
// with addr, up, with a default route via the gateway; eth0's peer is
// attached to the bridge in the lab's namespace. It refuses a name that
// is not a simple file name or is already there, and an address outside
// the prefix, or the prefix's network, broadcast or gateway address. It
// leaves nothing behind when it fails.
func (s *Segment) AddMachine(name string, addr netip.Addr) (nsPath string, err error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	addr = addr.Unmap()
	if err := s.checkAddr(addr); err != nil {
		return "", fmt.Errorf("machine %s: %w", name, err)
	}
	lab, err := s.labHandle()
	if err != nil {
		return "", err
	}
	defer lab.Close()
	br, err := lab.LinkByName(Bridge)
	if err != nil {
		return "", fmt.Errorf("the lab's bridge %s: %w", Bridge, err)
	}
	path := s.path(name)
	if _, err := os.Lstat(path); err == nil {
		return "", fmt.Errorf("machine %s is already on the segment (%s exists)", name, path)
	}
	veth := vethName(name)
	if _, err := lab.LinkByName(veth); err == nil {
		return "", fmt.Errorf("machine %s: the lab's namespace already has a link %s", name, veth)
	} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return "", fmt.Errorf("machine %s: the link %s: %w", name, veth, err)
	}
	if err := newNS(path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("machine %s is already on the segment (%s exists)", name, path)
		}
		return "", fmt.Errorf("machine %s's network namespace %s: %w", name, path, err)
	}
	if err := s.plug(lab, br, path, veth, addr); err != nil {
		err = fmt.Errorf("machine %s: %w", name, err)
		if l, lerr := lab.LinkByName(veth); lerr == nil {
			if derr := lab.LinkDel(l); derr != nil {
				err = errors.Join(err, fmt.Errorf("removing the link %s: %w", veth, derr))
			}
		}
		return "", errors.Join(err, removeNS(path))
	}
	return path, nil
}

// plug makes the machine's side of the segment in its namespace at path.
func (s *Segment) plug(lab *netlink.Handle, br netlink.Link, path, veth string, addr netip.Addr) error {
	m, err := handleIn(path)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := setUp(m, "lo"); err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// The peer is made in the machine's namespace, named eth0 there.
	pair := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: veth},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(fd),
	}
	if err := lab.LinkAdd(pair); err != nil {
		return fmt.Errorf("the veth pair %s/eth0: %w", veth, err)
	}
	end, err := lab.LinkByName(veth)
	if err != nil {
		return fmt.Errorf("the link %s: %w", veth, err)
	}
	if err := lab.LinkSetMaster(end, br); err != nil {
		return fmt.Errorf("attaching %s to the bridge %s: %w", veth, Bridge, err)
	}
	eth0, err := m.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	if err := m.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(addr, s.prefix.Bits())}); err != nil {
		return fmt.Errorf("eth0's address %s: %w", addr, err)
	}
	if err := m.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := lab.LinkSetUp(end); err != nil {
		return fmt.Errorf("the link %s up: %w", veth, err)
	}
	route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.gw.AsSlice()}
	if err := m.RouteAdd(route); err != nil {
		return fmt.Errorf("the default route via %s: %w", s.gw, err)
	}
	return s.waitReady(m, eth0.Attrs().Index, end.Attrs().Index)
}

// readyWithin bounds AddMachine's wait for the machine's link.
const readyWithin = 5 * time.Second

// waitReady waits until the machine's link carries frames: eth0 up and
// its peer a forwarding port of the bridge. The kernel brings links up
// a moment after they are set up (its link watch); a frame sent before
// is lost, and a first connection would wait for TCP to send again.
func (s *Segment) waitReady(m *netlink.Handle, eth0, port int) error {
	return RunIn(s.path(labName), func() error {
		deadline := time.Now().Add(readyWithin)
		for {
			l, err := m.LinkByIndex(eth0)
			if err != nil {
				return fmt.Errorf("eth0: %w", err)
			}
			state, err := portState(port)
			if err != nil {
				return err
			}
			if l.Attrs().OperState == netlink.OperUp && state == stateForwarding {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("eth0 is %s and its peer's bridge port is in state %d, not up and forwarding after %s", l.Attrs().OperState, state, readyWithin)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// stateForwarding is a bridge port's BR_STATE_FORWARDING.
const stateForwarding = 3

// portState is the state of the bridge port with the index in the
// namespace of the calling thread.
func portState(index int) (uint8, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_BRIDGE))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return 0, fmt.Errorf("the bridge's ports: %w", err)
	}
	for _, msg := range msgs {
		info := nl.DeserializeIfInfomsg(msg)
		if int(info.Index) != index {
			continue
		}
		attrs, err := nl.ParseRouteAttr(msg[info.Len():])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type != unix.IFLA_PROTINFO|unix.NLA_F_NESTED {
				continue
			}
			port, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return 0, err
			}
			for _, p := range port {
				if p.Attr.Type == unix.IFLA_BRPORT_STATE && len(p.Value) == 1 {
					return p.Value[0], nil
				}
			}
		}
	}
	return 0, fmt.Errorf("link %d is not a port of the bridge", index)
}

// NetNS is the path of the machine's network namespace; it fails if the
// machine is not on the segment.
func (s *Segment) NetNS(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	path := s.path(name)
	if err := checkNS(path); err != nil {
		return "", fmt.Errorf("machine %s is not on the segment: %w", name, err)
	}
	return path, nil
}

// RemoveMachine removes the machine's veth pair and its namespace file.
// A machine that is not there is already removed.
func (s *Segment) RemoveMachine(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var errs []error
	switch lab, err := s.labHandle(); {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, errNotNS):
		// No lab, no bridge: the pair went with the lab's namespace.
	case err != nil:
		errs = append(errs, err)
	default:
		veth := vethName(name)
		// Deleting one end deletes both.
		if l, err := lab.LinkByName(veth); err == nil {
			if err := lab.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("machine %s: removing the link %s: %w", name, veth, err))
			}
		} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
			errs = append(errs, fmt.Errorf("machine %s: the link %s: %w", name, veth, err))
		}
		lab.Close()
	}
	if err := removeNS(s.path(name)); err != nil {
		errs = append(errs, fmt.Errorf("machine %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// Delete removes every machine, the lab's namespace and the segment's
// folder. A segment already deleted is fine.
func (s *Segment) Delete() error {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("the segment's folder: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == labName || checkName(e.Name()) != nil {
			continue
		}
		if err := s.RemoveMachine(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeNS(s.path(labName)); err != nil {
		errs = append(errs, fmt.Errorf("the lab's network namespace: %w", err))
	}
	if err := os.Remove(s.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("the segment's folder: %w", err))
	}
	return errors.Join(errs...)
}

// Do runs fn on a thread in the lab's namespace: the sockets fn makes
// belong to it, and stay there. The thread ends with fn; goroutines fn
// starts run on other threads, in the host's namespace.
func (s *Segment) Do(fn func() error) error {
	return RunIn(s.path(labName), fn)
}

// DoIn runs fn on a thread in the machine's namespace, as Do does in the
// lab's.
func (s *Segment) DoIn(name string, fn func() error) error {
	path, err := s.NetNS(name)
	if err != nil {
		return err
	}
	return RunIn(path, fn)
}

// Listen listens in the lab's namespace, as net.Listen does.
func (s *Segment) Listen(network, address string) (l net.Listener, err error) {
	err = s.Do(func() error {
		l, err = net.Listen(network, address)
		return err
	})
	return l, err
}

// Dial connects from the lab's namespace, as net.Dialer.DialContext
// does. A name in address is looked up from the host's namespace; give an
// address.
func (s *Segment) Dial(ctx context.Context, network, address string) (c net.Conn, err error) {
	err = s.Do(func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// vethName is the name of the lab's end of the machine's veth pair in
// the lab's namespace: "m-" and the name if it fits an interface's name,
// "h-" and a hash of it otherwise.
func vethName(machine string) string {
	if len(machine) <= unix.IFNAMSIZ-1-2 {
		return "m-" + machine
	}
	sum := sha256.Sum256([]byte(machine))
	return "h-" + hex.EncodeToString(sum[:])[:unix.IFNAMSIZ-1-2]
}

var simpleName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func checkName(name string) error {
	if name == labName {
		return fmt.Errorf("machine name %q: the name of the lab's own namespace", name)
	}
	if !simpleName.MatchString(name) {
		return fmt.Errorf("machine name %q is not a simple file name (a letter or digit, then letters, digits, '.', '_' or '-'; at most 63)", name)
	}
	return nil
}

func (s *Segment) checkAddr(a netip.Addr) error {
	last := s.prefix.Addr().As4()
	for i := s.prefix.Bits(); i < 32; i++ {
		last[i/8] |= 1 << (7 - i%8)
	}
	switch {
	case !a.IsValid():
		return errors.New("no address")
	case !s.prefix.Contains(a):
		return fmt.Errorf("address %s is outside the segment's prefix %s", a, s.prefix)
	case a == s.gw:
		return fmt.Errorf("address %s is the segment's gateway", a)
	case a == s.prefix.Addr():
		return fmt.Errorf("address %s is the network address of %s", a, s.prefix)
	case a == netip.AddrFrom4(last):
		return fmt.Errorf("address %s is the broadcast address of %s", a, s.prefix)
	}
	return nil
}

func (s *Segment) labHandle() (*netlink.Handle, error) {
	path := s.path(labName)
	h, err := handleIn(path)
	if err != nil {
		return nil, fmt.Errorf("the lab's network namespace %s: %w", path, err)
	}
	return h, nil
}

// handleIn is a netlink handle whose socket is in the namespace at path.
func handleIn(path string) (h *netlink.Handle, err error) {
	err = RunIn(path, func() error {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	return h, err
}

func setUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// newNS makes a network namespace and binds it on a new file at path; it
// fails with fs.ErrExist if path exists.
func newNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		// The thread is never unlocked: in the new namespace, it ends
		// with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			done <- fmt.Errorf("binding the namespace on %s: %w", path, err)
			return
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		return errors.Join(err, os.Remove(path))
	}
	return nil
}

// removeNS unbinds the namespace at path and removes the file; a path
// that is not there is fine.
func removeNS(path string) error {
	for {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err == unix.EINVAL || err == unix.ENOENT {
			break // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// errNotNS is a file where a namespace was expected: one whose namespace
// was unbound.
var errNotNS = errors.New("not a namespace's file")

// checkNS fails unless path is a namespace's file.
func checkNS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("%s: %w", path, errNotNS)
	}
	return nil
}

// RunIn runs fn on a thread that joined the network namespace at path,
// and ends the thread with fn. A panic in fn is raised again in the
// caller's goroutine.
func RunIn(path string, fn func() error) error {
	if err := checkNS(path); err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	type outcome struct {
		err      error
		returned bool
		panicked any
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		defer func() {
			if !o.returned {
				o.panicked = recover()
			}
			done <- o
		}()
		// The thread is never unlocked: it ends, in the namespace, with
		// this goroutine.
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			o.err, o.returned = fmt.Errorf("joining the network namespace %s: %w", path, err), true
			return
		}
		o.err = fn()
		o.returned = true
	}()
	o := <-done
	if !o.returned {
		if o.panicked == nil {
			panic("nsnet: the function run in " + path + " ended its goroutine (runtime.Goexit)")
		}
		panic(o.panicked)
	}
	return o.err
}
