package controlplane

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/internal/srctree"
)

// etcdLeader is one leader of TestDatastoreWithRealEtcd: its config.yaml,
// its setup folder (certificates, etcd.env), its etcd data folder and the
// etcd process of its current boot.
type etcdLeader struct {
	name      string
	cfg       Config
	setupDir  string
	dataDir   string
	logFile   string
	clientURL string
	peerURL   string
	boots     int
	added     time.Time // when a member was last added for peerURL, at the latest
	kill      func()    // SIGKILLs the running etcd and waits for it; nil when none runs
	exited    chan struct{}
	exitErr   error
	others    []string // the other leaders' client URLs
}

// etcdFleet is three leaders on 127.0.0.1, l1 the first, made from one
// cluster identity, and liken-node's etcd client.
type etcdFleet struct {
	bin     string
	leaders []*etcdLeader
	etcd    *EtcdClient
	token   string
}

// freePorts returns n distinct free ports of 127.0.0.1.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		if p := freePort(t); !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	return ports
}

func newEtcdFleet(t *testing.T) *etcdFleet {
	t.Helper()
	bin, err := srctree.Binary("kube")
	assert.NilError(t, err)
	identity, _ := testIdentity(t)
	ports := freePorts(t, 3*3+1)
	url := func(i int) string { return fmt.Sprintf("https://127.0.0.1:%d", ports[i]) }
	base := Config{Endpoint: url(9), ServiceCIDR: "10.96.0.0/16", FirstLeader: "l1"}
	for i := range 3 {
		base.Leaders = append(base.Leaders, Leader{
			Name: fmt.Sprintf("l%d", i+1), APIServer: url(3 * i), EtcdClient: url(3*i + 1), EtcdPeer: url(3*i + 2),
		})
	}
	f := &etcdFleet{bin: bin, token: writeToken(t)}
	for _, l := range base.Leaders {
		cfg := base
		cfg.Machine = l.Name
		dir := t.TempDir()
		el := &etcdLeader{
			name: l.Name, cfg: cfg, clientURL: l.EtcdClient, peerURL: l.EtcdPeer,
			setupDir: filepath.Join(dir, "run"), dataDir: filepath.Join(dir, "etcd"), logFile: filepath.Join(dir, "etcd.log"),
		}
		assert.NilError(t, Setup(cfg, identity, el.setupDir, time.Now()))
		f.leaders = append(f.leaders, el)
	}
	for _, l := range f.leaders {
		for _, o := range f.leaders {
			if o != l {
				l.others = append(l.others, o.clientURL)
			}
		}
	}
	l1 := f.leaders[0].setupDir
	f.etcd, err = NewEtcdClientFromFiles(filepath.Join(l1, NodeEtcdClient.Cert()), filepath.Join(l1, NodeEtcdClient.Key()), filepath.Join(l1, EtcdServerCA.Cert()))
	assert.NilError(t, err)
	f.etcd.Timeout = 2 * time.Second
	t.Cleanup(func() {
		for _, l := range f.leaders {
			if l.kill != nil {
				l.kill()
			}
			if t.Failed() {
				t.Logf("%s's etcd log (end):\n%s", l.name, tail(l.logFile, 6000))
			}
		}
	})
	return f
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// clientURLs are every leader's etcd client URL, as etcd-start asks them.
func (f *etcdFleet) clientURLs() []string {
	var urls []string
	for _, l := range f.leaders {
		urls = append(urls, l.clientURL)
	}
	return urls
}

// awaitNewSecond waits until the second in which a member was last added
// for l's peer URL has passed, before another is added for it. etcd
// derives a new member's ID from its peer URLs and the second of the
// addition, so a second addition in the same second asks for the ID of
// the first; once that member is removed, etcd refuses it ("membership:
// ID removed") but keeps it in its log, and every member that restarts
// replays the refused addition into its transport, where it stays as a
// peer of the old ID at l's peer URL: the member there then drops its
// stream requests, "ignored streaming request; ID mismatch", for as long
// as it runs. On a fleet a machine's re-install takes minutes, not the
// test's fraction of a second.
func (l *etcdLeader) awaitNewSecond(t *testing.T) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if time.Now().Unix() > l.added.Unix() {
			return poll.Success()
		}
		return poll.Continue("%s's member was added in this second", l.name)
	}, poll.WithDelay(10*time.Millisecond), poll.WithTimeout(5*time.Second))
}

