package release_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// The benchmarks of this file compare liken's release pipeline with the
// standard tools doing the same work on the same file in the same run:
// `openssl dgst -sha256` (which uses the CPU's SHA instructions, as Go's
// crypto/sha256 does) for hashing, and `curl | tee | openssl dgst` for
// download, write and hash. Every round runs both, alternating which goes
// first; the figures are medians over the rounds.
//
//	go test -run '^$' -bench . -benchtime 1x ./release                  # 64 MiB, 5 rounds
//	LIKEN_BENCH=full go test -run '^$' -bench . -benchtime 1x ./release # 1 GiB
//
// LIKEN_BENCH_MIB sets the size in MiB and LIKEN_BENCH_ROUNDS the rounds.

// benchSize is the size of the rootfs the benchmarks use: 64 MiB, 1 GiB
// with LIKEN_BENCH=full, or LIKEN_BENCH_MIB MiB.
func benchSize(b testing.TB) int {
	if s := os.Getenv("LIKEN_BENCH_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		assert.NilError(b, err, "LIKEN_BENCH_MIB must be a whole number of MiB")
		assert.Assert(b, n > 0, "LIKEN_BENCH_MIB must be more than 0")
		return n << 20
	}
	if os.Getenv("LIKEN_BENCH") == "full" {
		return 1 << 30
	}
	return 64 << 20
}

// benchRounds is how many rounds each comparison runs: 5, or
// LIKEN_BENCH_ROUNDS.
func benchRounds(b testing.TB) int {
	if s := os.Getenv("LIKEN_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		assert.NilError(b, err, "LIKEN_BENCH_ROUNDS must be a whole number")
		assert.Assert(b, n > 0, "LIKEN_BENCH_ROUNDS must be more than 0")
		return n
	}
	return 5
}

// usage is the CPU time used so far by this process (self) and by the
// children it waited for.
type usage struct{ self, children time.Duration }

func cpuUsage(t testing.TB) usage {
	var self, children syscall.Rusage
	assert.NilError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &self))
	assert.NilError(t, syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children))
	return usage{
		self:     time.Duration(self.Utime.Nano() + self.Stime.Nano()),
		children: time.Duration(children.Utime.Nano() + children.Stime.Nano()),
	}
}

// run is one measured run: its wall time and the CPU time it used, in this
// process and in the programs it started.
type run struct {
	wall, cpu time.Duration
}

// measure runs f and returns its wall and CPU time.
func measure(t testing.TB, f func()) run {
	u0, t0 := cpuUsage(t), time.Now()
	f()
	wall, u1 := time.Since(t0), cpuUsage(t)
	return run{wall: wall, cpu: u1.self - u0.self + u1.children - u0.children}
}

// comparison holds the rounds of one pipeline and its baseline.
type comparison struct {
	name, baseline string
	size           int
	ours, base     []run
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func walls(rs []run) []time.Duration {
	out := make([]time.Duration, len(rs))
	for i, r := range rs {
		out[i] = r.wall
	}
	return out
}

func cpus(rs []run) []time.Duration {
	out := make([]time.Duration, len(rs))
	for i, r := range rs {
		out[i] = r.cpu
	}
	return out
}

// rate is MB (10^6 bytes) per second of d.
func rate(size int, d time.Duration) float64 {
	if d <= 0 {
		return math.Inf(1)
	}
	return float64(size) / d.Seconds() / 1e6
}

// figures are the medians: throughput per wall second and per CPU second,
// ours and the baseline's, and the ratios (ours / baseline; above 1 is
// faster than the baseline).
type figures struct {
	mbps, baseMBps, ratio        float64
	mbpcs, baseMBpcs, cpuRatio   float64
	wall, baseWall, cpu, baseCPU time.Duration
	rounds                       int
	name, baseline               string
	size                         int
}

func (c *comparison) figures() figures {
	f := figures{
		wall: median(walls(c.ours)), baseWall: median(walls(c.base)),
		cpu: median(cpus(c.ours)), baseCPU: median(cpus(c.base)),
		rounds: len(c.ours), name: c.name, baseline: c.baseline, size: c.size,
	}
	f.mbps, f.baseMBps = rate(c.size, f.wall), rate(c.size, f.baseWall)
	f.mbpcs, f.baseMBpcs = rate(c.size, f.cpu), rate(c.size, f.baseCPU)
	f.ratio, f.cpuRatio = f.mbps/f.baseMBps, f.mbpcs/f.baseMBpcs
	return f
}

// report adds the figures to the benchmark's output and logs a table row.
func (f figures) report(b *testing.B, prefix string) {
	b.ReportMetric(f.mbps, prefix+"MB/s")
	b.ReportMetric(f.baseMBps, prefix+"baseline-MB/s")
	b.ReportMetric(f.ratio, prefix+"x-baseline")
	b.ReportMetric(f.mbpcs, prefix+"MB/cpu-s")
	b.ReportMetric(f.baseMBpcs, prefix+"baseline-MB/cpu-s")
	b.ReportMetric(f.cpuRatio, prefix+"x-baseline-cpu")
	b.Log(f.String())
}

func (f figures) String() string {
	return fmt.Sprintf("| %s | %d MiB | %.0f MB/s (%.0f MB/cpu-s) | %s: %.0f MB/s (%.0f MB/cpu-s) | %.2f x wall, %.2f x per CPU second | median of %d |",
		f.name, f.size>>20, f.mbps, f.mbpcs, f.baseline, f.baseMBps, f.baseMBpcs, f.ratio, f.cpuRatio, f.rounds)
}

// sane checks that a comparison produced finite, positive figures.
func (f figures) sane(t testing.TB) {
	t.Helper()
	for name, v := range map[string]float64{"MB/s": f.mbps, "baseline MB/s": f.baseMBps, "MB/cpu-s": f.mbpcs, "baseline MB/cpu-s": f.baseMBpcs, "ratio": f.ratio, "CPU ratio": f.cpuRatio} {
		assert.Assert(t, v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v), "%s of %s is %v: %s", name, f.name, v, f)
	}
}

