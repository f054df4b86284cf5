// Package turns is the turn controller: it keeps each Cluster's turn
// ledger (status.rebootTurns), grants reboot turns under the disruption
// budget, takes them back, halts a rollout that stalled or whose trial
// failed, and in the same write keeps the Cluster's phase, columns and
// Ready condition.
package turns

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	policyinformers "k8s.io/client-go/informers/policy/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	"liken.sh/liken/controllers/promgate"
	likeninformers "liken.sh/liken/generated/informers/externalversions/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/clip"
	"liken.sh/liken/internal/lastwrite"
	"liken.sh/liken/internal/worker"
)

// FieldManager is the field manager of the turn controller's writes.
const FieldManager = "cluster-operator-turns"

// maxEventNote is the most bytes the API server keeps in an event's
// note.
const maxEventNote = 1024

// Event reasons of the turn controller.
const (
	// EventTurnGranted: a machine got a reboot turn.
	EventTurnGranted = "TurnGranted"
	// EventTurnFinished: a machine came back Ready from its turn.
	EventTurnFinished = "TurnFinished"
	// EventTurnTakenBack: a turn was taken back before the machine started.
	EventTurnTakenBack = "TurnTakenBack"
	// EventTurnReleased: a person resumed a stalled rollout and the stalled
	// turn was released.
	EventTurnReleased = "TurnReleased"
	// EventTrialSucceeded: a machine proved a new release.
	EventTrialSucceeded = "TrialSucceeded"
	// EventTrialFailed: a machine's trial boot failed; the rollout halts.
	EventTrialFailed = "TrialFailed"
	// EventK3sRestartFailed: a machine's restart of k3s was rolled back;
	// no other machine restarts k3s until the value changes.
	EventK3sRestartFailed = likenv1.ReasonK3sRestartFailed
	// EventRolloutStalled: a turn, or a machine's settling after its
	// turn, outlived the stall timeout; the rollout halts. On the
	// Cluster, as every halt (whose reason is the event's).
	EventRolloutStalled = likenv1.ReasonRolloutStalled
	// EventRolloutResumed: a halt was lifted.
	EventRolloutResumed = "RolloutResumed"
	// EventInvalidWindow: a maintenance window cannot be read (such as an
	// unknown time zone); nothing is granted until it is fixed.
	EventInvalidWindow = "InvalidWindow"
	// EventDrainWouldBlock: a machine that would have had a turn was
	// passed over, because PodDisruptionBudgets would block its drain now;
	// the note names the budgets and their pods.
	EventDrainWouldBlock = "DrainWouldBlock"
	// EventSettled: a machine back from its turn settled (its workloads
	// are healthy again and spec.disruption.settle passed), or a person's
	// resume stopped the wait; its place goes to the next machine.
	EventSettled = "Settled"
	// EventGateClosed: a machine that would have had a turn was passed
	// over, because a gate of spec.disruption.gates holds it; the note
	// names the gate and the pods.
	EventGateClosed = likenv1.ReasonGateClosed
	// EventRolloutHeld: the annotation liken.sh/hold stopped new turns (on
	// the Cluster, with its reason and who set it).
	EventRolloutHeld = likenv1.ReasonHeld
	// EventHoldLifted: the annotation liken.sh/hold was removed; turns are
	// granted again.
	EventHoldLifted = "HoldLifted"
	// EventCanaryPassed: the canary of a rollout ran the new release,
	// settled and healthy, for spec.disruption.canary's duration (or a
	// person resumed after it failed); the rest of the fleet follows. A
	// canary that fails halts the rollout: event CanaryFailed, as every
	// halt, on the Cluster.
	EventCanaryPassed = "CanaryPassed"
)

// StatusWriter is the one write the turn controller makes: an update of a
// Cluster's status (ledger and columns together) that carries the
// resourceVersion it read.
type StatusWriter interface {
	UpdateStatus(ctx context.Context, c *likenv1.Cluster, opts metav1.UpdateOptions) (*likenv1.Cluster, error)
}

// Liveness says whether a machine's heartbeat stopped (see
// liveness.Controller.Silent), and holds Lost verdicts back while a
// decision reads the machines (liveness.Controller.Hold).
type Liveness interface {
	Silent(name string, now time.Time) bool
	Hold() (release func())
}

// Config is what the turn controller needs.
type Config struct {
	Clusters likeninformers.ClusterInformer
	Machines likeninformers.MachineInformer
	Nodes    coreinformers.NodeInformer
	// Pods and Budgets feed the drain check. Pods is made by
	// NewPodInformer (New sets its transform, TrimPod, and its index all
	// the same): its cache holds turns.Pod, not *corev1.Pod, so nothing
	// else may read pods from it.
	Pods    cache.SharedIndexInformer
	Budgets policyinformers.PodDisruptionBudgetInformer
	// Copies, when set, watches cluster-operator's own Deployment
	// (namespace liken-system): a leader back from its turn is settled
	// only once as many copies are ready as it asks for. Unset (an
	// operator that does not run in the cluster), leaders wait for no
	// copies.
	Copies   appsinformers.DeploymentInformer
	Writer   StatusWriter
	Recorder events.EventRecorder
	Metrics  *metrics.Metrics
	Clock    clock.WithTicker
	// Term is this copy's leadership: its start plus StartupGrace is when
	// granting begins; its Fence is confirmed before every grant.
	Term         leadership.Term
	StartupGrace time.Duration
	// Liveness, when set, makes silent machines count as Lost before the
	// verdict is written.
	Liveness Liveness
	// Prometheus, when set, says which prometheus gates are shut
	// (controllers/promgate); unset, a Cluster with such a gate grants
	// nothing.
	Prometheus PrometheusGates
}

