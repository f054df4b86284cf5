package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/controllers/turns"
	"liken.sh/liken/e2e/internal/fleetsim"
)

// full is true under make bench (LIKEN_BENCH=full): the sizes and windows
// of docs/benchmarks.md.
func full() bool { return os.Getenv("LIKEN_BENCH") == "full" }

// scaleOptions shape one run of the operator at scale.
type scaleOptions struct {
	fleet fleetsim.FleetOptions
	// settle is how long the fleet runs before the idle window.
	settle time.Duration
	// idle is the window measured with only heartbeats, once with the
	// fleet's settle of 0s, then again with settleOn.
	idle time.Duration
	// settleOn is spec.disruption.settle in the second idle window; the
	// staging and the rollout run with 0s again, so that the grant is
	// timed from the turn's end.
	settleOn time.Duration
	// turns is how many finished turns the rollout window measures.
	turns int
	// maxUnavailable is the budget during the rollout.
	maxUnavailable int
}

// scaleResult is what one run measured.
type scaleResult struct {
	o scaleOptions
	// Idle window: the operator, the API server and etcd, the operator's
	// requests and the heartbeats delivered in it.
	idleOp, idleAPI, idleEtcd Usage
	idleReqs                  Counts
	idleHeartbeats            int64
	// The second idle window, with settleOn.
	settleOp   Usage
	settleReqs Counts
	renewLag   []time.Duration
	// Staging: every machine reports its release staged while the budget
	// is 0.
	stageOp   Usage
	stageReqs Counts
	// Rollout window.
	rollOp, rollAPI Usage
	rollReqs        Counts
	finished        int
	machineWrites   int64
	grantLatency    []time.Duration
	// paths split the grants along the operator's traces; requeues
	// count traces with no event.
	paths       []GrantPath
	requeues    int
	echoLatency []time.Duration
	versions    int
	overBudget  []string
	rollWall    time.Duration
}

// ledger follows the Cluster through the rollout: it checks the budget at
// every version and pairs each grant with the turn whose end freed its
// place.
type ledger struct {
	mu       sync.Mutex
	prev     map[string]bool
	removed  []removal
	grants   []grantSeen
	versions int
	problems []string
	total    int
}

type removal struct {
	machine string
	version int
}

type grantSeen struct {
	machine string
	version int
	at      time.Time
}

func (l *ledger) observe(c *likenv1.Cluster, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.versions++
	max, err := c.Spec.Disruption.MaxUnavailableFor(l.total)
	if err != nil {
		l.problems = append(l.problems, fmt.Sprintf("rv %s: %v", c.ResourceVersion, err))
	}
	now := map[string]bool{}
	leaders := 0
	for _, t := range c.Status.RebootTurns {
		now[t.Machine] = true
		if t.Leader {
			leaders++
		}
		if !l.prev[t.Machine] {
			l.grants = append(l.grants, grantSeen{machine: t.Machine, version: l.versions, at: at})
		}
	}
	for m := range l.prev {
		if !now[m] {
			l.removed = append(l.removed, removal{machine: m, version: l.versions})
		}
	}
	if len(c.Status.RebootTurns) > max {
		l.problems = append(l.problems, fmt.Sprintf("rv %s: %d turns (%s) over maxUnavailable %d", c.ResourceVersion, len(c.Status.RebootTurns), c.Status.Turns, max))
	}
	if leaders > 1 {
		l.problems = append(l.problems, fmt.Sprintf("rv %s: %d leaders hold turns (%s)", c.ResourceVersion, leaders, c.Status.Turns))
	}
	l.prev = now
}

// grantPair is a grant into the place a finished turn freed.
type grantPair struct {
	machine     string
	ended, seen time.Time
}

// latency is from the machine's last write of its turn to the grant
// arriving here.
func (p grantPair) latency() time.Duration { return p.seen.Sub(p.ended) }