// atLeast fails unless liken's throughput is at least target times the
// baseline's, in wall-clock time.
func (f figures) atLeast(t testing.TB, target float64) {
	t.Helper()
	assert.Assert(t, f.ratio >= target, "%s runs at %.2f x %s, below the target of %.2f x (docs/benchmarks.md): %s", f.name, f.ratio, f.baseline, target, f)
}

// Targets against the baselines: the full benchmarks (docs/benchmarks.md),
// and the smoke's loose form, which must hold on a busy 2-core machine.
const (
	targetRatio      = 0.9
	smokeTargetRatio = 0.5
)

// needTool fails (never skips) when a baseline program is missing.
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	assert.NilError(t, err, "the benchmarks compare against %s, which is not installed: install it (Debian: apt-get install %s)", name, name)
	return p
}

// opensslSum runs `openssl dgst -sha256 file` and returns the hex sum.
func opensslSum(t testing.TB, file string) string {
	t.Helper()
	out, err := exec.Command(needTool(t, "openssl"), "dgst", "-sha256", "-r", file).Output()
	assert.NilError(t, err, "openssl dgst -sha256 %s", file)
	sum, _, _ := strings.Cut(string(out), " ")
	return sum
}

// verifyComparison re-hashes a published release with release.VerifyDir
// and the rootfs with openssl, round after round.
func verifyComparison(t testing.TB, size, rounds int) (figures, string) {
	c := newChannel(t)
	target := c.publish(v1, artifact{"rootfs.squashfs", size})
	root, err := os.OpenRoot(filepath.Join(c.dir, v1))
	assert.NilError(t, err)
	defer root.Close()
	rootfs := c.file(v1, "rootfs.squashfs")
	cmp := &comparison{name: "release.VerifyDir (release.yaml + rootfs)", baseline: "openssl dgst -sha256", size: size}
	var sum string
	ours := func() {
		cmp.ours = append(cmp.ours, measure(t, func() {
			_, err := release.VerifyDir(context.Background(), root, target)
			assert.NilError(t, err)
		}))
	}
	base := func() {
		cmp.base = append(cmp.base, measure(t, func() { sum = opensslSum(t, rootfs) }))
	}
	for i := range rounds {
		if i%2 == 0 {
			ours()
			base()
		} else {
			base()
			ours()
		}
	}
	doc, err := release.VerifyDir(context.Background(), root, target)
	assert.NilError(t, err)
	assert.Equal(t, sum, doc.Artifacts[0].SHA256, "openssl hashed another file than the release's rootfs")
	return cmp.figures(), sum
}

