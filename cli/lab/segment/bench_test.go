package segment

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// BenchmarkRoundTrip measures what the lab's switch adds to a frame's way
// between two virtual machines: the round trip of a full-size frame from
// one machine's socket to the other's and back, through the switch and,
// as the baseline in the same run, directly between the two sockets.
// Rounds alternate the two ways; it reports each way's median round trip
// and their ratio (docs/benchmarks.md, "The VM lab's segment").
//
//	go test -run '^$' -bench RoundTrip -benchtime 1x ./cli/lab/segment
func BenchmarkRoundTrip(b *testing.B) {
	const rounds, trips = 10, 2000
	dir := b.TempDir()
	sw, err := Listen(filepath.Join(dir, "switch.sock"))
	assert.NilError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = sw.Serve(ctx) }()

	open := func(name string) *net.UnixConn {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unixgram"})
		assert.NilError(b, err)
		b.Cleanup(func() { c.Close() })
		return c
	}
	a, peer := open("a.sock"), open("b.sock")
	macA, macB := net.HardwareAddr{0x52, 0x54, 0, 0x4c, 0, 1}, net.HardwareAddr{0x52, 0x54, 0, 0x4c, 0, 2}
	frame := func(dst, src net.HardwareAddr) []byte {
		f := make([]byte, 1514)
		copy(f, dst)
		copy(f[6:], src)
		return f
	}
	toB, toA := frame(macB, macA), frame(macA, macB)
	swAddr := &net.UnixAddr{Name: sw.Addr(), Net: "unixgram"}
	aAddr, bAddr := a.LocalAddr().(*net.UnixAddr), peer.LocalAddr().(*net.UnixAddr)
	// The switch learns both machines before the rounds: a's first frame
	// reaches nobody yet, b's reaches a.
	_, err = a.WriteToUnix(toB, swAddr)
	assert.NilError(b, err)
	_, err = peer.WriteToUnix(toA, swAddr)
	assert.NilError(b, err)
	buf := make([]byte, maxFrame)
	assert.NilError(b, a.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, _, err = a.ReadFromUnix(buf)
	assert.NilError(b, err)

	// The other machine echoes every frame back the way it came.
	echo := make(chan struct{})
	go func() {
		defer close(echo)
		buf := make([]byte, maxFrame)
		for {
			n, from, err := peer.ReadFromUnix(buf)
			if err != nil {
				return
			}
			to := aAddr
			if from.Name == swAddr.Name {
				to = swAddr
			}
			copy(buf[:n], toA)
			if _, err := peer.WriteToUnix(buf[:n], to); err != nil {
				return
			}
		}
	}()
	trip := func(to *net.UnixAddr) time.Duration {
		start := time.Now()
		_, err := a.WriteToUnix(toB, to)
		assert.NilError(b, err)
		assert.NilError(b, a.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, _, err = a.ReadFromUnix(buf)
		assert.NilError(b, err, "a frame was lost")
		return time.Since(start)
	}
	var through, direct []time.Duration
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for _, sw := range []bool{r%2 == 0, r%2 != 0} {
				to, into := bAddr, &direct
				if sw {
					to, into = swAddr, &through
				}
				for range trips {
					*into = append(*into, trip(to))
				}
			}
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	mt, md := median(through), median(direct)
	b.ReportMetric(float64(mt.Microseconds()), "µs/trip-switch")
	b.ReportMetric(float64(md.Microseconds()), "µs/trip-direct")
	b.ReportMetric(float64(mt)/float64(md), "ratio")
	b.Logf("round trip of a 1514-byte frame: through the switch %s, direct %s (medians of %d each): the switch adds %s",
		mt, md, len(through), mt-md)
	peer.Close()
	<-echo
}