// pairs pairs grants with the turn ends before them, oldest first.
func (l *ledger) pairs(finishedAt map[string]time.Time) []grantPair {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []grantPair
	next := 0
	for _, g := range l.grants {
		if next >= len(l.removed) || l.removed[next].version > g.version {
			continue // a grant into a place that was already free
		}
		r := l.removed[next]
		next++
		if t, ok := finishedAt[r.machine]; ok {
			out = append(out, grantPair{machine: g.machine, ended: t, seen: g.at})
		}
	}
	return out
}

// tracePaths reads the operator's grant traces until each paired grant
// has one (the log may lag the watch that saw the grant; 5 s at most,
// then the test fails naming the grants with none), and splits each
// grant along its trace. requeues counts the traces of a requeue (no
// event to start from).
func tracePaths(t testing.TB, logPath string, pairs []grantPair) (paths []GrantPath, requeues int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		traces, err := ReadGrantTraces(logPath)
		if err != nil {
			return poll.Error(err)
		}
		var untraced []string
		paths, requeues = nil, 0
		for _, p := range pairs {
			tr, ok := TraceOf(traces, p.machine)
			if !ok {
				untraced = append(untraced, p.machine)
				continue
			}
			if path, ok := PathOf(tr, p.ended, p.seen); ok {
				paths = append(paths, path)
			} else {
				requeues++
			}
		}
		if len(untraced) > 0 {
			return poll.Continue("the operator logged no grant trace for %d of %d grants (%s): is it at -v %d?",
				len(untraced), len(pairs), strings.Join(untraced, ", "), turns.TraceVerbosity)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(100*time.Millisecond))
	return paths, requeues
}

// profileAPIServer saves a CPU profile of kube-apiserver over the next d
// into $LIKEN_BENCH_PROFILES (nothing when it is unset).
func profileAPIServer(t testing.TB, f *fleetsim.Fleet, name string, d time.Duration) {
	dir := os.Getenv("LIKEN_BENCH_PROFILES")
	if dir == "" {
		return
	}
	must(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, fmt.Sprintf("kube-apiserver-%d-%s.pprof", len(f.Names), name))
	go func() {
		secs := int(d.Seconds()) - 1
		rc := f.Kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(secs)).Timeout(d + time.Minute)
		b, err := rc.DoRaw(context.Background())
		if err != nil {
			t.Logf("profiling kube-apiserver: %v", err)
			return
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Logf("saving the profile: %v", err)
			return
		}
		t.Logf("kube-apiserver CPU profile (%s): %s", name, path)
	}()
}

// perfRecord samples a process's stacks with perf into
// $LIKEN_BENCH_PROFILES until the returned function is called (nothing
// when the variable is unset).
func perfRecord(t testing.TB, pid int, name string) func() {
	dir := os.Getenv("LIKEN_BENCH_PROFILES")
	if dir == "" {
		return func() {}
	}
	must(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name+".perf.data")
	cmd := exec.Command("perf", "record", "-F", "497", "-g", "-p", fmt.Sprint(pid), "-o", path)
	if err := cmd.Start(); err != nil {
		t.Logf("perf record: %v", err)
		return func() {}
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // perf writing its file; killed past that
			_ = cmd.Process.Kill()
			<-done
		}
		t.Logf("perf profile of %s: %s (perf report -i %s --no-children)", name, path, path)
	}
}

// pidOf is the PID of a control-plane component.
func pidOf(t testing.TB, cp *controlplane.ControlPlane, kind string) int {
	for _, p := range cp.Processes {
		if p.Kind == kind {
			return p.PID
		}
	}
	t.Fatalf("the control plane has no %s process", kind)
	return 0
}

