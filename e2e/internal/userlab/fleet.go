package userlab

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/endpoint"
	"liken.sh/liken/e2e/internal/apiprobe"
	nodecp "liken.sh/liken/node/controlplane"
)

// Failover bounds how long the API may be gone when one of three leaders
// goes, by a reboot or a power cut, the two others keeping the quorum:
//   - if its member led the datastore, the two others elect a new leader
//     within two etcd election timeouts (raft draws each member's timeout
//     between one and two of them): 10 s;
//   - the lab's endpoint takes the leader out of its turn when a check of
//     its /readyz fails: within a check interval and a check's deadline,
//     3 s (a powered-off leader refuses at once; a rebooting one, whose
//     QEMU still accepts connections, answers nothing until the deadline);
//   - a probe request already on its way to that leader fails at the
//     probe's deadline: 2 s.
//
// A leader that reboots in its turn leaves with less: its API server keeps
// serving for its shutdown delay while /readyz fails, and its etcd member
// hands the datastore's leadership over as it stops.
var Failover = 2*time.Duration(nodecp.EtcdElectionTimeoutMillis)*time.Millisecond +
	endpoint.DefaultInterval + endpoint.DefaultTimeout + apiprobe.DefaultTimeout

// SelfHostedFleet runs the user's commands on a lab of five machines,
// three of them leaders running the datastore and the API behind the lab's
// endpoint. What a user relies on: an upgrade reboots one machine at a
// time, the leaders first, and the API stays up through it, gone at most
// for one leader's failover; after every turn the datastore has its three
// voters and a quorum; cluster-operator's copies move under their
// PodDisruptionBudget; a leader whose power is pulled mid-rollout leaves
// the API up on the two others and comes back with its etcd member; a
// release that cannot boot fails the first leader's trial, which comes
// back on its proven slot with the same member, and the rollout halts
// before any other machine tries it.
func SelfHostedFleet(t *testing.T, l *Lab) {
	ctx := t.Context()
	w := watchFleet(t, l)
	start := time.Now()
	ids := WaitDatastore(t, w.etcd, w.urls, 10*time.Minute)
	t.Logf("the datastore: members %v, voters all healthy, %s after lab up", ids, time.Since(start).Round(time.Second))

	// An upgrade under the API probe: the leaders first, one at a time.
	ver, digest := l.Publish("")
	probe, stopProbe := StartProbe(ctx, l.Kube)
	w.follow(ver, probe)
	l.MoveTo(ver, digest)
	upgrade := time.Now()
	var worker string
	w.wait("the leaders upgraded and a worker's turn granted", 45*time.Minute, func() poll.Result {
		for _, tn := range w.cluster.Status.RebootTurns {
			if tn.Leader {
				continue
			}
			for _, n := range w.leaders {
				if v := w.machines[n].Status.Version; v != ver {
					return poll.Error(fmt.Errorf("worker %s holds a turn while leader %s runs %q: an upgrade goes leaders first", tn.Machine, n, v))
				}
			}
			worker = tn.Machine
			return poll.Success()
		}
		return poll.Continue("turns held: %q", w.cluster.Status.Turns)
	})

	// While the worker holds its turn, a leader loses its power: the API
	// answers on the two others, and the leader comes back with its member.
	cut := w.leaders[0]
	boot := w.machines[cut].Status.Observed.BootID
	assert.Assert(t, boot != "", "%s reports no boot", cut)
	w.cut = cut
	probe.Mark(fmt.Sprintf("%s loses its power while %s holds its turn", cut, worker))
	l.Run("lab", "power", "off", cut, "--name", l.Name)
	w.wait(cut+" reads Lost after its power cut", 10*time.Minute, func() poll.Result {
		if p := w.machines[cut].Status.Phase; p != likenv1.MachineLost {
			return poll.Continue("%s reads %s", cut, p)
		}
		return poll.Success()
	})
	rep := probe.Report()
	assert.Assert(t, rep.Longest.Duration() <= Failover,
		"with %s's power cut the API was gone longer than one leader's failover (%s): %s", cut, Failover, rep)
	l.Run("lab", "power", "on", cut, "--name", l.Name)
	probe.Mark(cut + " powered on")
	w.wait(cut+" back, its member a healthy voter, both operator copies ready", 20*time.Minute, func() poll.Result {
		m := w.machines[cut]
		if m.Status.Observed.BootID == boot || m.Status.Phase != likenv1.MachineReady || !meta.IsStatusConditionTrue(m.Status.Conditions, likenv1.ConditionControlPlaneReady) {
			return poll.Continue("%s: %s, boot %s", cut, m.Status.Phase, m.Status.Observed.BootID)
		}
		if r := w.sameMembers(ctx, ids); !r.Done() {
			return r
		}
		if w.copies < w.replicas {
			return poll.Continue("%d of cluster-operator's %d copies ready", w.copies, w.replicas)
		}
		return poll.Success()
	})
	probe.Mark(cut+" is back", apiprobe.Datastore(ctx, w.views))
	w.cut = ""

	w.wait("every machine on "+ver, 45*time.Minute, func() poll.Result {
		for n, m := range w.machines {
			if m.Status.Version != ver || m.Status.Phase != likenv1.MachineReady || !w.checked[n] {
				return poll.Continue("%s: %s on %q, the datastore after its turn checked %v", n, m.Status.Phase, m.Status.Version, w.checked[n])
			}
		}
		return poll.Success()
	})
	rep = stopProbe(t)
	t.Logf("API probe through the upgrade of %d machines to %s (%s), %s's power cut included: %s",
		len(w.machines), ver, time.Since(upgrade).Round(time.Second), cut, rep.Timeline())
	t.Logf("through the upgrade: at most %d turns held at once (maxUnavailable %d); at the fewest %d of cluster-operator's %d copies ready but while %s's power was cut (one leader's drain leaves %d); the longest window without the API %s (one leader's failover: %s)",
		w.mostTurns, w.maxTurns, w.fewestCopies, w.replicas, cut, w.minCopies, rep.Longest.Duration().Round(100*time.Millisecond), Failover)
	assert.Assert(t, rep.Rounds > 0 && !rep.Longest.Ongoing, "the API did not answer again after the upgrade: %s", rep)
	assert.Assert(t, rep.Longest.Duration() <= Failover, "the API was gone longer than one leader's failover (%s): %s", Failover, rep)
	assert.Assert(t, is.DeepEqual(slices.Sorted(maps.Keys(w.granted)), slices.Sorted(maps.Keys(w.machines))), "the machines granted a turn for %s", ver)

	// A release that cannot boot: the first machine to try it is a leader;
	// its trial fails, it comes back on its proven slot with the same
	// member, and the rollout halts there.
	before := maps.Clone(w.machines)
	bad, badDigest := l.Publish("panic")
	probe, stopProbe = StartProbe(ctx, l.Kube)
	probe.Mark("before "+bad, apiprobe.Datastore(ctx, w.views))
	w.follow(bad, probe)
	l.MoveTo(bad, badDigest)
	tried := time.Now()
	var first string
	w.wait("the first turn for "+bad, 20*time.Minute, func() poll.Result {
		for _, tn := range w.cluster.Status.RebootTurns {
			if tn.Version == bad {
				first = tn.Machine
				return poll.Success()
			}
		}
		return poll.Continue("turns held: %q", w.cluster.Status.Turns)
	})
	assert.Assert(t, slices.Contains(w.leaders, first), "%s tried %s first; an upgrade goes leaders first (%v)", first, bad, w.leaders)
	w.wait(first+" failed its trial and came back with its member", 25*time.Minute, func() poll.Result {
		if r := TrialFailedBack(w.machines[first], before[first]); !r.Done() {
			return r
		}
		if h := w.cluster.Status.Halt; h == nil || h.Reason != likenv1.ReasonTrialFailed {
			return poll.Continue("the Cluster's halt: %+v", h)
		}
		return w.sameMembers(ctx, ids)
	})
	probe.Mark(first+" is back on its proven slot", apiprobe.Datastore(ctx, w.views))
	FailedTrialLogs(t, l, first, bad)
	rep = stopProbe(t)
	t.Logf("API probe while %s tried %s (%s to the halt): %s", first, bad, time.Since(tried).Round(time.Second), rep.Timeline())
	assert.Assert(t, rep.Rounds > 0 && !rep.Longest.Ongoing && rep.Longest.Duration() <= Failover,
		"while %s tried %s the API was gone longer than one leader's failover (%s): %s", first, bad, Failover, rep)
	h := w.cluster.Status.Halt
	assert.Check(t, h.Machine == first && h.Version == bad, "the Cluster's halt: %+v", h)
	assert.Check(t, is.DeepEqual(slices.Collect(maps.Keys(w.granted)), []string{first}), "the machines granted a turn for %s", bad)
	for n, m := range w.machines {
		if n != first {
			assert.Check(t, m.Status.Observed.BootID == before[n].Status.Observed.BootID && m.Status.Version == ver,
				"%s booted again (%s, was %s) or runs %q: only %s was to try %s", n, m.Status.Observed.BootID, before[n].Status.Observed.BootID, m.Status.Version, first, bad)
		}
	}
}