// PrometheusGates says which prometheus gates of a Cluster are shut now.
type PrometheusGates interface {
	Closed(*likenv1.Cluster) []promgate.Closed
}

// Controller is the turn controller.
type Controller struct {
	cfg      Config
	clusters likenlisters.ClusterLister
	machines cache.Indexer
	nodes    cache.Indexer
	pods     cache.Indexer
	budgets  cache.Indexer
	copies   appslisters.DeploymentLister
	roster   fleet.Roster
	queue    *worker.Queue
	synced   []cache.DoneChecker
	// written is, per cluster, this copy's last writes of its status.
	written lastwrite.Writes[*likenv1.Cluster]

	mu sync.Mutex
	// waitingSince is, per cluster and machine, when this copy first saw
	// the machine wait for a turn for its current change, for the grant
	// latency metric.
	waitingSince map[string]map[string]*wait
	// syncs counts the syncs, to tell which waits the last one saw.
	syncs uint64
	// events is, per cluster, when the first change since its last
	// decision arrived.
	events map[string]time.Time
	// lastWrite is, per cluster, when this copy's last status write was
	// answered.
	lastWrite map[string]time.Time
	// skipped is, per cluster and "<event reason>/<machine>", what the last
	// DrainWouldBlock or GateClosed event named, so that a machine passed
	// over sync after sync is reported once, and again only when what
	// blocks it changes.
	skipped map[string]map[string]string
}

// wait is a machine seen waiting for a turn for change since a time.
type wait struct {
	change string
	since  time.Time
	seen   uint64
}