// window waits d (a measurement window, not a poll) unless ctx ends.
func window(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func stopSampler(t testing.TB, s *Sampler) Usage {
	t.Helper()
	u, err := s.Stop()
	must(t, err)
	return u
}

// runScale runs one operator at scale: an idle window with heartbeats
// only, the fleet staging a release while the budget is 0, then a rollout
// window of o.turns finished turns.
func runScale(t testing.TB, o scaleOptions) scaleResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := scaleResult{o: o}
	o.fleet.KeepDir = os.Getenv("LIKEN_BENCH_LOGS")
	f := fleetsim.NewFleet(t, o.fleet)
	counter, err := StartAPICounter(f.CP.AdminConfig())
	must(t, err)
	t.Cleanup(counter.Close)
	kubeconfig := filepath.Join(f.CP.Dir, "kubeconfigs", "operator-counted.kubeconfig")
	must(t, counter.WriteKubeconfig(kubeconfig, f.CP.Config(controlplane.OperatorUser)))
	// The operator judges a machine Lost after four missed heartbeats, as
	// it does with its defaults (10 s and 40 s).
	opFlags := []string{"--startup-grace", "5s", "--machine-lost-after", (4 * o.fleet.RenewEvery).String()}
	if v := os.Getenv("LIKEN_BENCH_OPERATOR_V"); v != "" {
		opFlags = append(opFlags, "-v", v)
	}
	// At turns.TraceVerbosity each grant logs where its time went.
	op := fleetsim.RunOperator(t, f.CP, fleetsim.OperatorOptions{ID: "bench", Kubeconfig: kubeconfig, Verbosity: turns.TraceVerbosity, Flags: opFlags})
	apiPID, etcdPID := pidOf(t, f.CP, "kube-apiserver"), pidOf(t, f.CP, "etcd")

	n := o.fleet.Machines
	want := fmt.Sprintf("%d/%d", n, n)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := op.ExitError(); err != nil {
			return poll.Error(err)
		}
		c, err := f.Cluster()
		if err != nil {
			return poll.Continue("reading the Cluster: %v", err)
		}
		if c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == want {
			return poll.Success()
		}
		return poll.Continue("Cluster phase %q machines %q, want Ready %s", c.Status.Phase, c.Status.Machines, want)
	}, poll.WithTimeout(2*time.Minute+time.Duration(n)*20*time.Millisecond), poll.WithDelay(500*time.Millisecond))
	window(ctx, o.settle)

	// Idle: heartbeats only.
	f.RenewLag()
	c0, h0 := counter.Snapshot(), f.Heartbeats()
	sOp, sAPI, sEtcd := StartSampler(op.PID, time.Second), StartSampler(apiPID, time.Second), StartSampler(etcdPID, time.Second)
	profileAPIServer(t, f, "idle", o.idle)
	stopPerf := perfRecord(t, op.PID, fmt.Sprintf("cluster-operator-%d-idle", n))
	window(ctx, o.idle)
	stopPerf()
	r.idleOp, r.idleAPI, r.idleEtcd = stopSampler(t, sOp), stopSampler(t, sAPI), stopSampler(t, sEtcd)
	r.idleReqs, r.idleHeartbeats = counter.Snapshot().Sub(c0), f.Heartbeats()-h0
	r.renewLag = f.RenewLag()
	must(t, op.ExitError())
	t.Logf("idle window: operator %.3f cores, RSS %.0f MiB; %d heartbeats (renew lag p99 %s); operator requests: %s",
		r.idleOp.Cores(), MiB(r.idleOp.RSSMax), r.idleHeartbeats, Percentile(r.renewLag, 99), r.idleReqs)

	// Idle again, with settle on: the window starts once the operator
	// recorded the change (its one status write for it).
	must(t, f.SetSettle(o.settleOn))
	observed(t, f, op)
	c0 = counter.Snapshot()
	sOp = StartSampler(op.PID, time.Second)
	window(ctx, o.idle)
	r.settleOp, r.settleReqs = stopSampler(t, sOp), counter.Snapshot().Sub(c0)
	must(t, f.SetSettle(0))
	observed(t, f, op)
	t.Logf("idle window with settle %s: operator RSS %.0f MiB; operator requests: %s", o.settleOn, MiB(r.settleOp.RSSMax), r.settleReqs)

	// Staging, with the budget at 0.
	must(t, f.SetMaxUnavailable("0"))
	c1 := counter.Snapshot()
	sOp = StartSampler(op.PID, time.Second)
	must(t, f.SetVersion(fleetsim.FleetVersion2))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := op.ExitError(); err != nil {
			return poll.Error(err)
		}
		if s := f.Staged(); s < n {
			return poll.Continue("%d of %d machines staged", s, n)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute+time.Duration(float64(n)/o.fleet.StageQPS*float64(time.Second))*2), poll.WithDelay(200*time.Millisecond))
	// Let the operator take in the last staged machines before the window.
	window(ctx, 2*time.Second)
	r.stageOp, r.stageReqs = stopSampler(t, sOp), counter.Snapshot().Sub(c1)
	t.Logf("staging: %d machines in %s; operator %s CPU; requests: %s", n, r.stageOp.Wall.Round(time.Second), r.stageOp.CPU, r.stageReqs)

	// Rollout.
	l := &ledger{total: n}
	f.Observe(l.observe)
	echo, err := StartEcho(ctx, f.CP.AdminConfig())
	must(t, err)
	pingCtx, stopPing := context.WithCancel(ctx)
	go echo.PingEvery(pingCtx, 500*time.Millisecond)
	f.TakeFinishes()
	c2, w2 := counter.Snapshot(), f.MachineWrites()
	sOp, sAPI = StartSampler(op.PID, time.Second), StartSampler(apiPID, time.Second)
	stopPerf = perfRecord(t, op.PID, fmt.Sprintf("cluster-operator-%d-rollout", n))
	start := time.Now()
	must(t, f.SetMaxUnavailable(fmt.Sprint(o.maxUnavailable)))
	finished := 0
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := op.ExitError(); err != nil {
			return poll.Error(err)
		}
		if n, first := f.Failures(); n > 0 {
			return poll.Error(fmt.Errorf("the load generator failed %d times; first: %s", n, first))
		}
		finished += len(f.TakeFinishes())
		if finished < o.turns {
			return poll.Continue("%d of %d turns finished", finished, o.turns)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute+time.Duration(o.turns)*(o.fleet.RebootFor+time.Second)), poll.WithDelay(100*time.Millisecond))
	r.rollWall = time.Since(start)
	stopPerf()
	r.rollOp, r.rollAPI = stopSampler(t, sOp), stopSampler(t, sAPI)
	r.rollReqs, r.machineWrites = counter.Snapshot().Sub(c2), f.MachineWrites()-w2
	stopPing()
	r.finished = finished
	var echoErr error
	r.echoLatency, echoErr = echo.Latencies()
	must(t, echoErr)

	finishedAt := f.FinishedAt()
	pairs := l.pairs(finishedAt)
	for _, p := range pairs {
		r.grantLatency = append(r.grantLatency, p.latency())
	}
	r.paths, r.requeues = tracePaths(t, op.LogPath, pairs)
	if os.Getenv("LIKEN_BENCH_LOGS") != "" {
		// The timeline, to set against the operator's log.
		var tl strings.Builder
		for name, at := range finishedAt {
			fmt.Fprintf(&tl, "%s finished %s\n", at.UTC().Format("15:04:05.000000"), name)
		}
		l.mu.Lock()
		for _, g := range l.grants {
			fmt.Fprintf(&tl, "%s granted-seen %s\n", g.at.UTC().Format("15:04:05.000000"), g.machine)
		}
		l.mu.Unlock()
		must(t, os.WriteFile(filepath.Join(f.CP.Dir, "logs", "timeline.txt"), []byte(tl.String()), 0o644))
	}
	l.mu.Lock()
	r.versions, r.overBudget = l.versions, append([]string(nil), l.problems...)
	l.mu.Unlock()
	if n, first := f.Failures(); n > 0 {
		t.Fatalf("the load generator failed %d times; first: %s", n, first)
	}
	return r
}