// fleetWatch reads a lab's fleet every 2 s through its rollouts and checks
// what must hold all along: the ledger holds no more turns than
// maxUnavailable and grants a machine one turn per release;
// cluster-operator's ready copies (and those that exited, which no drain
// took) never fall below what their PodDisruptionBudget leaves, but while
// a leader's power is cut, which no budget covers, and while a leader that
// ran every copy is in its turn or settles after it; after each machine's
// turn, the datastore keeps its voters and a quorum.
type fleetWatch struct {
	t        *testing.T
	l        *Lab
	etcd     *nodecp.EtcdClient
	leaders  []string
	urls     map[string]string             // each leader's etcd client URL, by name
	views    map[string]*nodecp.EtcdClient // the same URLs, for apiprobe.Datastore
	maxTurns int                           // maxUnavailable
	replicas int                           // cluster-operator's copies
	// minCopies is how many copies the PodDisruptionBudget keeps.
	minCopies int

	// The rollout followed, and what its last step read.
	probe   *apiprobe.Probe
	version string
	// cut is the leader whose power is cut, until it is back.
	cut string
	// granted holds the Release turns for version, by machine.
	granted map[string]metav1.Time
	// ended holds when each machine was first seen Ready on version, and
	// checked the machines whose datastore check passed after it.
	ended    map[string]time.Time
	checked  map[string]bool
	cluster  *likenv1.Cluster
	machines map[string]*likenv1.Machine
	copies   int // cluster-operator's ready copies
	// copyHosts are the machines the ready copies ran on at the last read
	// with no leader in a turn or settling. Both copies may run on one leader (they
	// were placed while it was the only leader up, and nothing moves
	// them): that leader's drain takes both, which alone is logged.
	copyHosts map[string]bool
	alone     map[string]bool
	// The extremes of the rollout: the most turns held at once, the
	// fewest copies ready but during a power cut.
	mostTurns, fewestCopies int
}

