package release_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/release"
	"liken.sh/liken/node/slots"
)

// benchSize is the size of the rootfs the benchmarks use: 64 MiB, or
// LIKEN_BENCH_MIB MiB.
func benchSize(b *testing.B) int {
	if s := os.Getenv("LIKEN_BENCH_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		assert.NilError(b, err)
		return n << 20
	}
	return 64 << 20
}

// cpuTime is the CPU time (user and system) the process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	assert.NilError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds the throughput per CPU second: on a shared machine the
// wall clock says more about the neighbours than about the code.
func reportCPU(b *testing.B, start time.Duration, size int) {
	used := cpuTime(b) - start
	if used > 0 {
		b.ReportMetric(float64(size)*float64(b.N)/used.Seconds()/1e6, "MB/cpu-s")
	}
}

// BenchmarkVerify re-hashes a release directory (release.yaml and a large
// rootfs), as Stage and Recheck do.
func BenchmarkVerify(b *testing.B) {
	size := benchSize(b)
	c := newChannel(b)
	target := c.publish(v1, artifact{"rootfs.squashfs", size})
	root, err := os.OpenRoot(filepath.Join(c.dir, v1))
	assert.NilError(b, err)
	defer root.Close()
	b.SetBytes(int64(size))
	start := cpuTime(b)
	for b.Loop() {
		_, err := release.VerifyDir(context.Background(), root, target)
		assert.NilError(b, err)
	}
	reportCPU(b, start, size)
}

// BenchmarkFetch downloads a release over loopback HTTP into a slot and
// stages it: the streamed hash and write with checkpoints, then the
// re-hash of the whole slot.
func BenchmarkFetch(b *testing.B) {
	size := benchSize(b)
	c := newChannel(b)
	target := c.publish(v1, artifact{"rootfs.squashfs", size})
	s, err := slots.Open(context.Background(), b.TempDir(), slots.A)
	assert.NilError(b, err)
	f := &release.Fetcher{Client: c.srv.Client()}
	b.SetBytes(int64(size))
	start := cpuTime(b)
	for b.Loop() {
		assert.NilError(b, s.Withdraw(slots.B))
		dl, err := s.BeginDownload(slots.B, target)
		assert.NilError(b, err)
		_, err = f.Fetch(context.Background(), c.srv.URL, target, dl)
		assert.NilError(b, err)
		_, err = s.Stage(context.Background(), slots.B)
		assert.NilError(b, err)
		assert.NilError(b, dl.Close())
	}
	reportCPU(b, start, size)
}