// observed waits until the operator recorded the Cluster's last change.
func observed(t testing.TB, f *fleetsim.Fleet, op *fleetsim.Operator) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := op.ExitError(); err != nil {
			return poll.Error(err)
		}
		c, err := f.Cluster()
		if err != nil {
			return poll.Continue("reading the Cluster: %v", err)
		}
		if c.Status.ObservedGeneration != c.Generation {
			return poll.Continue("the operator observed generation %d of the Cluster, not %d", c.Status.ObservedGeneration, c.Generation)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
}

// check asserts what every run must show: no grant over budget, no Lost
// verdict, heartbeats on time, figures that make sense.
// scaleTargets are the figures a scale run must meet.
type scaleTargets struct {
	// grantP99 bounds the release-to-next-grant latency's 99th percentile
	// (0: no bound).
	grantP99 time.Duration
	// rss bounds the operator's resident memory during the rollout.
	rss float64 // MiB
}

// The targets of docs/benchmarks.md (the latency's at 5,000 machines; other
// sizes are bound by memory only), and the smoke's loose form for a busy
// 2-core machine.
var (
	scaleTarget      = scaleTargets{grantP99: 500 * time.Millisecond, rss: 200}
	scaleOtherTarget = scaleTargets{rss: 200}
	scaleSmokeTarget = scaleTargets{grantP99: 2 * time.Second, rss: 200}
)