// New wires the controller to its informers. Call before the informers
// start.
func New(cfg Config) (*Controller, error) {
	if err := fleet.AddIndexers(cfg.Machines.Informer()); err != nil {
		return nil, err
	}
	pods, budgets := cfg.Pods, cfg.Budgets.Informer()
	if err := pods.SetTransform(TrimPod); err != nil {
		return nil, fmt.Errorf("trimming the pods the drain check keeps: %w", err)
	}
	if err := budgets.SetTransform(TrimBudget); err != nil {
		return nil, fmt.Errorf("trimming the PodDisruptionBudgets the drain check keeps: %w", err)
	}
	if _, ok := pods.GetIndexer().GetIndexers()[ByNode]; !ok {
		if err := pods.AddIndexers(PodIndexers); err != nil {
			return nil, err
		}
	}
	c := &Controller{
		cfg:          cfg,
		clusters:     cfg.Clusters.Lister(),
		machines:     cfg.Machines.Informer().GetIndexer(),
		nodes:        cfg.Nodes.Informer().GetIndexer(),
		pods:         pods.GetIndexer(),
		budgets:      budgets.GetIndexer(),
		waitingSince: map[string]map[string]*wait{},
		skipped:      map[string]map[string]string{},
		events:       map[string]time.Time{},
		lastWrite:    map[string]time.Time{},
	}
	c.queue = worker.New("turns", cfg.Clock, c.sync)
	c.synced = []cache.DoneChecker{cfg.Clusters.Informer().HasSyncedChecker(), cfg.Machines.Informer().HasSyncedChecker(), cfg.Nodes.Informer().HasSyncedChecker(),
		pods.HasSyncedChecker(), budgets.HasSyncedChecker()}
	if cfg.Copies != nil {
		c.copies = cfg.Copies.Lister()
		c.synced = append(c.synced, cfg.Copies.Informer().HasSyncedChecker())
	}

	enqueueCluster := func(obj any) {
		if k, ok := worker.KeyOf(obj); ok {
			c.add(k)
		}
	}
	enqueueMachine := func(obj any) {
		if k, ok := fleet.ClusterOfMachine(obj); ok {
			c.add(k)
		}
	}
	enqueueNode := func(obj any) {
		name, ok := worker.KeyOf(obj)
		if !ok {
			return
		}
		if o, exists, _ := c.machines.GetByKey(name); exists {
			enqueueMachine(o)
			return
		}
		// A machine whose Machine was deleted may still hold a turn until
		// its Node is back or gone.
		clusters, err := c.clusters.List(labels.Everything())
		if err != nil {
			return
		}
		for _, cl := range clusters {
			if slices.ContainsFunc(cl.Status.RebootTurns, func(t likenv1.RebootTurn) bool { return t.Machine == name }) {
				c.add(cl.Name)
			}
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{
		{cfg.Clusters.Informer(), enqueueCluster},
		{cfg.Machines.Informer(), enqueueMachine},
		{cfg.Nodes.Informer(), enqueueNode},
	}
	// A pod matters to the cluster of the machine it runs on; a change of
	// its status alone (most changes) does not.
	enqueuePod := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*Pod); ok && p.NodeName() != "" {
			if o, exists, _ := c.machines.GetByKey(p.NodeName()); exists {
				enqueueMachine(o)
			}
		}
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueuePod,
		UpdateFunc: func(o, n any) {
			op, ok1 := o.(*Pod)
			np, ok2 := n.(*Pod)
			if ok1 && ok2 && samePod(op, np) {
				return
			}
			enqueuePod(o)
			enqueuePod(n)
		},
		DeleteFunc: enqueuePod,
	}); err != nil {
		return nil, err
	}
	// A budget may cover pods of any cluster's machines.
	enqueueAll := func(any) {
		for _, key := range c.cfg.Clusters.Informer().GetStore().ListKeys() {
			c.add(key)
		}
	}
	if _, err := budgets.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueAll,
		UpdateFunc: func(o, n any) {
			ob, ok1 := o.(*policyv1.PodDisruptionBudget)
			nb, ok2 := n.(*policyv1.PodDisruptionBudget)
			if ok1 && ok2 && ob.Status.DisruptionsAllowed == nb.Status.DisruptionsAllowed && equality.Semantic.DeepEqual(ob.Spec.Selector, nb.Spec.Selector) &&
				(!c.settlesOn(nb) || ob.Status.CurrentHealthy == nb.Status.CurrentHealthy && ob.Status.ExpectedPods == nb.Status.ExpectedPods && ob.Status.ObservedGeneration == nb.Status.ObservedGeneration) {
				return
			}
			enqueueAll(n)
		},
		DeleteFunc: enqueueAll,
	}); err != nil {
		return nil, err
	}
	if cfg.Copies != nil {
		// How many copies the Deployment asks for is what a settling leader
		// waits for.
		if _, err := cfg.Copies.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: enqueueAll,
			UpdateFunc: func(o, n any) {
				od, ok1 := o.(*appsv1.Deployment)
				nd, ok2 := n.(*appsv1.Deployment)
				if ok1 && ok2 && wantedCopies(od) == wantedCopies(nd) {
					return
				}
				enqueueAll(n)
			},
			DeleteFunc: enqueueAll,
		}); err != nil {
			return nil, err
		}
	}
	for _, h := range handlers {
		fn := h.fn
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, n any) { fn(n) },
			DeleteFunc: fn,
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// settlesOn tells whether a machine of some cluster waits for budget b to
// settle (its turn or its settling entry names b): only then does a change
// of b's health bring a decision.
func (c *Controller) settlesOn(b *policyv1.PodDisruptionBudget) bool {
	key := b.Namespace + "/" + b.Name
	for _, o := range c.cfg.Clusters.Informer().GetStore().List() {
		cl, ok := o.(*likenv1.Cluster)
		if !ok {
			continue
		}
		for _, t := range cl.Status.RebootTurns {
			if slices.Contains(t.Budgets, key) {
				return true
			}
		}
		for _, s := range cl.Status.Settling {
			if slices.Contains(s.Budgets, key) {
				return true
			}
		}
	}
	return false
}

// MachineChanged asks for a decision on the cluster of the named machine,
// for a change the turn controller's informers do not show (the liveness
// controller saw a silent machine's Node Lease renewed again).
func (c *Controller) MachineChanged(name string) {
	if o, exists, _ := c.machines.GetByKey(name); exists {
		if k, ok := fleet.ClusterOfMachine(o); ok {
			c.add(k)
		}
	}
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return c.queue.Run(ctx, workers, c.synced...)
}

// observe reads the cluster's machines, their Nodes and which machines are
// silent, as of one moment: Lost verdicts wait while it reads (see
// Liveness.Hold), so no machine it reads alive is being written Lost.
func (c *Controller) observe(cluster *likenv1.Cluster) (machines []*likenv1.Machine, nodes map[string]Node, silent map[string]bool, now time.Time, err error) {
	if c.cfg.Liveness != nil {
		defer c.cfg.Liveness.Hold()()
	}
	machines, err = c.roster.MachinesOf(c.machines, cluster.Name)
	if err != nil {
		return nil, nil, nil, time.Time{}, err
	}
	// The Nodes of the machines, and of those holding a turn whose Machine
	// was deleted. Only machines that have a Node get an entry (no entry:
	// no Node).
	names := make([]string, 0, len(machines)+len(cluster.Status.RebootTurns))
	for _, m := range machines {
		names = append(names, m.Name)
	}
	for _, t := range cluster.Status.RebootTurns {
		if !slices.Contains(names, t.Machine) {
			names = append(names, t.Machine)
		}
	}
	for _, name := range names {
		obj, exists, err := c.nodes.GetByKey(name)
		if err != nil {
			return nil, nil, nil, time.Time{}, fmt.Errorf("reading the Node of machine %s: %w", name, err)
		}
		n, ok := obj.(*corev1.Node)
		if !exists || !ok {
			continue
		}
		if nodes == nil {
			nodes = make(map[string]Node, len(names))
		}
		nodes[name] = Node{State: fleet.StateOf(n), CordonedByLiken: fleet.CordonedByLiken(n), Heartbeat: fleet.ReadyHeartbeat(n), BootID: n.Status.NodeInfo.BootID}
	}
	now = c.cfg.Clock.Now()
	if c.cfg.Liveness != nil {
		for _, m := range machines {
			if c.cfg.Liveness.Silent(m.Name, now) {
				if silent == nil {
					silent = map[string]bool{}
				}
				silent[m.Name] = true
			}
		}
	}
	return machines, nodes, silent, now, nil
}

