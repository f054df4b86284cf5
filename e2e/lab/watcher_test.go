package lab

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/generated/clientset/versioned"
)

// watcher records every version of the lab's Cluster, its Machines and
// their Nodes from the start of a scenario to its end, and checks the
// fleet's invariants at every revision:
//
//   - turns held plus machines Lost or NotReady without a turn stay within
//     maxUnavailable;
//   - at most one leader is down (holds a turn, is Lost, or NotReady);
//   - a machine runs and keeps only verified releases: its status.version
//     is catalogued, the slot it booted holds that version with the
//     catalogued digest, every Active, Staged or Previous slot holds a
//     catalogued version with its catalogued digest, and a corrupt release
//     is never Staged or Active anywhere;
//   - a catalog entry never changes its digest.
//
// All objects live in one etcd, so resource versions order events of
// every kind on one time line. Watch streams deliver out of step with one
// another, so the watcher evaluates only up to a revision every stream is
// known to have delivered (settle).
type watcher struct {
	cluster string
	cancel  context.CancelFunc
	done    sync.WaitGroup
	streams []*stream

	// onMachine, when set, is given every Machine version as it is
	// delivered (with w.mu held: it must not block).
	onMachine func(*likenv1.Machine)

	mu      sync.Mutex
	pending []event
	gaps    []string
	corrupt map[string]bool

	// Evaluation, up to evalRV.
	evalRV    int64
	checkFrom int64
	world     world
	catalog   map[string]string
	clusters  []record[*likenv1.Cluster]
	machines  map[string][]record[*likenv1.Machine]
	snaps     []snapshot
	problems  []string
	seenProbs map[string]int
}

// event is one object version a stream delivered.
type event struct {
	rv      int64
	at      time.Time
	kind    string
	deleted bool
	obj     runtime.Object
}

// record is one version of an object, with when the watcher saw it.
type record[T any] struct {
	rv  int64
	at  time.Time
	obj T
}

// world is the fleet at one revision.
type world struct {
	cluster  *likenv1.Cluster
	machines map[string]*likenv1.Machine
	nodes    map[string]*corev1.Node
}

// snapshot is what the budget looked like at one revision.
type snapshot struct {
	rv       int64
	at       time.Time
	turns    []string
	updating []string
	down     []string
}

type stream struct {
	kind   string
	list   func(ctx context.Context) (string, []runtime.Object, error)
	watch  func(ctx context.Context, rv string) (watch.Interface, error)
	listRV int64

	// lastRV is the newest revision the stream delivered (w.mu).
	lastRV int64
}

// newWatcher returns a watcher of cluster with no streams yet.
func newWatcher(cluster string) *watcher {
	return &watcher{
		cluster: cluster, cancel: func() {}, corrupt: map[string]bool{}, catalog: map[string]string{},
		world:    world{machines: map[string]*likenv1.Machine{}, nodes: map[string]*corev1.Node{}},
		machines: map[string][]record[*likenv1.Machine]{}, seenProbs: map[string]int{},
	}
}

func startWatcher(t *testing.T, c versioned.Interface, k kubernetes.Interface, cluster string, onMachine func(*likenv1.Machine)) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := newWatcher(cluster)
	w.cancel = cancel
	w.onMachine = onMachine
	clusters, machines, nodes := c.LikenV1alpha1().Clusters(), c.LikenV1alpha1().Machines(), k.CoreV1().Nodes()
	w.streams = []*stream{
		{kind: "Cluster", list: func(ctx context.Context) (string, []runtime.Object, error) {
			l, err := clusters.List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", nil, err
			}
			var out []runtime.Object
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return l.ResourceVersion, out, nil
		}, watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return clusters.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
		{kind: "Machine", list: func(ctx context.Context) (string, []runtime.Object, error) {
			l, err := machines.List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", nil, err
			}
			var out []runtime.Object
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return l.ResourceVersion, out, nil
		}, watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return machines.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
		{kind: "Node", list: func(ctx context.Context) (string, []runtime.Object, error) {
			l, err := nodes.List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", nil, err
			}
			var out []runtime.Object
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return l.ResourceVersion, out, nil
		}, watch: func(ctx context.Context, rv string) (watch.Interface, error) {
			return nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
	}
	for _, s := range w.streams {
		rv, items, err := s.list(ctx)
		assert.NilError(t, err, "listing %ss", s.kind)
		s.listRV = parseRV(rv)
		w.checkFrom = max(w.checkFrom, s.listRV)
		w.mu.Lock()
		for _, o := range items {
			w.deliver(s, watch.Added, o)
		}
		s.lastRV = max(s.lastRV, s.listRV)
		w.mu.Unlock()
		w.done.Add(1)
		go w.follow(ctx, s, rv)
	}
	return w
}