// startOptions are what liken-node control-plane etcd-start passes Start
// on leader l.
func (f *etcdFleet) startOptions(l *etcdLeader, restart bool) StartOptions {
	serverTLS, err := MemberDataTLS(l.setupDir)
	if err != nil {
		panic(err) // Setup wrote the certificates in newEtcdFleet
	}
	return StartOptions{
		Name: l.name, PeerURL: l.peerURL, FirstLeader: l.cfg.FirstLeader == l.name,
		ClientURL: l.clientURL, Listen: strings.TrimPrefix(l.clientURL, "https://"), ServerTLS: serverTLS,
		ClientURLs: f.clientURLs(), Etcd: f.etcd,
		Endpoint: probeFunc(func() bool { return false }),
		Data:     DiskData{Dir: l.dataDir}, Restart: restart,
		EnvFile: filepath.Join(l.setupDir, EtcdEnvFile),
	}
}

// startPaced runs Start on a fake clock, stepped by RetryInterval whenever
// Start waits, at most every 50 ms of real time so that a real etcd that
// refuses a change for a moment is asked again soon. Once Start has waited
// cancelAfter on the clock and waits again, its context ends. It returns
// Start's answer and how long it waited on the clock.
func startPaced(ctx context.Context, t *testing.T, o StartOptions, cancelAfter time.Duration) (StartDecision, time.Duration, error) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	o.Clock = clk
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		d   StartDecision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := Start(ctx, o)
		done <- result{d, err}
	}()
	var waited time.Duration
	var r result
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case r = <-done:
			return poll.Success()
		default:
		}
		switch {
		case !clk.HasWaiters():
			return poll.Continue("Start is deciding")
		case waited >= cancelAfter:
			cancel()
			return poll.Continue("Start's context ended after %s", waited)
		}
		clk.Step(RetryInterval)
		waited += RetryInterval
		return poll.Continue("Start waited %s", waited)
	}, poll.WithDelay(50*time.Millisecond), poll.WithTimeout(30*time.Second))
	return r.d, waited, r.err
}

// readEtcdEnv reads etcd.env as systemd's EnvironmentFile does for these
// lines: KEY=value, comments and blank lines skipped.
func readEtcdEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	file, err := os.Open(path)
	assert.NilError(t, err)
	defer file.Close()
	env := map[string]string{}
	s := bufio.NewScanner(file)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		assert.Assert(t, ok, "%s: a line without =: %q", path, line)
		env[k] = v
	}
	assert.NilError(t, s.Err())
	return env
}

// boot is one boot of leader l's etcd as its units run it: etcd-start's
// Start, then etcd with EtcdArgs and etcd.env in its environment (init's
// promotion is promote). It returns Start's decision and how long Start
// waited on its clock.
func (f *etcdFleet) boot(ctx context.Context, t *testing.T, l *etcdLeader, restart bool) (StartDecision, time.Duration) {
	t.Helper()
	l.awaitNewSecond(t) // Start may add a member
	d, waited, err := startPaced(ctx, t, f.startOptions(l, restart), time.Hour)
	assert.NilError(t, err)
	if d.Action == JoinAsLearner {
		l.added = time.Now()
	}
	f.runEtcd(t, l, d)
	return d, waited
}