func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	tr := grantTrace{event: c.takeEvent(key), start: c.cfg.Clock.Now()}
	cluster, err := c.clusters.Get(key)
	if apierrors.IsNotFound(err) {
		c.cfg.Metrics.Machines.DeletePartialMatch(map[string]string{"cluster": key})
		c.roster.Forget(key)
		c.forgetWaiting(key)
		c.mu.Lock()
		delete(c.skipped, key)
		delete(c.lastWrite, key)
		c.mu.Unlock()
		c.written.Forget(key)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// Decide from this copy's own last write until the cache shows it:
	// deciding from the version it replaced would only earn a conflict, a
	// backoff and a second decision. After a failed write the last one
	// that succeeded still counts, until the cache moves past it.
	cluster = c.written.Latest(key, cluster)
	if cluster.Status.Term != c.cfg.Term.Token {
		if cluster, err = c.startTerm(ctx, key, cluster); err != nil {
			return 0, err
		}
	}
	machines, nodes, silent, now, err := c.observe(cluster)
	if err != nil {
		return 0, err
	}
	countPhases(c.cfg.Metrics, cluster.Name, machines)
	drains, allowed, err := c.drains(cluster, machines)
	if err != nil {
		return 0, err
	}
	unsettled, err := c.unsettled(cluster, nodes)
	if err != nil {
		return 0, err
	}
	shut := c.shutGates(cluster)
	gates, gateErr := blockingSelectors(cluster)
	blocked, err := c.blocked(machines, gates)
	if err != nil {
		return 0, err
	}
	tr.read = c.cfg.Clock.Now()
	d := Decide(Input{
		Cluster:            cluster,
		Machines:           machines,
		Nodes:              nodes,
		Silent:             silent,
		Now:                now,
		GrantFrom:          c.cfg.Term.Since.Add(c.cfg.StartupGrace),
		Identity:           c.cfg.Term.Identity,
		Drains:             drains,
		DisruptionsAllowed: allowed,
		Unsettled:          unsettled,
		Blocked:            blocked,
		GateErr:            gateErr,
		Shut:               shut,
	})
	tr.decided = c.cfg.Clock.Now()
	c.trackWaiting(cluster.Name, d.Waiting, now)
	c.reportPassedOver(ctx, cluster, machines, d.Skipped, d.Gated)

	// The decision changed the ledger, the halt, the resume record or the
	// Progressing condition; the columns come on top, in the same write.
	decided := !equality.Semantic.DeepEqual(cluster.Status, d.Status)
	Columns(&d.Status, cluster, machines, now)
	tr.columns = c.cfg.Clock.Now()
	if !decided && equality.Semantic.DeepEqual(cluster.Status, d.Status) {
		c.showHalt(cluster.Name, d.Status.Halt)
		return d.RequeueAfter, nil
	}
	if !decided {
		// Only the columns moved: they wait until ColumnsEvery after the
		// Cluster's last write, so that a decision never queues behind a
		// write of counts.
		if wait := c.columnsWait(key, tr.columns); wait > 0 {
			c.showHalt(cluster.Name, d.Status.Halt)
			return soonest(d.RequeueAfter, wait), nil
		}
	}
	what := "updating the columns of cluster " + cluster.Name
	if decided {
		// A paused copy must not act on what it saw: confirm the lease before
		// a ledger write, not a columns-only one (docs/design/protocol.md#cluster-operator-grants-a-turn).
		what = "updating the turn ledger of cluster " + cluster.Name
		if len(d.Granted) > 0 {
			what = fmt.Sprintf("granting turns to %s in cluster %s", fleet.TurnsString(d.Granted), cluster.Name)
		}
		if err := c.cfg.Term.Fence.Confirm(ctx, what); err != nil {
			return 0, fmt.Errorf("not %s: %w", what, err)
		}
	}
	tr.fenced = c.cfg.Clock.Now()
	updated := cluster.DeepCopy()
	updated.Status = d.Status
	// The write carries the resourceVersion read with the cluster: if the
	// Cluster changed since, the API server refuses it and the key is
	// synced again from the newer version.
	out, err := c.cfg.Writer.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	c.written.Wrote(key, cluster.ResourceVersion, out)
	c.mu.Lock()
	c.lastWrite[key] = c.cfg.Clock.Now()
	c.mu.Unlock()
	if len(d.Granted) > 0 {
		tr.written = c.cfg.Clock.Now()
		tr.log(klog.FromContext(ctx), cluster, d.Granted)
	}
	if cluster.Status.Phase != d.Status.Phase {
		klog.FromContext(ctx).Info("Cluster phase changed", "cluster", klog.KObj(cluster), "from", cluster.Status.Phase, "to", d.Status.Phase, "machines", d.Status.Machines)
	}
	c.showHalt(cluster.Name, d.Status.Halt)
	c.report(ctx, cluster, machines, d, now)
	return d.RequeueAfter, nil
}