// follow delivers the stream's events from revision rv on, watching again
// when the server ends a watch.
func (w *watcher) follow(ctx context.Context, s *stream, rv string) {
	defer w.done.Done()
	for ctx.Err() == nil {
		wi, err := s.watch(ctx, rv)
		if err != nil {
			if ctx.Err() == nil {
				w.gap(fmt.Sprintf("%s watch from revision %s: %v", s.kind, rv, err))
			}
			return
		}
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				if ctx.Err() != nil {
					wi.Stop()
					return
				}
				w.gap(fmt.Sprintf("%s watch error after revision %s: %v", s.kind, rv, apierrors.FromObject(ev.Object)))
				wi.Stop()
				return
			}
			acc, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = acc.GetResourceVersion()
			w.mu.Lock()
			if ev.Type == watch.Bookmark {
				s.lastRV = max(s.lastRV, parseRV(rv))
			} else {
				w.deliver(s, ev.Type, ev.Object)
			}
			w.mu.Unlock()
		}
		wi.Stop()
	}
}

// deliver queues one object version. Call with w.mu held.
func (w *watcher) deliver(s *stream, typ watch.EventType, obj runtime.Object) {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	rv := parseRV(acc.GetResourceVersion())
	w.pending = append(w.pending, event{rv: rv, at: time.Now(), kind: s.kind, deleted: typ == watch.Deleted, obj: obj})
	if m, ok := obj.(*likenv1.Machine); ok && typ != watch.Deleted && w.onMachine != nil {
		w.onMachine(m)
	}
	s.lastRV = max(s.lastRV, rv)
}

func (w *watcher) gap(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gaps = append(w.gaps, s)
}

func (w *watcher) stop() {
	w.cancel()
	w.done.Wait()
}

// markCorrupt tells the watcher that version's served bytes are corrupt:
// no machine may ever stage or run it.
func (w *watcher) markCorrupt(version string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.corrupt[version] = true
}

// trusted returns every catalog entry the Cluster ever had and the
// corrupt versions.
func (w *watcher) trusted() (map[string]string, map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, k := map[string]string{}, map[string]bool{}
	for v, d := range w.catalog {
		c[v] = d
	}
	for v := range w.corrupt {
		k[v] = true
	}
	return c, k
}

// settle waits until every stream has delivered everything up to a
// revision the API server has reached now, and evaluates every event up
// to it. It returns that revision.
func (w *watcher) settle(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	upTo := int64(-1)
	for _, s := range w.streams {
		rv, items, err := s.list(ctx)
		assert.NilError(t, err, "listing %ss", s.kind)
		listRV := parseRV(rv)
		if upTo < 0 || listRV < upTo {
			upTo = listRV
		}
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.gaps) > 0 {
				return poll.Error(fmt.Errorf("the watcher lost events: %v", w.gaps))
			}
			// A stream delivers in revision order: once it delivered the
			// newest listed version, it delivered everything up to the
			// list's revision.
			for _, o := range items {
				if rv := rvOf(o); s.lastRV < rv {
					return poll.Continue("the %s watch has not yet delivered revision %d", s.kind, rv)
				}
			}
			return poll.Success()
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.evaluate(upTo)
	return upTo
}

// evaluateDelivered evaluates what every stream has delivered so far,
// without a barrier: for a failed test's report.
func (w *watcher) evaluateDelivered() {
	w.mu.Lock()
	defer w.mu.Unlock()
	upTo := int64(-1)
	for _, s := range w.streams {
		if upTo < 0 || s.lastRV < upTo {
			upTo = s.lastRV
		}
	}
	if upTo > w.evalRV {
		w.evaluate(upTo)
	}
}