// runEtcd starts etcd on leader l as etcd.service does: `kube etcd` with
// EtcdArgs, etcd.env in the environment. The data folder and the listen
// URLs are the test's: EtcdArgs listens on every address at the fixed
// ports 2379 and 2380, which three leaders on one host cannot share.
func (f *etcdFleet) runEtcd(t *testing.T, l *etcdLeader, d StartDecision) {
	t.Helper()
	assert.Assert(t, l.kill == nil, "%s's etcd still runs", l.name)
	env := readEtcdEnv(t, filepath.Join(l.setupDir, EtcdEnvFile))
	want := map[string]string{"ETCD_INITIAL_CLUSTER_STATE": d.InitialClusterState, "ETCD_INITIAL_CLUSTER": d.InitialCluster}
	if d.InitialClusterToken != "" {
		want["ETCD_INITIAL_CLUSTER_TOKEN"] = d.InitialClusterToken
	}
	assert.DeepEqual(t, env, want)

	args, err := EtcdArgs(l.cfg, l.setupDir)
	assert.NilError(t, err)
	replace := map[string]string{"--data-dir": l.dataDir, "--listen-client-urls": l.clientURL, "--listen-peer-urls": l.peerURL}
	for i, a := range args {
		k, _, _ := strings.Cut(a, "=")
		if v, ok := replace[k]; ok {
			args[i] = k + "=" + v
			delete(replace, k)
		}
	}
	assert.Check(t, is.Len(replace, 0), "EtcdArgs no longer sets these flags")

	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			environ = append(environ, kv)
		}
	}
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	l.boots++
	logFile, err := os.OpenFile(l.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	assert.NilError(t, err)
	defer logFile.Close()
	_, _ = fmt.Fprintf(logFile, "=== boot %d: %s\n", l.boots, d.Action)
	cmd := exec.Command(f.bin, append([]string{"etcd"}, args...)...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = logFile, logFile
	assert.NilError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		l.exitErr = cmd.Wait()
		close(exited)
	}()
	l.exited = exited
	l.kill = func() {
		_ = cmd.Process.Kill() // SIGKILL: a power cut
		<-exited
		l.kill = nil
	}
}

// running fails the poll when l's etcd exited.
func (l *etcdLeader) running() error {
	select {
	case <-l.exited:
		return fmt.Errorf("%s's etcd exited: %v", l.name, l.exitErr)
	default:
		return nil
	}
}

// promote runs init's promotion on leader l: its own member first, then
// the others, as liken-node control-plane init orders them.
func (f *etcdFleet) promote(ctx context.Context, t *testing.T, l *etcdLeader) {
	t.Helper()
	err := Init(ctx, InitOptions{Kube: fake.NewClientset(leaderNode(l.name)), SharedTokenFile: f.token, Name: l.name,
		ClientURLs: append([]string{l.clientURL}, l.others...), Etcd: f.etcd, Data: DiskData{Dir: l.dataDir},
		Interval: 200 * time.Millisecond, Timeout: 30 * time.Second})
	assert.NilError(t, err)
}

// waitVoters waits until the member list is exactly the named leaders,
// each a voter that started, and each of them answers /health true. It
// returns their member IDs by name.
func (f *etcdFleet) waitVoters(ctx context.Context, t *testing.T, want ...*etcdLeader) map[string]uint64 {
	t.Helper()
	ids := map[string]uint64{}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, l := range want {
			if err := l.running(); err != nil {
				return poll.Error(err)
			}
		}
		members, err := f.etcd.MemberList(ctx, want[0].clientURL)
		if err != nil {
			return poll.Continue("%v", err)
		}
		got := map[string]Member{}
		for _, m := range members {
			got[m.Name] = m
		}
		if len(members) != len(want) || len(got) != len(want) {
			return poll.Continue("members: %+v", members)
		}
		for _, l := range want {
			m, ok := got[l.name]
			switch {
			case !ok:
				return poll.Continue("%s is no member: %+v", l.name, members)
			case m.IsLearner:
				return poll.Continue("%s is a learner", l.name)
			case !slices.Equal(m.PeerURLs, []string{l.peerURL}) || !slices.Equal(m.ClientURLs, []string{l.clientURL}):
				return poll.Error(fmt.Errorf("%s's member has URLs %v and %v, not %s and %s", l.name, m.PeerURLs, m.ClientURLs, l.peerURL, l.clientURL))
			}
			if ok, err := f.etcd.Health(ctx, l.clientURL); !ok {
				return poll.Continue("%s: %v", l.name, err)
			}
			ids[l.name] = m.ID
		}
		return poll.Success()
	}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
	return ids
}