// startTerm writes this copy's term in the cluster's status, alone, before
// its first decision for it: a copy that led before and was paused after it
// read the cluster (even after it confirmed the lease) then writes with an
// older resourceVersion, and its write conflicts instead of adding a turn
// decided on what it saw before (docs/design/protocol.md#leader-election).
// It returns the cluster as written.
func (c *Controller) startTerm(ctx context.Context, key string, cluster *likenv1.Cluster) (*likenv1.Cluster, error) {
	what := fmt.Sprintf("recording leadership term %s in cluster %s", c.cfg.Term.Token, cluster.Name)
	if err := c.cfg.Term.Fence.Confirm(ctx, what); err != nil {
		return nil, fmt.Errorf("not %s: %w", what, err)
	}
	updated := cluster.DeepCopy()
	updated.Status.Term = c.cfg.Term.Token
	out, err := c.cfg.Writer.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	c.written.Wrote(key, cluster.ResourceVersion, out)
	klog.FromContext(ctx).Info("Recorded this copy's leadership term", "cluster", klog.KObj(cluster), "term", c.cfg.Term.Token, "previous", cluster.Status.Term)
	return out, nil
}

// drains reads, for the machines of cluster that hold a turn or may ask
// for one, what their drains would take from the PodDisruptionBudgets
// now, and what the budgets concerned allow.
func (c *Controller) drains(cluster *likenv1.Cluster, machines []*likenv1.Machine) (map[string]Drain, map[string]int32, error) {
	r := budgetsReader{pods: c.pods, budgets: c.budgets, byNamespace: map[string][]budgetSelector{}, allowed: map[string]int32{}}
	var out map[string]Drain
	for _, m := range machines {
		if !asks(m) && fleet.FindTurn(cluster.Status.RebootTurns, m.Name) == nil {
			continue
		}
		d, err := r.drainOf(m.Name)
		if err != nil {
			return nil, nil, err
		}
		if len(d.Needs) == 0 {
			continue
		}
		if out == nil {
			out = map[string]Drain{}
		}
		out[m.Name] = d
	}
	return out, r.allowed, nil
}