func (r scaleResult) check(t testing.TB, target scaleTargets) {
	t.Helper()
	assert.Assert(t, len(r.overBudget) == 0, "grants over budget:\n%s", strings.Join(r.overBudget, "\n"))
	lost := r.idleReqs[Request{"update", "machines/status"}] + r.stageReqs[Request{"update", "machines/status"}] + r.rollReqs[Request{"update", "machines/status"}]
	assert.Equal(t, lost, 0, "the operator wrote Machine statuses (Lost verdicts): the load generator's heartbeats were late? renew lag p99 %s", Percentile(r.renewLag, 99))
	assert.Assert(t, r.idleHeartbeats > 0, "no heartbeat in the idle window")
	assert.Assert(t, r.idleOp.Samples >= 2 && r.idleOp.RSSMedian > 0, "no sample of the operator: %+v", r.idleOp)
	// Settling adds no request at rest: the same window with settle on
	// sees the leader election's renewals (one more or less, by where the
	// window falls) and nothing else.
	off, on := r.idleReqs.Total(nil), r.settleReqs.Total(nil)
	assert.Assert(t, on <= off+1, "with settle %s the operator made %d requests at rest (%s), against %d with settle 0s (%s) in a window as long",
		r.o.settleOn, on, r.settleReqs, off, r.idleReqs)
	assert.Assert(t, r.finished >= r.o.turns, "%d turns finished, want %d", r.finished, r.o.turns)
	assert.Assert(t, len(r.grantLatency) > 0, "no grant followed a finished turn")
	assert.Assert(t, len(r.echoLatency) > 0, "the echo baseline measured nothing")
	writes := r.rollReqs.Writes()
	assert.Assert(t, writes > 0, "the operator made no write during the rollout: %s", r.rollReqs)
	p99 := Percentile(r.grantLatency, 99)
	assert.Assert(t, target.grantP99 == 0 || p99 < target.grantP99, "release to next grant p99 is %s (echo controller p99 %s in the same run): the target is under %s (docs/benchmarks.md)",
		p99.Round(time.Millisecond), Percentile(r.echoLatency, 99).Round(time.Millisecond), target.grantP99)
	assert.Assert(t, MiB(r.rollOp.RSSMax) < target.rss, "the operator's RSS reached %.0f MiB during the rollout: the target is under %.0f MiB", MiB(r.rollOp.RSSMax), target.rss)
}

