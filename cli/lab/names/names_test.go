package names

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestServeAnswersTheLabsNamesOnly asks the server through Go's own
// resolver on loopback: a name of the table resolves to its address
// (whatever its case), and any other name does not exist.
func TestServeAnswersTheLabsNamesOnly(t *testing.T) {
	table, err := ParseTable([]string{"channel.liken.internal=10.0.2.2"})
	assert.NilError(t, err)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	assert.NilError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- table.Serve(ctx, pc) }()
	defer func() {
		cancel()
		assert.NilError(t, <-done)
	}()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	for _, name := range []string{"channel.liken.internal", "Channel.Liken.Internal."} {
		got, err := r.LookupNetIP(ctx, "ip", name)
		assert.NilError(t, err, name)
		assert.Check(t, is.Len(got, 1), name)
		assert.Check(t, got[0] == netip.MustParseAddr("10.0.2.2"), "%s: %v", name, got)
	}
	_, err = r.LookupNetIP(ctx, "ip", "example.com")
	var dnsErr *net.DNSError
	assert.Assert(t, errors.As(err, &dnsErr), "got %v", err)
	assert.Check(t, dnsErr.IsNotFound, "another name does not exist: %v", err)
}

func TestParseTableNamesABadPair(t *testing.T) {
	_, err := ParseTable([]string{"channel.liken.internal"})
	assert.ErrorContains(t, err, `"channel.liken.internal" is not NAME=ADDRESS`)
	_, err = ParseTable([]string{"channel=10.0.2"})
	assert.ErrorContains(t, err, `"channel=10.0.2" is not NAME=ADDRESS`)
}