// unsettled reads, for the machines of cluster that hold a turn or settle
// after one, what their workloads still lack before they are settled. A
// machine rebooted in its turn unless it was a Live or RestartK3s turn; a
// simulated machine's Node reports no boot ID, and its pods do not
// restart.
func (c *Controller) unsettled(cluster *likenv1.Cluster, nodes map[string]Node) (map[string][]string, error) {
	r := budgetsReader{pods: c.pods, budgets: c.budgets}
	copies := ""
	if slices.ContainsFunc(cluster.Status.RebootTurns, func(t likenv1.RebootTurn) bool { return t.Leader }) ||
		slices.ContainsFunc(cluster.Status.Settling, func(s likenv1.SettlingMachine) bool { return s.Leader }) {
		var err error
		if copies, err = c.copiesWait(&r); err != nil {
			return nil, err
		}
	}
	var out map[string][]string
	add := func(machine string, reason likenv1.TurnReason, leader bool, budgets []string, grantedAt metav1.Time) error {
		rebooted := !reason.InPlace() && nodes[machine].BootID != ""
		waits, err := r.unsettled(machine, budgets, grantedAt.Time, rebooted)
		if err != nil {
			return err
		}
		if leader && copies != "" {
			waits = append(waits, copies)
		}
		if len(waits) == 0 {
			return nil
		}
		if out == nil {
			out = map[string][]string{}
		}
		out[machine] = waits
		return nil
	}
	for _, t := range cluster.Status.RebootTurns {
		if err := add(t.Machine, t.Reason, t.Leader, t.Budgets, t.GrantedAt); err != nil {
			return nil, err
		}
	}
	for _, s := range cluster.Status.Settling {
		if err := add(s.Machine, s.Reason, s.Leader, s.Budgets, s.GrantedAt); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// copiesWait is what a leader back from its turn waits for while
// cluster-operator lacks ready copies: "" when it lacks none, or when no
// Deployment of it is watched or exists.
func (c *Controller) copiesWait(r *budgetsReader) (string, error) {
	if c.copies == nil {
		return "", nil
	}
	d, err := c.copies.Deployments(likenv1.SystemNamespace).Get(likenv1.OperatorDeploymentName)
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading cluster-operator's Deployment: %w", err)
	}
	return r.copiesWait(wantedCopies(d))
}

// wantedCopies is how many pods Deployment d asks for.
func wantedCopies(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// shutGates are the prometheus gates of cluster that are shut now.
func (c *Controller) shutGates(cluster *likenv1.Cluster) []promgate.Closed {
	if c.cfg.Prometheus != nil {
		return c.cfg.Prometheus.Closed(cluster)
	}
	var out []promgate.Closed
	for i, g := range cluster.Spec.Disruption.Gates {
		if g.Prometheus != nil {
			out = append(out, promgate.Closed{Gate: i, Why: "this cluster-operator reads no Prometheus server"})
		}
	}
	return out
}

// ClusterChanged asks for a decision on the named cluster, for a change
// the turn controller's informers do not show (a prometheus gate opened or
// shut).
func (c *Controller) ClusterChanged(name string) { c.add(name) }

// ColumnsEvery is how long after a Cluster's last status write a write
// that changes only its columns (phase, counts, the Ready condition)
// waits: at most one such write a second, and a grant's sync finds no
// write of counts in flight before it (docs/design/protocol.md).
const ColumnsEvery = time.Second

// columnsWait is how long a write of the cluster's columns alone must
// still wait at now.
func (c *Controller) columnsWait(key string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	last, ok := c.lastWrite[key]
	if !ok {
		return 0
	}
	return last.Add(ColumnsEvery).Sub(now)
}

// soonest is the sooner of a requeue (0: none) and a wait.
func soonest(requeue, wait time.Duration) time.Duration {
	if requeue > 0 && requeue < wait {
		return requeue
	}
	return wait
}

// add queues a decision on a cluster, noting when the first change since
// its last decision arrived (the grant trace's "event").
func (c *Controller) add(key string) {
	c.mu.Lock()
	if _, ok := c.events[key]; !ok {
		c.events[key] = c.cfg.Clock.Now()
	}
	c.mu.Unlock()
	c.queue.Add(key)
}

// takeEvent is when the first change since the cluster's last decision
// arrived; zero for a sync nothing asked for (a requeue, a retry).
func (c *Controller) takeEvent(key string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.events[key]
	delete(c.events, key)
	return t
}

// asks tells whether machine m may ask for a turn: it staged a change.
func asks(m *likenv1.Machine) bool {
	return m.Status.Change != "" && (m.Status.Phase == likenv1.MachineUpdatePending || m.Status.Phase == likenv1.MachineRebootPending)
}

// blocked reads, for the machines that may ask for a turn, the pods on
// them the blockingPods gates match.
func (c *Controller) blocked(machines []*likenv1.Machine, gates []gateSelector) (map[string]Blocked, error) {
	if len(gates) == 0 {
		return nil, nil
	}
	r := budgetsReader{pods: c.pods}
	var out map[string]Blocked
	for _, m := range machines {
		if !asks(m) {
			continue
		}
		b, ok, err := r.blockedOn(m.Name, gates)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if out == nil {
			out = map[string]Blocked{}
		}
		out[m.Name] = b
	}
	return out, nil
}

// reportPassedOver logs and records an event on the Machine for each
// machine passed over because its drain would be blocked
// (DrainWouldBlock) or a gate holds it (GateClosed), when it is first
// passed over or what holds it changed.
func (c *Controller) reportPassedOver(ctx context.Context, cluster *likenv1.Cluster, machines []*likenv1.Machine, skipped []Skip, gated []Gated) {
	type item struct{ machine, reason, key, note string }
	items := make([]item, 0, len(skipped)+len(gated))
	for _, s := range skipped {
		items = append(items, item{s.Machine, EventDrainWouldBlock, s.Budgets, s.Message()})
	}
	for _, g := range gated {
		items = append(items, item{g.Machine, EventGateClosed, g.key(), g.Message()})
	}
	c.mu.Lock()
	last := c.skipped[cluster.Name]
	now := make(map[string]string, len(items))
	var report []item
	for _, it := range items {
		k := it.reason + "/" + it.machine
		now[k] = it.key
		if last[k] != it.key {
			report = append(report, it)
		}
	}
	if len(now) == 0 {
		delete(c.skipped, cluster.Name)
	} else {
		c.skipped[cluster.Name] = now
	}
	c.mu.Unlock()
	for _, it := range report {
		klog.FromContext(ctx).Info("Passed over a machine", "cluster", klog.KObj(cluster), "machine", it.machine, "reason", it.reason, "what", it.key)
		machineEvent(c.cfg.Recorder, cluster, machines, it.machine, corev1.EventTypeWarning, it.reason, "Grant", it.note)
	}
}

// machineEvent records an event about machine's own turn on its Machine,
// related to cluster, or on cluster when the Machine is gone: one event
// per occurrence (rollout-level events go on the Cluster only). The note
// is clipped to what the API server keeps.
func machineEvent(rec events.EventRecorder, cluster *likenv1.Cluster, machines []*likenv1.Machine, machine, eventType, reason, action, note string) {
	note = clip.To(note, maxEventNote)
	if m := findMachine(machines, machine); m != nil {
		rec.Eventf(m, cluster, eventType, reason, action, "%s", note)
		return
	}
	rec.Eventf(cluster, nil, eventType, reason, action, "%s", note)
}

// showHalt sets the rollout-halted metric from the halt the API server
// holds, at every sync: a copy that has just become the leader reports a
// halt that an earlier copy wrote.
func (c *Controller) showHalt(cluster string, halt *likenv1.RolloutHalt) {
	for _, reason := range []string{likenv1.ReasonRolloutStalled, likenv1.ReasonTrialFailed, likenv1.ReasonK3sRestartFailed} {
		v := 0.0
		if halt != nil && halt.Reason == reason {
			v = 1
		}
		c.cfg.Metrics.RolloutHalted.WithLabelValues(cluster, reason).Set(v)
	}
}

// trackWaiting remembers when each waiting machine was first seen waiting
// for its current change, and forgets the machines no longer waiting.
func (c *Controller) trackWaiting(cluster string, waiting []*likenv1.Machine, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.syncs++
	byMachine := c.waitingSince[cluster]
	if byMachine == nil {
		if len(waiting) == 0 {
			return
		}
		byMachine = make(map[string]*wait, len(waiting))
		c.waitingSince[cluster] = byMachine
	}
	for _, m := range waiting {
		w := byMachine[m.Name]
		switch {
		case w == nil:
			byMachine[m.Name] = &wait{change: m.Status.Change, since: now, seen: c.syncs}
		case w.change != m.Status.Change:
			*w = wait{change: m.Status.Change, since: now, seen: c.syncs}
		default:
			w.seen = c.syncs
		}
	}
	for name, w := range byMachine {
		if w.seen != c.syncs {
			delete(byMachine, name)
		}
	}
}

// forgetWaiting drops the waits of a deleted cluster.
func (c *Controller) forgetWaiting(cluster string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.waitingSince, cluster)
}

// grantLatency is how long the machine of turn t waited, as far as this
// copy saw, and forgets the wait; ok is false when it did not see it.
func (c *Controller) grantLatency(cluster string, t likenv1.RebootTurn, now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waitingSince[cluster][t.Machine]
	if w == nil || w.change != t.Change {
		return 0, false
	}
	delete(c.waitingSince[cluster], t.Machine)
	return now.Sub(w.since), true
}

// report logs, records events and metrics for a decision that was
// written.
func (c *Controller) report(ctx context.Context, cluster *likenv1.Cluster, machines []*likenv1.Machine, d Decision, now time.Time) {
	logger := klog.FromContext(ctx)
	rec := c.cfg.Recorder
	// event records an event of machine's own turn on its Machine, related
	// to the Cluster, or on the Cluster when the Machine is gone: one
	// event per occurrence. The note is clipped to what the API server
	// keeps.
	event := func(machine, eventType, reason, action, note string) {
		machineEvent(rec, cluster, machines, machine, eventType, reason, action, note)
	}
	for _, e := range d.Ended {
		c.cfg.Metrics.TurnsEnded.WithLabelValues(cluster.Name, string(e.Result)).Inc()
		logger.Info("Turn ended", "cluster", klog.KObj(cluster), "machine", e.Turn.Machine, "result", e.Result, "message", e.Message)
		switch e.Result {
		case ResultFinished:
			event(e.Turn.Machine, corev1.EventTypeNormal, EventTurnFinished, "EndTurn", e.Message)
			if e.Proved != "" {
				event(e.Turn.Machine, corev1.EventTypeNormal, EventTrialSucceeded, "Trial", fmt.Sprintf(
					"Machine %s proved release %s", e.Turn.Machine, e.Proved))
			}
		case ResultTrialFailed:
			event(e.Turn.Machine, corev1.EventTypeWarning, EventTrialFailed, "Trial", e.Message)
		case ResultTakenBack:
			event(e.Turn.Machine, corev1.EventTypeNormal, EventTurnTakenBack, "TakeBack", e.Message)
		case ResultReleased:
			event(e.Turn.Machine, corev1.EventTypeNormal, EventTurnReleased, "Release", e.Message)
		case ResultK3sRestartFailed:
			event(e.Turn.Machine, corev1.EventTypeWarning, EventK3sRestartFailed, "EndTurn", e.Message)
		}
	}
	for _, s := range d.Settled {
		logger.Info("Machine settled", "cluster", klog.KObj(cluster), "machine", s.Machine, "after", s.After, "released", s.Released)
		note := fmt.Sprintf("Machine %s settled %s after it came back from its turn: its workloads are healthy again, and its place under maxUnavailable goes to the next machine", s.Machine, s.After.Round(time.Second))
		if s.Released {
			note = fmt.Sprintf("Stopped waiting for machine %s to settle, %s after it came back from its turn: a person resumed the rollout", s.Machine, s.After.Round(time.Second))
		}
		event(s.Machine, corev1.EventTypeNormal, EventSettled, "Settle", note)
	}
	if d.Lifted != nil {
		note := fmt.Sprintf("Lifted the %s halt (machine %s): %s", d.Lifted.Reason, d.Lifted.Machine, d.LiftedBecause)
		logger.Info("Rollout resumed", "cluster", klog.KObj(cluster), "reason", d.Lifted.Reason, "because", d.LiftedBecause)
		rec.Eventf(cluster, nil, corev1.EventTypeNormal, EventRolloutResumed, "Resume", "%s", note)
	}
	if d.Halted != nil {
		// A rollout-level event, on the Cluster only; the machine's own
		// turn event (a failed trial or restart) is on its Machine.
		logger.Info("Rollout halted", "cluster", klog.KObj(cluster), "reason", d.Halted.Reason, "machine", d.Halted.Machine)
		rec.Eventf(cluster, nil, corev1.EventTypeWarning, d.Halted.Reason, "Halt", "%s",
			clip.To(fmt.Sprintf("Halted the rollout (%s, machine %s): %s", d.Halted.Reason, d.Halted.Machine, d.Halted.Message), maxEventNote))
	}
	if cp := d.CanaryPassed; cp != nil {
		logger.Info("Canary passed", "cluster", klog.KObj(cluster), "machine", cp.Machine, "version", cp.Version)
		rec.Eventf(cluster, nil, corev1.EventTypeNormal, EventCanaryPassed, "Canary", "The canary %s passed on release %s: the other machines follow", cp.Machine, cp.Version)
	}
	was := meta.FindStatusCondition(cluster.Status.Conditions, likenv1.ConditionProgressing)
	// A prometheus gate is rollout-level too: an event on the Cluster each
	// time what shuts the gates changes.
	if p := meta.FindStatusCondition(d.Status.Conditions, likenv1.ConditionProgressing); p != nil && p.Reason == likenv1.ReasonGateClosed && len(d.Shut) > 0 &&
		(was == nil || was.Reason != p.Reason || was.Message != p.Message) {
		logger.Info("A gate holds the rollout", "cluster", klog.KObj(cluster), "message", p.Message)
		rec.Eventf(cluster, nil, corev1.EventTypeWarning, EventGateClosed, "Grant", "%s", clip.To(p.Message, maxEventNote))
	}
	// A hold is a rollout-level event, on the Cluster: once when it stops
	// the turns, once when it is lifted.
	if p := meta.FindStatusCondition(d.Status.Conditions, likenv1.ConditionProgressing); p != nil && p.Reason == likenv1.ReasonHeld && (was == nil || was.Reason != likenv1.ReasonHeld) {
		logger.Info("Rollout held", "cluster", klog.KObj(cluster), "reason", cluster.Annotations[likenv1.AnnotationHold])
		rec.Eventf(cluster, nil, corev1.EventTypeNormal, EventRolloutHeld, "Hold", "%s", clip.To(p.Message, maxEventNote))
	}
	if was != nil && was.Reason == likenv1.ReasonHeld && cluster.Annotations[likenv1.AnnotationHold] == "" {
		logger.Info("Rollout hold lifted", "cluster", klog.KObj(cluster))
		rec.Eventf(cluster, nil, corev1.EventTypeNormal, EventHoldLifted, "Hold", "The annotation %s was removed: turns are granted again", likenv1.AnnotationHold)
	}
	if p := meta.FindStatusCondition(d.Status.Conditions, likenv1.ConditionProgressing); p != nil && p.Reason == likenv1.ReasonInvalidWindow {
		if was := meta.FindStatusCondition(cluster.Status.Conditions, likenv1.ConditionProgressing); was == nil || was.Reason != p.Reason || was.Message != p.Message {
			logger.Info("Maintenance windows cannot be read; granting nothing", "cluster", klog.KObj(cluster), "message", p.Message)
			rec.Eventf(cluster, nil, corev1.EventTypeWarning, EventInvalidWindow, "Grant", "%s", clip.To(p.Message, maxEventNote))
		}
	}
	for _, t := range d.Granted {
		c.cfg.Metrics.TurnsGranted.WithLabelValues(cluster.Name, string(t.Reason)).Inc()
		if waited, ok := c.grantLatency(cluster.Name, t, now); ok {
			c.cfg.Metrics.GrantLatency.WithLabelValues(cluster.Name).Observe(waited.Seconds())
		}
		logger.Info("Granted a turn", "cluster", klog.KObj(cluster), "machine", t.Machine, "reason", t.Reason, "change", t.Change, "leader", t.Leader)
		event(t.Machine, corev1.EventTypeNormal, EventTurnGranted, "Grant", fmt.Sprintf(
			"Granted a %s turn to machine %s for change %s", t.Reason, t.Machine, t.Change))
	}
}