// watchFleet reads the lab's leaders, their forwarded etcd client ports,
// and the budgets the fleet is checked against.
func watchFleet(t *testing.T, l *Lab) *fleetWatch {
	t.Helper()
	ctx := t.Context()
	etcd, urls := l.Datastore(t)
	w := &fleetWatch{t: t, l: l, etcd: etcd, urls: urls, views: map[string]*nodecp.EtcdClient{}}
	for n, u := range urls {
		w.leaders = append(w.leaders, n)
		w.views[u] = etcd
	}
	slices.Sort(w.leaders)
	assert.Equal(t, len(w.urls), 3, "the leaders' forwarded etcd client ports in lab.json: %+v", l.St.Machines)
	c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.Name, metav1.GetOptions{})
	assert.NilError(t, err)
	w.maxTurns, err = c.Spec.Disruption.MaxUnavailableFor(len(l.St.Machines))
	assert.NilError(t, err)
	d, err := l.Kube.AppsV1().Deployments(likenv1.SystemNamespace).Get(ctx, "cluster-operator", metav1.GetOptions{})
	assert.NilError(t, err)
	w.replicas = int(*d.Spec.Replicas)
	// The copies run on two leaders (but see copyHosts), leaders take
	// turns one at a time, and a leader settles only once the copies are
	// all ready again: a drain takes one copy away at most.
	w.minCopies = w.replicas - 1
	return w
}

// follow starts following a rollout to version, marking probe as turns end.
func (w *fleetWatch) follow(version string, probe *apiprobe.Probe) {
	w.version, w.probe = version, probe
	w.granted, w.ended, w.checked = map[string]metav1.Time{}, map[string]time.Time{}, map[string]bool{}
	w.mostTurns, w.fewestCopies = 0, w.replicas
	w.alone = map[string]bool{}
}

// wait steps every 2 s until done, given the step's reads, succeeds, for
// at most timeout, and logs how long it took.
func (w *fleetWatch) wait(what string, timeout time.Duration, done func() poll.Result) {
	w.t.Helper()
	start := time.Now()
	poll.WaitOn(w.t, func(poll.LogT) poll.Result {
		if r := w.step(w.t.Context()); r != nil {
			return r
		}
		return done()
	}, poll.WithTimeout(timeout), poll.WithDelay(2*time.Second))
	w.t.Logf("%s: %s", what, time.Since(start).Round(time.Second))
}