func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// report logs the run as docs/benchmarks.md tables and adds the key
// figures to the benchmark's output.
func (r scaleResult) report(t testing.TB) {
	n := r.o.fleet.Machines
	idleReqRate := perSecond(r.idleReqs.Total(nil), r.idleOp.Wall)
	hbRate := perSecond(int(r.idleHeartbeats), r.idleOp.Wall)
	p50, p99, pmax := Percentile(r.grantLatency, 50), Percentile(r.grantLatency, 99), Percentile(r.grantLatency, 100)
	e50, e99 := Percentile(r.echoLatency, 50), Percentile(r.echoLatency, 99)
	opWrites := float64(r.rollReqs.Writes()) / float64(r.finished)
	mWrites := float64(r.machineWrites) / float64(r.finished)
	var b strings.Builder
	fmt.Fprintf(&b, "\n#### %d machines (heartbeat every %s, nodes: %v, maxUnavailable %d during the rollout, reboot %s)\n\n", n, r.o.fleet.RenewEvery, r.o.fleet.Nodes, r.o.maxUnavailable, r.o.fleet.RebootFor)
	fmt.Fprintf(&b, "| figure | liken | baseline in the same run | ratio |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| release to next grant, p50 (%d grants) | %.0f ms | echo controller round trip p50 (%d): %.0f ms | %.1f x |\n", len(r.grantLatency), ms(p50), len(r.echoLatency), ms(e50), ms(p50)/ms(e50))
	fmt.Fprintf(&b, "| release to next grant, p99 / max | %.0f / %.0f ms | echo p99: %.0f ms | %.1f x |\n", ms(p99), ms(pmax), ms(e99), ms(p99)/ms(e99))
	fmt.Fprintf(&b, "| where a grant's time goes, median of each part (%d grants traced from an event, %d from a requeue) | %s | - | - |\n", len(r.paths), r.requeues, MedianPath(r.paths))
	fmt.Fprintf(&b, "| operator RSS at rest, median / max (%d samples) | %.0f / %.0f MiB | - | - |\n", r.idleOp.Samples, MiB(r.idleOp.RSSMedian), MiB(r.idleOp.RSSMax))
	fmt.Fprintf(&b, "| operator RSS during the rollout, max | %.0f MiB | - | - |\n", MiB(r.rollOp.RSSMax))
	fmt.Fprintf(&b, "| operator CPU at rest (%.0f heartbeats/s) | %.3f cores, %.0f µs per heartbeat | kube-apiserver %.3f cores + etcd %.3f cores | %.2f x of the API server + etcd |\n",
		hbRate, r.idleOp.Cores(), r.idleOp.CPU.Seconds()*1e6/float64(max(r.idleHeartbeats, 1)), r.idleAPI.Cores(), r.idleEtcd.Cores(), r.idleOp.Cores()/(r.idleAPI.Cores()+r.idleEtcd.Cores()))
	fmt.Fprintf(&b, "| operator API requests at rest | %.2f /s (%s) | machines' heartbeats: %.0f writes/s | %.4f x |\n", idleReqRate, r.idleReqs, hbRate, idleReqRate/hbRate)
	settleReqRate := perSecond(r.settleReqs.Total(nil), r.settleOp.Wall)
	fmt.Fprintf(&b, "| at rest with settle %s: operator API requests; RSS median / max | %.2f /s (%s); %.0f / %.0f MiB | settle 0s: %.2f /s; %.0f / %.0f MiB | %.2f x; %.2f x |\n",
		r.o.settleOn, settleReqRate, r.settleReqs, MiB(r.settleOp.RSSMedian), MiB(r.settleOp.RSSMax), idleReqRate, MiB(r.idleOp.RSSMedian), MiB(r.idleOp.RSSMax),
		settleReqRate/idleReqRate, float64(r.settleOp.RSSMedian)/float64(r.idleOp.RSSMedian))
	fmt.Fprintf(&b, "| operator CPU per finished turn (rollout) | %.1f ms (%.3f cores) | kube-apiserver %.1f ms per turn | %.2f x |\n",
		ms(r.rollOp.CPU)/float64(r.finished), r.rollOp.Cores(), ms(r.rollAPI.CPU)/float64(r.finished), r.rollOp.CPU.Seconds()/r.rollAPI.CPU.Seconds())
	fmt.Fprintf(&b, "| API writes per machine upgrade | operator %.1f + machine %.1f = %.1f | - | - |\n", opWrites, mWrites, opWrites+mWrites)
	conflicts := r.rollReqs.Total(func(q Request) bool { return strings.HasSuffix(q.Verb, "(conflict)") })
	fmt.Fprintf(&b, "| operator writes refused with a conflict (rollout) | %d of %d | - | - |\n", conflicts, r.rollReqs.Writes())
	fmt.Fprintf(&b, "| operator requests in the rollout window (%d turns, %s) | %s | - | - |\n", r.finished, r.rollWall.Round(time.Second), r.rollReqs)
	fmt.Fprintf(&b, "| operator while %d machines staged (budget 0) | %.0f ms CPU, %s | - | - |\n", n, ms(r.stageOp.CPU), r.stageReqs)
	fmt.Fprintf(&b, "| grants over budget (%d Cluster versions checked) | %d | - | - |\n", r.versions, len(r.overBudget))
	fmt.Fprintf(&b, "| heartbeat renewal lag of the load generator, p99 | %.0f ms | - | - |\n", ms(Percentile(r.renewLag, 99)))
	t.Log(b.String())
	if bb, ok := t.(*testing.B); ok {
		bb.ReportMetric(ms(p50), "grant-p50-ms")
		bb.ReportMetric(ms(p99), "grant-p99-ms")
		bb.ReportMetric(ms(e99), "echo-p99-ms")
		bb.ReportMetric(MiB(r.idleOp.RSSMax), "rss-idle-MiB")
		bb.ReportMetric(MiB(r.rollOp.RSSMax), "rss-rollout-MiB")
		bb.ReportMetric(r.idleOp.Cores(), "cpu-idle-cores")
		bb.ReportMetric(idleReqRate, "req-idle/s")
		bb.ReportMetric(opWrites+mWrites, "writes/upgrade")
		bb.ReportMetric(float64(len(r.overBudget)), "over-budget")
	}
}