// evaluate applies every pending event up to revision upTo in revision
// order and checks the invariants after each. Call with w.mu held.
func (w *watcher) evaluate(upTo int64) {
	sort.SliceStable(w.pending, func(i, j int) bool { return w.pending[i].rv < w.pending[j].rv })
	n := 0
	for _, ev := range w.pending {
		if ev.rv > upTo {
			break
		}
		n++
		if ev.rv <= w.evalRV && ev.rv > w.checkFrom {
			// Delivered after a revision already evaluated: settle's
			// barrier makes this impossible unless a stream broke.
			w.problem("late", fmt.Sprintf("%s revision %d arrived after revision %d was evaluated", ev.kind, ev.rv, w.evalRV))
		}
		w.apply(ev)
		if ev.rv > w.checkFrom {
			w.check(ev)
		}
		w.evalRV = max(w.evalRV, ev.rv)
	}
	w.pending = append([]event(nil), w.pending[n:]...)
	w.evalRV = max(w.evalRV, upTo)
}

func (w *watcher) apply(ev event) {
	switch o := ev.obj.(type) {
	case *likenv1.Cluster:
		if o.Name != w.cluster {
			return
		}
		if ev.deleted {
			w.world.cluster = nil
			return
		}
		w.world.cluster = o
		w.clusters = append(w.clusters, record[*likenv1.Cluster]{rv: ev.rv, at: ev.at, obj: o})
		for _, e := range o.Spec.Releases.Catalog {
			if d, ok := w.catalog[e.Version]; ok && d != e.Digest {
				w.problem("catalog/"+e.Version, fmt.Sprintf("revision %d: Cluster %s@%s pins %s to %s; it was %s before",
					ev.rv, o.Name, o.ResourceVersion, e.Version, e.Digest, d))
			}
			w.catalog[e.Version] = e.Digest
		}
	case *likenv1.Machine:
		if o.Spec.Cluster != w.cluster {
			return
		}
		if ev.deleted {
			delete(w.world.machines, o.Name)
			return
		}
		w.world.machines[o.Name] = o
		w.machines[o.Name] = append(w.machines[o.Name], record[*likenv1.Machine]{rv: ev.rv, at: ev.at, obj: o})
	case *corev1.Node:
		if ev.deleted {
			delete(w.world.nodes, o.Name)
			return
		}
		w.world.nodes[o.Name] = o
	}
}

// check proves the invariants on the world at revision ev.rv.
func (w *watcher) check(ev event) {
	c := w.world.cluster
	snap := snapshot{rv: ev.rv, at: ev.at}
	names := make([]string, 0, len(w.world.machines))
	for n := range w.world.machines {
		names = append(names, n)
	}
	sort.Strings(names)
	inLedger := map[string]bool{}
	if c != nil {
		for _, t := range c.Status.RebootTurns {
			inLedger[t.Machine] = true
			snap.turns = append(snap.turns, t.Machine)
		}
	}
	var leadersDown, versions []string
	for _, n := range names {
		m := w.world.machines[n]
		notReady := false
		if node := w.world.nodes[n]; node != nil {
			notReady = !isNodeReady(node)
			versions = append(versions, fmt.Sprintf("Node %s@%s", n, node.ResourceVersion))
		}
		versions = append(versions, fmt.Sprintf("Machine %s@%s(%s)", n, m.ResourceVersion, m.Status.Phase))
		down := m.Status.Phase == likenv1.MachineLost || notReady
		if m.Status.Phase == likenv1.MachineUpdating {
			snap.updating = append(snap.updating, n)
		}
		if down && !inLedger[n] {
			snap.down = append(snap.down, n)
		}
		if m.Spec.Role == likenv1.RoleLeader && (down || inLedger[n]) {
			leadersDown = append(leadersDown, n)
		}
	}
	w.snaps = append(w.snaps, snap)
	if c != nil {
		objects := fmt.Sprintf("Cluster %s@%s turns %q; %s", c.Name, c.ResourceVersion, c.Status.Turns, strings.Join(versions, ", "))
		maxUnavailable, err := c.Spec.Disruption.MaxUnavailableFor(len(names))
		if err != nil {
			w.problem("budget-invalid", fmt.Sprintf("revision %d: maxUnavailable: %v", ev.rv, err))
		} else if len(snap.turns)+len(snap.down) > maxUnavailable {
			w.problem(fmt.Sprintf("budget %v %v", snap.turns, snap.down), fmt.Sprintf(
				"revision %d (%s changed): %d turns %v + %d machines Lost or NotReady without a turn %v > maxUnavailable %d; objects: %s",
				ev.rv, ev.kind, len(snap.turns), snap.turns, len(snap.down), snap.down, maxUnavailable, objects))
		}
		if len(leadersDown) > 1 {
			w.problem(fmt.Sprintf("leaders %v", leadersDown), fmt.Sprintf(
				"revision %d (%s changed): %d leaders down at once %v (holding a turn, Lost or NotReady); objects: %s",
				ev.rv, ev.kind, len(leadersDown), leadersDown, objects))
		}
	}
	if m, ok := ev.obj.(*likenv1.Machine); ok && !ev.deleted && m.Spec.Cluster == w.cluster {
		w.checkVerified(ev.rv, m)
	}
}