// settle writes a key through the first of leaders and waits until each
// of them has applied it, as soon happens on a fleet, whose API servers
// write all the time. Until an entry follows a change of membership, a
// member may hold the change with no durable record that it was
// committed: etcd syncs its log when entries arrive, not when only the
// commit index moves, and writes what it applied to its database in
// batches. Members killed then restart with the change uncommitted, under
// the configuration before it: a promoted member is a learner again until
// a leader of that configuration commits the promotion anew.
func (f *etcdFleet) settle(ctx context.Context, t *testing.T, leaders ...*etcdLeader) {
	t.Helper()
	type header struct {
		Header struct {
			Revision jsonUint64 `json:"revision"`
		} `json:"header"`
	}
	key := base64.StdEncoding.EncodeToString([]byte("liken-test/settled"))
	var put header
	assert.NilError(t, f.etcd.post(ctx, leaders[0].clientURL, "/v3/kv/put", map[string]string{"key": key, "value": key}, &put))
	assert.Assert(t, put.Header.Revision > 0, "etcd answered the write without its revision")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, l := range leaders {
			var got header
			if err := f.etcd.post(ctx, l.clientURL, "/v3/kv/range", map[string]any{"key": key, "serializable": true}, &got); err != nil {
				return poll.Continue("%s: %v", l.name, err)
			}
			if got.Header.Revision < put.Header.Revision {
				return poll.Continue("%s has applied revision %d, not yet %d", l.name, got.Header.Revision, put.Header.Revision)
			}
		}
		return poll.Success()
	}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
}

// list is the member list as l1 answers it.
func (f *etcdFleet) list(ctx context.Context, t *testing.T) []Member {
	t.Helper()
	members, err := f.etcd.MemberList(ctx, f.leaders[0].clientURL)
	assert.NilError(t, err)
	return members
}

// listAt is the member list as l answers it.
func (f *etcdFleet) listAt(ctx context.Context, t *testing.T, l *etcdLeader) []Member {
	t.Helper()
	members, err := f.etcd.MemberList(ctx, l.clientURL)
	assert.NilError(t, err)
	return members
}

// members splits an initial cluster into its name=peerURL entries, sorted:
// etcd lists members in the order of their IDs.
func members(initialCluster string) []string {
	return slices.Sorted(slices.Values(strings.Split(initialCluster, ",")))
}