// scaleFor is the run of docs/benchmarks.md for a fleet of the given size.
//
// Heartbeats: every machine renews its Lease every 10 s, except at 5,000
// machines, where the period is 30 s (and the operator's lost-after 120 s,
// the same ratio as 10 s and 40 s): this machine's control plane spends
// about 5 ms of CPU per Lease write, so 500 writes a second would need more
// than its two cores; the operator's CPU per heartbeat is reported, to
// scale. LIKEN_BENCH_RENEW sets the period for every size.
//
// Nodes: at 1,000 machines every machine has a Node simulated by kwok
// (whose node Leases cost the control plane as much again); at 5,000 there
// are none (LIKEN_BENCH_NODES=1 or 0 forces either).
func scaleFor(t testing.TB, machines int) scaleOptions {
	o := scaleOptions{
		fleet: fleetsim.FleetOptions{
			Machines: machines, Leaders: 3, MaxUnavailable: "5",
			RenewEvery: 10 * time.Second, RebootFor: time.Second, Nodes: machines <= 1000, StageQPS: 200,
		},
		settle: 15 * time.Second, idle: time.Minute, settleOn: 30 * time.Second, turns: 300, maxUnavailable: 5,
	}
	if machines > 1000 {
		o.fleet.RenewEvery = 30 * time.Second
	}
	if v := os.Getenv("LIKEN_BENCH_RENEW"); v != "" {
		d, err := time.ParseDuration(v)
		must(t, err)
		o.fleet.RenewEvery = d
	}
	switch os.Getenv("LIKEN_BENCH_NODES") {
	case "1":
		o.fleet.Nodes = true
	case "0":
		o.fleet.Nodes = false
	}
	if !full() {
		o.idle, o.turns = 20*time.Second, 60
	}
	return o
}