// checkVerified proves that a Machine reports only verified releases.
func (w *watcher) checkVerified(rv int64, m *likenv1.Machine) {
	st := m.Status
	at := fmt.Sprintf("revision %d: Machine %s@%s", rv, m.Name, m.ResourceVersion)
	if st.Version != "" {
		if w.catalog[st.Version] == "" || w.corrupt[st.Version] {
			w.problem("version/"+m.Name+"/"+st.Version, fmt.Sprintf("%s runs %s, which is not a verified catalogued release (corrupt: %v)", at, st.Version, w.corrupt[st.Version]))
		}
		found := false
		for _, s := range st.Slots {
			if s.Name != st.Slot {
				continue
			}
			found = true
			if s.Version != st.Version || s.Digest != w.catalog[st.Version] {
				w.problem("booted/"+m.Name+"/"+s.Version, fmt.Sprintf("%s runs %s from slot %s, which holds %s %s (catalog: %s)",
					at, st.Version, st.Slot, s.Version, s.Digest, w.catalog[st.Version]))
			}
		}
		if !found {
			w.problem("noslot/"+m.Name, fmt.Sprintf("%s runs %s from slot %q, which it does not report", at, st.Version, st.Slot))
		}
	}
	for _, s := range st.Slots {
		switch s.State {
		case likenv1.SlotActive, likenv1.SlotStaged, likenv1.SlotPrevious:
		default:
			continue
		}
		if w.catalog[s.Version] == "" || s.Digest != w.catalog[s.Version] || w.corrupt[s.Version] {
			w.problem(fmt.Sprintf("slot/%s/%s/%s/%s", m.Name, s.Name, s.State, s.Version), fmt.Sprintf(
				"%s slot %s is %s with %s %s, which did not verify against the catalog (catalog digest %q, corrupt: %v)",
				at, s.Name, s.State, s.Version, s.Digest, w.catalog[s.Version], w.corrupt[s.Version]))
		}
	}
	if st.Staged != "" && w.corrupt[st.Staged] {
		w.problem("staged/"+m.Name+"/"+st.Staged, fmt.Sprintf("%s reports corrupt release %s staged", at, st.Staged))
	}
}

// problem records a broken invariant once per key.
// report records a broken invariant found outside the evaluation.
func (w *watcher) report(key, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problem(key, msg)
}

func (w *watcher) problem(key, msg string) {
	w.seenProbs[key]++
	if w.seenProbs[key] == 1 {
		w.problems = append(w.problems, msg)
	}
}

// assertNoViolations fails the test if any invariant broke or events
// were lost.
func (w *watcher) assertNoViolations(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Assert(t, len(w.gaps) == 0, "the watcher lost events: %v", w.gaps)
	assert.Assert(t, len(w.problems) == 0, "the fleet broke its invariants:\n%s", strings.Join(w.problems, "\n"))
	t.Logf("watcher: invariants held at %d revisions (%d Cluster versions, %d Machine versions)", len(w.snaps), len(w.clusters), w.machineVersions())
}