// step reads the Cluster, the Machines and cluster-operator's pods, and
// checks them. It returns nil when all was read and holds, a Continue
// when the API or a datastore check after a turn is still to answer, and
// an Error when something that must hold does not.
func (w *fleetWatch) step(ctx context.Context) poll.Result {
	c, err := w.l.Liken.LikenV1alpha1().Clusters().Get(ctx, w.l.Name, metav1.GetOptions{})
	if err != nil {
		return poll.Continue("the Cluster: %v", err)
	}
	ms, err := w.l.Liken.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
	if err != nil {
		return poll.Continue("the Machines: %v", err)
	}
	pods, err := w.l.Kube.CoreV1().Pods(likenv1.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cluster-operator"})
	if err != nil {
		return poll.Continue("cluster-operator's pods: %v", err)
	}
	w.cluster, w.machines = c, map[string]*likenv1.Machine{}
	for i := range ms.Items {
		w.machines[ms.Items[i].Name] = &ms.Items[i]
	}

	turns := c.Status.RebootTurns
	w.mostTurns = max(w.mostTurns, len(turns))
	if len(turns) > w.maxTurns {
		return poll.Error(fmt.Errorf("the ledger holds %d turns, more than maxUnavailable (%d): %+v", len(turns), w.maxTurns, turns))
	}
	var leaders []string
	for _, tn := range turns {
		if tn.Leader {
			leaders = append(leaders, tn.Machine)
		}
	}
	if len(leaders) > 1 {
		return poll.Error(fmt.Errorf("leaders %v hold turns at once; leaders take them one at a time: %+v", leaders, turns))
	}
	for _, tn := range turns {
		if tn.Reason != likenv1.TurnRelease || tn.Version != w.version {
			continue
		}
		if at, ok := w.granted[tn.Machine]; ok && !at.Equal(&tn.GrantedAt) {
			return poll.Error(fmt.Errorf("%s was granted a turn for %s twice, at %s and at %s", tn.Machine, w.version, at, tn.GrantedAt))
		}
		w.granted[tn.Machine] = tn.GrantedAt
	}

	w.copies = 0
	down := 0
	hosts := map[string]bool{}
	for _, p := range pods.Items {
		switch {
		case p.DeletionTimestamp != nil: // evicted
		case podReady(&p):
			w.copies++
			hosts[p.Spec.NodeName] = true
		case exited(&p):
			down++
		}
	}
	// The leaders in a turn or settling after one: a leader settles only
	// once the copies are all ready again.
	busy := slices.Clone(leaders)
	for _, st := range c.Status.Settling {
		if st.Leader && !slices.Contains(busy, st.Machine) {
			busy = append(busy, st.Machine)
		}
	}
	if len(busy) == 0 {
		w.copyHosts = hosts
	}
	lone := len(busy) == 1 && len(w.copyHosts) == 1 && w.copyHosts[busy[0]]
	if lone && !w.alone[busy[0]] {
		w.alone[busy[0]] = true
		w.t.Logf("%s ran every copy of cluster-operator when its turn came: its drain takes them all, and it settles only once they run again", busy[0])
	}
	if w.cut == "" && !lone {
		w.fewestCopies = min(w.fewestCopies, w.copies)
		if w.copies+down < w.minCopies {
			return poll.Error(fmt.Errorf("%d of cluster-operator's copies ready and %d exited, fewer than one leader's drain leaves (%d): %s; turns held: %q, settling: %+v",
				w.copies, down, w.minCopies, podStates(pods.Items), c.Status.Turns, c.Status.Settling))
		}
	}

	// The end of a turn: the datastore's view on the probe's timeline, and
	// its voters and a quorum within a minute.
	for _, m := range ms.Items {
		if m.Status.Version != w.version || m.Status.Phase != likenv1.MachineReady || w.checked[m.Name] {
			continue
		}
		if _, ok := w.ended[m.Name]; !ok {
			w.ended[m.Name] = time.Now()
			w.probe.Mark(m.Name+" ended its turn on "+w.version, apiprobe.Datastore(ctx, w.views))
		}
		if _, err := CheckDatastore(ctx, w.etcd, w.urls, len(w.urls)/2+1); err != nil {
			if time.Since(w.ended[m.Name]) > time.Minute {
				return poll.Error(fmt.Errorf("a minute after %s's turn the datastore lacks its voters or a quorum: %w", m.Name, err))
			}
			return poll.Continue("the datastore after %s's turn: %v", m.Name, err)
		}
		w.checked[m.Name] = true
	}
	return nil
}

// sameMembers succeeds once every leader's member is a healthy voter, and
// fails when the members are not those of ids: a leader back from a
// reboot or a power cut keeps its member.
func (w *fleetWatch) sameMembers(ctx context.Context, ids map[string]uint64) poll.Result {
	got, err := CheckDatastore(ctx, w.etcd, w.urls, len(w.urls))
	switch {
	case err != nil:
		return poll.Continue("%v", err)
	case !maps.Equal(got, ids):
		return poll.Error(fmt.Errorf("the members are %v, were %v: a leader came back as a new member", got, ids))
	}
	return poll.Success()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// exited tells whether a container of p exited, or restarted and is not
// ready again: p is down by itself (a copy exits when it loses its
// lease), not by an eviction.
func exited(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if !c.Ready && (c.RestartCount > 0 || c.State.Terminated != nil) {
			return true
		}
	}
	return false
}

// podStates is each pod's node, phase and readiness, for a message.
func podStates(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s on %s: %s, ready %v, deleted %v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p), p.DeletionTimestamp != nil))
	}
	return fmt.Sprint(s)
}