// BenchmarkOperatorScale runs one real cluster-operator against a real
// control plane with 1,000 and 5,000 simulated machines (1,000 only
// without LIKEN_BENCH=full). Targets at 5,000: p99 grant latency under
// 500 ms, RSS under 200 MiB, no grant over budget. Under LIKEN_BENCH=full
// each size runs three times, and the median of the runs' ratios to the
// echo controller must be within the grant targets: 2 x at p50, 1.2 x at
// p99 (docs/benchmarks.md).
func BenchmarkOperatorScale(b *testing.B) {
	sizes, runs := []int{1000}, 1
	if full() {
		sizes, runs = append(sizes, 5000), 3
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			target := scaleOtherTarget
			if n == 5000 {
				target = scaleTarget
			}
			// Each run in its own sub-benchmark: its control plane and
			// fleet stop before the next starts.
			var results []scaleResult
			for i := range runs {
				b.Run(fmt.Sprintf("run=%d", i+1), func(b *testing.B) {
					for b.Loop() {
						r := runScale(b, scaleFor(b, n))
						r.report(b)
						r.check(b, target)
						results = append(results, r)
					}
				})
			}
			if len(results) == 0 {
				return
			}
			p50, p99 := medianRatios(results)
			b.Logf("%d machines, %d runs: median ratio of the grant to the echo controller %.1f x at p50, %.1f x at p99 (targets %.1f x and %.1f x)",
				n, len(results), p50, p99, grantRatioTarget.p50, grantRatioTarget.p99)
			if full() && (p50 > grantRatioTarget.p50 || p99 > grantRatioTarget.p99) {
				b.Errorf("%d machines: the grant takes %.1f x the echo controller's round trip at p50 and %.1f x at p99 (median of %d runs): the targets are %.1f x and %.1f x (docs/benchmarks.md)",
					n, p50, p99, len(results), grantRatioTarget.p50, grantRatioTarget.p99)
			}
		})
	}
}

// grantRatioTarget bounds the grant's latency against the echo
// controller's round trip in the same run (issue: a grant as fast as the
// API allows).
var grantRatioTarget = struct{ p50, p99 float64 }{2, 1.2}

// medianRatios is the median, over runs, of each run's ratio of the grant
// latency to the echo controller's, at p50 and at p99.
func medianRatios(results []scaleResult) (p50, p99 float64) {
	var r50, r99 []float64
	for _, r := range results {
		r50 = append(r50, ms(Percentile(r.grantLatency, 50))/ms(Percentile(r.echoLatency, 50)))
		r99 = append(r99, ms(Percentile(r.grantLatency, 99))/ms(Percentile(r.echoLatency, 99)))
	}
	return MedianFloat(r50), MedianFloat(r99)
}

// TestOperatorScaleSmoke runs the scale benchmark at 20 machines so that
// it keeps working.
func TestOperatorScaleSmoke(t *testing.T) {
	r := runScale(t, scaleOptions{
		fleet: fleetsim.FleetOptions{
			Machines: 20, Leaders: 3, MaxUnavailable: "5",
			RenewEvery: 10 * time.Second, RebootFor: 300 * time.Millisecond, Nodes: true, StageQPS: 100,
		},
		settle: time.Second, idle: 5 * time.Second, settleOn: 30 * time.Second, turns: 12, maxUnavailable: 5,
	})
	r.report(t)
	r.check(t, scaleSmokeTarget)
}

// TestMedianRatios: make bench judges a size by the middle run's ratios,
// so that one run disturbed by the host neither fails nor passes it.
func TestMedianRatios(t *testing.T) {
	run := func(grant50, grant99, echo50, echo99 time.Duration) scaleResult {
		return scaleResult{grantLatency: []time.Duration{grant50, grant99}, echoLatency: []time.Duration{echo50, echo99}}
	}
	p50, p99 := medianRatios([]scaleResult{
		run(40*time.Millisecond, 400*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond), // 4 x, 4 x
		run(15*time.Millisecond, 110*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond), // 1.5 x, 1.1 x
		run(18*time.Millisecond, 115*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond), // 1.8 x, 1.15 x
	})
	assert.Check(t, p50 > 1.79 && p50 < 1.81, "p50 ratio %.2f", p50)
	assert.Check(t, p99 > 1.14 && p99 < 1.16, "p99 ratio %.2f", p99)
}