// fetchComparison downloads a release over loopback HTTP into a slot
// (Fetch: streamed hash and write with checkpoints; then Stage: the
// re-hash of the whole slot) and, as the baseline, pipes curl through tee
// into a file and openssl, from the same server.
func fetchComparison(t testing.TB, size, rounds int) (fetch, fetchStage figures) {
	c := newChannel(t)
	target := c.publish(v1, artifact{"rootfs.squashfs", size})
	root := t.TempDir()
	s, err := slots.Open(context.Background(), root, slots.A)
	assert.NilError(t, err)
	f := &release.Fetcher{Client: c.srv.Client()}
	curl, tee, openssl := needTool(t, "curl"), needTool(t, "tee"), needTool(t, "openssl")
	url := c.srv.URL + urlPath(v1, "rootfs.squashfs")
	// The baseline writes into the same file system as the slot.
	slotFile := filepath.Join(root, "baseline-slot")
	script := fmt.Sprintf("%s -s %s | %s %s | %s dgst -sha256 -r", curl, url, tee, slotFile, openssl)

	fc := &comparison{name: "Fetch (download, hash, write with checkpoints)", baseline: "curl -s | tee SLOT | openssl dgst -sha256", size: size}
	sc := &comparison{name: "Fetch + Stage (plus the re-hash of the slot)", baseline: fc.baseline, size: size}
	var sum string
	ours := func() {
		assert.NilError(t, s.Withdraw(slots.B))
		dl, err := s.BeginDownload(slots.B, target)
		assert.NilError(t, err)
		r1 := measure(t, func() {
			_, err = f.Fetch(context.Background(), c.srv.URL, target, dl)
			assert.NilError(t, err)
		})
		r2 := measure(t, func() {
			_, err = s.Stage(context.Background(), slots.B)
			assert.NilError(t, err)
		})
		assert.NilError(t, dl.Close())
		fc.ours = append(fc.ours, r1)
		sc.ours = append(sc.ours, run{wall: r1.wall + r2.wall, cpu: r1.cpu + r2.cpu})
	}
	base := func() {
		assert.NilError(t, os.RemoveAll(slotFile))
		r := measure(t, func() {
			var out bytes.Buffer
			cmd := exec.Command("bash", "-o", "pipefail", "-c", script)
			cmd.Stdout = &out
			assert.NilError(t, cmd.Run(), "%s", script)
			sum, _, _ = strings.Cut(out.String(), " ")
		})
		fc.base = append(fc.base, r)
		sc.base = append(sc.base, r)
	}
	for i := range rounds {
		if i%2 == 0 {
			ours()
			base()
		} else {
			base()
			ours()
		}
	}
	doc, err := release.VerifyDir(context.Background(), mustRoot(t, s.Dir(slots.B)), target)
	assert.NilError(t, err)
	assert.Equal(t, sum, doc.Artifacts[0].SHA256, "the baseline pipeline hashed other bytes than the release's rootfs")
	st, err := os.Stat(slotFile)
	assert.NilError(t, err)
	assert.Equal(t, st.Size(), int64(size), "the baseline pipeline wrote a short file")
	return fc.figures(), sc.figures()
}

func mustRoot(t testing.TB, dir string) *os.Root {
	r, err := os.OpenRoot(dir)
	assert.NilError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

// BenchmarkVerify re-hashes a release directory (release.yaml and a large
// rootfs), as Stage and Recheck do, against `openssl dgst -sha256` of the
// rootfs. Target: at least 0.9 x openssl.
func BenchmarkVerify(b *testing.B) {
	size, rounds := benchSize(b), benchRounds(b)
	var f figures
	for b.Loop() {
		f, _ = verifyComparison(b, size, rounds)
	}
	f.report(b, "")
	f.atLeast(b, targetRatio)
}

// BenchmarkFetch downloads a release over loopback HTTP into a slot and
// stages it, against `curl -s URL | tee SLOT | openssl dgst -sha256`. It
// reports Fetch alone (download, hash and write, as the baseline does,
// plus liken's checkpoints with fsync every 8 MiB) and Fetch followed by
// Stage (liken re-hashes the whole slot before it stages it). Target for
// Fetch: at least 0.9 x the baseline.
func BenchmarkFetch(b *testing.B) {
	size, rounds := benchSize(b), benchRounds(b)
	var fetch, stage figures
	for b.Loop() {
		fetch, stage = fetchComparison(b, size, rounds)
	}
	fetch.report(b, "fetch-")
	stage.report(b, "fetch+stage-")
	fetch.atLeast(b, targetRatio)
}

// TestBenchmarkSmoke runs both comparisons at 16 MiB, two rounds each, so
// that the benchmarks keep working: the baselines must hash the very bytes
// liken verified, every figure must be finite and positive, and liken must
// reach the loose form of the target (half the baseline's throughput).
func TestBenchmarkSmoke(t *testing.T) {
	const size = 16 << 20
	v, _ := verifyComparison(t, size, 2)
	v.sane(t)
	t.Log(v)
	fetch, stage := fetchComparison(t, size, 2)
	fetch.sane(t)
	stage.sane(t)
	t.Log(fetch)
	t.Log(stage)
	// Stage re-reads the slot: it cannot cost less CPU than Fetch alone.
	assert.Assert(t, stage.cpu >= fetch.cpu, "Fetch + Stage used %s CPU, less than Fetch alone (%s)", stage.cpu, fetch.cpu)
	v.atLeast(t, smokeTargetRatio)
	fetch.atLeast(t, smokeTargetRatio)
}