func (w *watcher) machineVersions() int {
	n := 0
	for _, h := range w.machines {
		n += len(h)
	}
	return n
}

// phases is the sequence of a machine's phases after revision from, with
// repeats folded, each with the version it reported.
func (w *watcher) phases(name string, from int64) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, r := range w.machines[name] {
		if r.rv <= from {
			continue
		}
		p := string(r.obj.Status.Phase)
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return out
}

// firstVersion is the version a machine reported when the watcher
// started.
func (w *watcher) firstVersion(name string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := w.machines[name]; len(h) > 0 {
		return h[0].obj.Status.Version
	}
	return ""
}

// machineHistory returns the versions of a machine after revision from.
func (w *watcher) machineHistory(name string, from int64) []record[*likenv1.Machine] {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []record[*likenv1.Machine]
	for _, r := range w.machines[name] {
		if r.rv > from {
			out = append(out, r)
		}
	}
	return out
}

// clusterHistory returns the versions of the Cluster after revision from.
func (w *watcher) clusterHistory(from int64) []record[*likenv1.Cluster] {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []record[*likenv1.Cluster]
	for _, r := range w.clusters {
		if r.rv > from {
			out = append(out, r)
		}
	}
	return out
}

// clusterRV returns one less than the revision of the first recorded
// version of the Cluster that satisfies pred, so that histories after the
// returned revision include that version; 0 if no version does.
func (w *watcher) clusterRV(pred func(*likenv1.Cluster) bool) int64 {
	for _, r := range w.clusterHistory(0) {
		if pred(r.obj) {
			return r.rv - 1
		}
	}
	return 0
}

// clusterPhases is the sequence of the Cluster's phases after revision
// from, with repeats folded.
func (w *watcher) clusterPhases(from int64) []string {
	var out []string
	for _, r := range w.clusterHistory(from) {
		p := string(r.obj.Status.Phase)
		if len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
	}
	return out
}

// grant is one turn as the ledger recorded it.
type grant struct {
	machine string
	reason  likenv1.TurnReason
	rv      int64
	at      time.Time
	spec    string // the Cluster's spec.version when the turn appeared
}

// grants lists every turn that appeared in the ledger after revision
// from, in order.
func (w *watcher) grants(from int64) []grant {
	var out []grant
	held := map[string]string{}
	for _, r := range w.clusterHistory(0) {
		now := map[string]string{}
		for _, t := range r.obj.Status.RebootTurns {
			key := t.GrantedAt.UTC().Format(time.RFC3339Nano)
			now[t.Machine] = key
			if held[t.Machine] != key && r.rv > from {
				out = append(out, grant{machine: t.Machine, reason: t.Reason, rv: r.rv, at: r.at, spec: r.obj.Spec.Version})
			}
		}
		held = now
	}
	return out
}

func grantNames(gs []grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.machine)
	}
	return out
}

// most is the largest number of turns held, and of machines Updating, at
// one revision after from.
func (w *watcher) most(from int64) (turns, updating int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.snaps {
		if s.rv > from {
			turns, updating = max(turns, len(s.turns)), max(updating, len(s.updating))
		}
	}
	return turns, updating
}

// summary describes what the watcher saw, for a failed test's log.
func (w *watcher) summary() string {
	w.mu.Lock()
	names := make([]string, 0, len(w.machines))
	for n := range w.machines {
		names = append(names, n)
	}
	problems, gaps := append([]string(nil), w.problems...), append([]string(nil), w.gaps...)
	w.mu.Unlock()
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "Cluster phases: %v\n", w.clusterPhases(0))
	fmt.Fprintf(&b, "grants: %v\n", grantNames(w.grants(0)))
	for _, n := range names {
		fmt.Fprintf(&b, "%s phases: %v\n", n, w.phases(n, 0))
	}
	fmt.Fprintf(&b, "problems: %v\ngaps: %v\n", problems, gaps)
	return b.String()
}

func parseRV(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func rvOf(obj runtime.Object) int64 {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return 0
	}
	return parseRV(acc.GetResourceVersion())
}