// TestDatastoreWithRealEtcd runs the datastore's start and init's
// promotion (docs/design/controlplane.md, "The datastore") on three
// leaders with real etcd members, started as etcd.service starts them:
// EtcdArgs, and etcd.env from Start in the environment.
func TestDatastoreWithRealEtcd(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newEtcdFleet(t)
	l1, l2, l3 := f.leaders[0], f.leaders[1], f.leaders[2]
	ids := map[string]uint64{}
	// Each scenario runs on the cluster the ones before it left.
	step := func(name string, fn func(t *testing.T)) {
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}

	step("the first leader bootstraps once the others say they hold no member data", func(t *testing.T) {
		// Alone, it waits: a leader that does not answer may hold the
		// fleet's datastore.
		_, _, err := startPaced(ctx, t, f.startOptions(l1, false), 2*DefaultBootstrapWait)
		assert.ErrorContains(t, err, "etcd did not start: no leader's etcd answers, and the leader at "+l2.clientURL+" (")
		assert.ErrorContains(t, err, "did not say it holds no member data: it may hold the fleet's datastore")

		// l2 and l3 boot with no data: their etcd-start waits for a
		// member list, answering meanwhile that they hold none.
		others, stopOthers := context.WithCancel(ctx)
		defer stopOthers()
		var waiting sync.WaitGroup
		for _, l := range []*etcdLeader{l2, l3} {
			o := f.startOptions(l, false)
			o.Clock = clocktesting.NewFakeClock(time.Now()) // one look, then it waits until stopped
			waiting.Go(func() {
				_, err := Start(others, o)
				assert.Check(t, errors.Is(err, context.Canceled), "%s: %v", l.name, err)
			})
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				holds, err := f.etcd.HoldsMemberData(ctx, l.clientURL)
				switch {
				case err != nil:
					return poll.Continue("%v", err)
				case holds:
					return poll.Error(fmt.Errorf("%s says it holds member data", l.name))
				}
				return poll.Success()
			}, poll.WithDelay(50*time.Millisecond), poll.WithTimeout(10*time.Second))
		}
		d, waited, err := startPaced(ctx, t, f.startOptions(l1, false), time.Hour)
		assert.NilError(t, err)
		// They stop before l1's etcd runs, or they would join it now.
		stopOthers()
		waiting.Wait()
		assert.Equal(t, d.Action, Bootstrap, d.Reason)
		assert.Equal(t, waited, DefaultBootstrapWait)
		f.runEtcd(t, l1, d)
		assert.Equal(t, d.InitialCluster, "l1="+l1.peerURL)
		f.promote(ctx, t, l1)
		ids = f.waitVoters(ctx, t, l1)
		// A leader whose etcd runs holds member data.
		holds, err := f.etcd.HoldsMemberData(ctx, l1.clientURL)
		assert.NilError(t, err)
		assert.Check(t, holds, "l1's running etcd reads as holding no member data")
	})

	// join boots l as a new leader: it joins as a learner and init
	// promotes it.
	join := func(t *testing.T, l *etcdLeader, before ...*etcdLeader) {
		began := time.Now()
		d, waited := f.boot(ctx, t, l, false)
		assert.Equal(t, d.Action, JoinAsLearner, d.Reason)
		// etcd refuses an addition for a few seconds after a promotion
		// ("unhealthy cluster"); Start tries again.
		t.Logf("Start took %s to add %s (%d tries)", time.Since(began).Round(time.Millisecond), l.name, waited/RetryInterval+1)
		var want []string
		for _, b := range before {
			want = append(want, b.name+"="+b.peerURL)
		}
		assert.DeepEqual(t, members(d.InitialCluster), members(strings.Join(append(want, l.name+"="+l.peerURL), ",")))
		// A learner's control plane is not healthy, whatever its API
		// server says: it does not count for quorum.
		api, apiReady := apiStub(t, l.setupDir)
		apiReady.Store(true)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			err := l.health(api).Check(ctx)
			if err == nil {
				return poll.Error(fmt.Errorf("%s is healthy as a learner", l.name))
			}
			if !strings.Contains(err.Error(), "this leader's etcd member is a learner: liken-control-plane-init promotes it") {
				return poll.Continue("%v", err) // not started yet
			}
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
		// The API server of a learner starts: it joined through the
		// fleet's member list, so it is no split.
		assert.NilError(t, l.health(api).SplitCheck(ctx))
		f.promote(ctx, t, l)
		ids = f.waitVoters(ctx, t, append(before, l)...)
		assert.NilError(t, l.health(api).Check(ctx))
		// A voter whose API server is not ready is not healthy either.
		apiReady.Store(false)
		assert.ErrorContains(t, l.health(api).Check(ctx), "this leader's API server is not ready: "+api+"/readyz answered 500 Internal Server Error: etcd failed: reason withheld")
	}
	step("the second leader joins as a learner and is promoted", func(t *testing.T) {
		join(t, l2, l1)
	})
	step("the third leader joins as a learner and is promoted", func(t *testing.T) {
		join(t, l3, l1, l2)
	})

	step("a leader loses power and boots with its data, changing no member", func(t *testing.T) {
		before := byID(f.list(ctx, t))
		l2.kill()
		api, apiReady := apiStub(t, l2.setupDir)
		apiReady.Store(true)
		assert.ErrorContains(t, l2.health(api).Check(ctx), "this leader's etcd member does not answer")
		d, waited := f.boot(ctx, t, l2, false)
		assert.Equal(t, d.Action, StartWithData, d.Reason)
		assert.Equal(t, waited, time.Duration(0))
		assert.DeepEqual(t, f.waitVoters(ctx, t, l1, l2, l3), ids)

		// etcd crashes and systemd starts it again in the same boot: Start
		// asks whether the member was removed; it was not.
		l2.kill()
		d, _ = f.boot(ctx, t, l2, true)
		assert.Equal(t, d.Action, StartWithData, d.Reason)
		assert.DeepEqual(t, f.waitVoters(ctx, t, l1, l2, l3), ids)
		members, err := f.etcd.MemberList(ctx, l2.clientURL)
		assert.NilError(t, err, "l2 votes again and answers at its own URL")
		assert.DeepEqual(t, byID(members), before)
		assert.NilError(t, l2.health(api).Check(ctx))
	})

	step("a leader goes down only while every other member votes and is healthy", func(t *testing.T) {
		h1 := l1.health("")
		assert.NilError(t, h1.SafeToStop(ctx))
		l3.kill()
		assert.ErrorContains(t, h1.SafeToStop(ctx), "the leader at "+l3.clientURL+" does not answer (")
		assert.ErrorContains(t, h1.SafeToStop(ctx), "with this leader down too, the datastore could lose its majority; it goes down once every other leader is back")
		// l3 itself may go down: its own member is down already.
		assert.NilError(t, l3.health("").SafeToStop(ctx))
		d, _ := f.boot(ctx, t, l3, false)
		assert.Equal(t, d.Action, StartWithData, d.Reason)
		assert.DeepEqual(t, f.waitVoters(ctx, t, l1, l2, l3), ids)
		assert.NilError(t, h1.SafeToStop(ctx))
	})

	step("a re-installed leader replaces its member", func(t *testing.T) {
		old := ids["l3"]
		l3.kill()
		assert.NilError(t, os.RemoveAll(l3.dataDir))
		began := time.Now()
		d, waited := f.boot(ctx, t, l3, false)
		assert.Equal(t, d.Action, JoinAsLearner, d.Reason)
		t.Logf("Start took %s to replace l3's member (%d tries)", time.Since(began).Round(time.Millisecond), waited/RetryInterval+1)
		assert.DeepEqual(t, members(d.InitialCluster), members("l1="+l1.peerURL+",l2="+l2.peerURL+",l3="+l3.peerURL))
		_, listed := byID(f.list(ctx, t))[old]
		assert.Check(t, !listed, "l3's old member %x is still listed", old)
		f.promote(ctx, t, l3)
		ids = f.waitVoters(ctx, t, l1, l2, l3)
		assert.Check(t, ids["l3"] != old, "l3 kept its member ID %x", old)
		assert.Check(t, ids["l1"] != 0 && ids["l2"] != 0)
	})

	step("while a learner is pending, another machine waits; the learner's machine starts as it", func(t *testing.T) {
		// l3 is re-installed again and loses power right after its
		// etcd-start added it as a learner, before etcd started.
		l3.kill()
		assert.NilError(t, os.RemoveAll(l3.dataDir))
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if _, err := f.etcd.MemberRemove(ctx, l1.clientURL, ids["l3"]); err != nil {
				return poll.Continue("%v", err)
			}
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
		// etcd refuses a change of membership for a moment after the one
		// before ("member not found", "unhealthy cluster"), as Start finds.
		var pending Member
		l3.awaitNewSecond(t)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			m, _, err := f.etcd.MemberAdd(ctx, l1.clientURL, l3.peerURL, true)
			if err != nil {
				return poll.Continue("%v", err)
			}
			pending = m
			l3.added = time.Now()
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
		before := byID(f.list(ctx, t))

		// A fourth leader, new to the fleet, with no data.
		dir := t.TempDir()
		l4 := StartOptions{
			Name: "l4", PeerURL: fmt.Sprintf("https://127.0.0.1:%d", freePort(t)), ClientURLs: f.clientURLs(), Etcd: f.etcd,
			Data: DiskData{Dir: filepath.Join(dir, "etcd")}, EnvFile: filepath.Join(dir, EtcdEnvFile),
		}
		assert.ErrorContains(t, l1.health("").SafeToStop(ctx), fmt.Sprintf("member %x (%s) was added and has not started: the datastore waits for a new member, so this leader does not go down until it votes", pending.ID, l3.peerURL))
		_, waited, err := startPaced(ctx, t, l4, RetryInterval)
		assert.ErrorContains(t, err, fmt.Sprintf("etcd did not start: member %x at %s was added and has not started yet; etcd takes one new member at a time", pending.ID, l3.peerURL))
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, waited, RetryInterval, "it looked again and still waited")
		_, err = os.Stat(l4.EnvFile)
		assert.Check(t, errors.Is(err, os.ErrNotExist), "etcd.env written for a machine that must wait")
		assert.DeepEqual(t, byID(f.list(ctx, t)), before)

		d, waited := f.boot(ctx, t, l3, false)
		assert.Equal(t, d.Action, StartAdded, d.Reason)
		assert.Equal(t, waited, time.Duration(0))
		assert.DeepEqual(t, byID(f.list(ctx, t)), before) // Start added nothing
		f.promote(ctx, t, l3)
		ids = f.waitVoters(ctx, t, l1, l2, l3)
		assert.Equal(t, ids["l3"], pending.ID)
	})

	step("a removed member's etcd exits; its restart moves the data aside and joins again", func(t *testing.T) {
		old := ids["l2"]
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if _, err := f.etcd.MemberRemove(ctx, l1.clientURL, old); err != nil {
				return poll.Continue("%v", err)
			}
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if l2.running() == nil {
				return poll.Continue("l2's etcd still runs")
			}
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(30*time.Second))
		l2.kill() // reaps it

		d, _ := f.boot(ctx, t, l2, true)
		assert.Equal(t, d.Action, JoinAsLearner, d.Reason)
		aside, err := filepath.Glob(filepath.Join(l2.dataDir, "removed-*", "member"))
		assert.NilError(t, err)
		assert.Check(t, is.Len(aside, 1), "the removed member's data is kept aside")
		f.promote(ctx, t, l2)
		ids = f.waitVoters(ctx, t, l1, l2, l3)
		assert.Check(t, ids["l2"] != old, "l2 kept its member ID %x", old)
	})

	step("a first leader installed again while the others are down waits for them; a second datastore started anyway is named by its health and fenced", func(t *testing.T) {
		// The fleet runs on after l2's promotion before it goes down.
		// Killed at once, l2 and l3 would restart with the promotion
		// stored but not known committed: voters l1 and l3, of which
		// only l3 runs, so no leader without l1's old member, ever.
		f.settle(ctx, t, l1, l2, l3)
		for _, l := range f.leaders {
			l.kill()
		}
		assert.NilError(t, os.RemoveAll(l1.dataDir))
		_, _, err := startPaced(ctx, t, f.startOptions(l1, false), 2*DefaultBootstrapWait)
		assert.ErrorContains(t, err, "did not say it holds no member data: it may hold the fleet's datastore, so the first leader starts no new one")
		// Started anyway, as liken did before it asked the other leaders
		// (or a person forcing it): a datastore of its own.
		d := StartDecision{Action: Bootstrap, InitialCluster: "l1=" + l1.peerURL, InitialClusterState: clusterStateNew, InitialClusterToken: "liken-started-anyway"}
		assert.NilError(t, WriteEtcdEnv(filepath.Join(l1.setupDir, EtcdEnvFile), d))
		f.runEtcd(t, l1, d)
		f.waitVoters(ctx, t, l1)
		api1, ready1 := apiStub(t, l1.setupDir)
		ready1.Store(true)
		// Alone, nothing tells it from a fresh fleet.
		assert.NilError(t, l1.health(api1).Check(ctx))

		// The others come back with their data: the fleet's datastore,
		// in which l1 is still the old member.
		for _, l := range []*etcdLeader{l2, l3} {
			d, _ := f.boot(ctx, t, l, false)
			assert.Equal(t, d.Action, StartWithData, d.Reason)
		}
		api2, ready2 := apiStub(t, l2.setupDir)
		ready2.Store(true)
		// Two of three members, both starting cold, elect a leader with
		// liken's 5 s election timeout (each draws 5 to 10 s, and a split
		// vote starts over): 6 to 12 s on a quiet host, more than 30 s
		// once while make test ran other packages beside it.
		began := time.Now()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if err := l2.health(api2).Check(ctx); err != nil {
				return poll.Continue("l2: %v", err)
			}
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(2*time.Minute))
		t.Logf("l2 and l3 elected a leader and l2 is healthy %s after they started", time.Since(began).Round(time.Millisecond))
		// Its API server would not start again: the split check before
		// it fails. The fleet's leaders pass it.
		assert.ErrorIs(t, l1.health(api1).SplitCheck(ctx), ErrSplit)
		assert.NilError(t, l3.health(api2).SplitCheck(ctx))
		h1 := l1.health(api1)
		fenced := 0
		h1.Fence = func(context.Context) error { fenced++; ready1.Store(false); return nil }
		err = h1.Check(ctx)
		assert.ErrorContains(t, err, "two datastores: this leader's etcd member belongs to datastore ")
		assert.ErrorContains(t, err, "; its API server is stopped, so that clients reach only the fleet's. Install this leader again")
		assert.Equal(t, fenced, 1)
		// Fenced, it still says why, not that its API server is down.
		assert.ErrorContains(t, h1.Check(ctx), "two datastores: ")
		assert.Equal(t, fenced, 2, "fenced again: the API server may have been started since")
		h1.Fence = func(context.Context) error { return errors.New("systemctl failed") }
		assert.ErrorContains(t, h1.Check(ctx), "; stopping its API server failed (systemctl failed), so clients that reach it see another cluster. Install this leader again")
		err = l1.health(api1).Check(ctx)
		assert.ErrorContains(t, err, "(members: l1), but the leaders at "+l2.clientURL+", "+l3.clientURL+" answer for datastore ")
		// The fleet's datastore lists its three members, in etcd's order.
		assert.Check(t, is.Regexp(`answer for datastore [0-9a-f]+ \(members: l[123], l[123], l[123]\)\. This leader started a new one alone`, err.Error()))
		assert.ErrorContains(t, err, "Install this leader again (liken install) now that the others run")
		// The fleet's own leaders stay healthy, and unfenced: theirs is
		// the larger one.
		h3 := l3.health(api2)
		h3.Fence = func(context.Context) error { t.Error("l3 fenced"); return nil }
		assert.NilError(t, h3.Check(ctx))
	})

	step("during a split, a member of the fleet's datastore whose etcd restarts stays in it", func(t *testing.T) {
		// l2's etcd exits and systemd starts it again. l1, asked first,
		// answers for its own datastore, which lists no l2: one answer
		// from another datastore proves nothing, and l2 keeps its data.
		fleet, err := DiskData{Dir: l2.dataDir}.Datastore()
		assert.NilError(t, err)
		assert.Assert(t, fleet != 0, "l2's datastore is not recorded")
		before := byID(f.listAt(ctx, t, l3))
		l2.kill()
		d, _ := f.boot(ctx, t, l2, true)
		assert.Equal(t, d.Action, StartWithData, d.Reason)
		aside, err := filepath.Glob(filepath.Join(l2.dataDir, "removed-*"))
		assert.NilError(t, err)
		assert.Check(t, is.Len(aside, 1), "l2's data moved aside again: %v", aside) // the one of the earlier step
		// A member with no record (it started before liken recorded
		// datastores) hears two datastores and starts with its data too.
		assert.NilError(t, os.Remove(filepath.Join(l3.dataDir, DatastoreFile)))
		l3.kill()
		d, _ = f.boot(ctx, t, l3, true)
		assert.Equal(t, d.Action, StartWithData, d.Reason)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			cluster, members, err := f.etcd.ClusterMembers(ctx, l2.clientURL)
			switch {
			case err != nil:
				return poll.Continue("%v", err)
			case cluster != fleet:
				return poll.Error(fmt.Errorf("l2 answers for datastore %x, not the fleet's %x", cluster, fleet))
			}
			if ok, err := f.etcd.Health(ctx, l2.clientURL); !ok {
				return poll.Continue("%v", err)
			}
			assert.DeepEqual(t, byID(members), before)
			return poll.Success()
		}, poll.WithDelay(100*time.Millisecond), poll.WithTimeout(2*time.Minute))
	})
}
