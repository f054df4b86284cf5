// Package names is the VM lab's name server: it answers, on a loopback UDP
// port, the few names of the lab (its release channel's) and no others, so
// that the lab's machines resolve the channel by name through QEMU's
// address of this computer and never ask a name server outside the lab.
package names

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
	"k8s.io/klog/v2"
)

// TTL is the lifetime of the answers, in seconds.
const TTL = 30

// Table maps a name (lower case, with or without the final dot) to its
// address.
type Table map[string]netip.Addr

// ParseTable reads NAME=ADDRESS pairs.
func ParseTable(pairs []string) (Table, error) {
	t := Table{}
	for _, p := range pairs {
		name, addr, ok := strings.Cut(p, "=")
		a, err := netip.ParseAddr(addr)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("%q is not NAME=ADDRESS, such as channel.liken.internal=10.0.2.2", p)
		}
		t[canonical(name)] = a
	}
	return t, nil
}

func canonical(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

// Answer is the response to one query: the address of a name of the table
// (an A or AAAA record of its family; no record of another type), and
// NXDOMAIN for any other name. A query it cannot parse is an error.
func (t Table) Answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	resp := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, OpCode: h.OpCode})
	resp.EnableCompression()
	addr, known := t[canonical(q.Name.String())]
	if !known {
		resp = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, OpCode: h.OpCode, RCode: dnsmessage.RCodeNameError})
	}
	if err := resp.StartQuestions(); err != nil {
		return nil, err
	}
	if err := resp.Question(q); err != nil {
		return nil, err
	}
	if err := resp.StartAnswers(); err != nil {
		return nil, err
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: TTL}
	switch {
	case !known:
	case q.Type == dnsmessage.TypeA && addr.Is4():
		err = resp.AResource(rh, dnsmessage.AResource{A: addr.As4()})
	case q.Type == dnsmessage.TypeAAAA && addr.Is6():
		err = resp.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: addr.As16()})
	}
	if err != nil {
		return nil, err
	}
	return resp.Finish()
}

// Serve answers the queries that reach pc until ctx ends.
func (t Table) Serve(ctx context.Context, pc net.PacketConn) error {
	go func() {
		<-ctx.Done()
		_ = pc.Close()
	}()
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		resp, err := t.Answer(buf[:n])
		if err != nil {
			klog.FromContext(ctx).V(1).Info("A query that does not parse", "from", from, "err", err)
			continue
		}
		if _, err := pc.WriteTo(resp, from); err != nil {
			klog.FromContext(ctx).Info("Cannot answer", "to", from, "err", err)
		}
	}
}
