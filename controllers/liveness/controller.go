// Package liveness writes a Machine Lost when its Node's Lease in kube-node-lease stopped, judged on cluster-operator's own clock.
package liveness

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	likeninformers "liken.sh/liken/generated/informers/externalversions/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/worker"
)

// FieldManager is the field manager of the liveness controller's writes.
const FieldManager = "cluster-operator-liveness"

// DefaultLostAfter is how long a machine's Node Lease may go without a
// renewal seen by cluster-operator before the machine reads Lost.
const DefaultLostAfter = 40 * time.Second

// EventMachineLost is the event reason when a machine is written Lost.
const EventMachineLost = "MachineLost"

// LeaseNamespace holds the Node Leases the kubelets renew: a machine's
// heartbeat is the Lease named after its Node there.
const LeaseNamespace = corev1.NamespaceNodeLease

// StatusWriter is the one write the liveness controller makes.
type StatusWriter interface {
	UpdateStatus(ctx context.Context, m *likenv1.Machine, opts metav1.UpdateOptions) (*likenv1.Machine, error)
}

// Config is what the liveness controller needs.
type Config struct {
	Machines likeninformers.MachineInformer
	Clusters likeninformers.ClusterInformer
	// Leases must watch the namespace kube-node-lease (LeaseNamespace),
	// where the kubelet renews its Node's Lease.
	Leases coordinationinformers.LeaseInformer
	// LeaseReader reads a Lease from the API server before a Lost verdict,
	// so a renewal the informer has not delivered yet is not missed.
	LeaseReader coordinationv1client.LeasesGetter
	// Recovered, when set, is called with a machine's name when its Lease
	// is renewed after it had been silent for LostAfter, so the turn
	// decision counts it alive again at once.
	Recovered func(machine string)
	Writer    StatusWriter
	Recorder  events.EventRecorder
	Metrics   *metrics.Metrics
	Clock     clock.WithTicker
	// Term.Since is when observation started: a machine with no Lease is
	// judged from then (or from when its Machine appeared, if later).
	Term      leadership.Term
	LostAfter time.Duration
}

// Controller is the liveness controller.
type Controller struct {
	cfg      Config
	machines likenlisters.MachineLister
	clusters likenlisters.ClusterLister
	queue    *worker.Queue
	synced   []cache.DoneChecker

	// verdicts keeps Lost verdicts (write lock) and turn decisions (read
	// lock, Hold) from interleaving (docs/design/protocol.md#liveness).
	verdicts sync.RWMutex

	mu sync.Mutex
	// pending holds, per machine whose Lost verdict is being made or was
	// written, the resourceVersion of the Machine it overwrites: until the
	// informer delivers a newer Machine, the cache may still show it alive,
	// so Silent says it is down.
	pending map[string]string
	// judged holds, per machine written Lost, the renewal its Lease showed
	// then: one verdict per silence (docs/design/protocol.md#liveness).
	judged map[string]string
	// seen is, per machine, the last time (on this copy's clock) its Lease
	// changed, or it was first observed.
	seen map[string]time.Time
	// value is the last observed renewal of each machine's Lease.
	value map[string]string
	// listed names the machines whose Lease this copy has seen only as the
	// first list showed it, never renewed since: when it was last renewed
	// is unknown.
	listed map[string]bool
}

// New wires the controller to its informers. Call before they start.
func New(cfg Config) (*Controller, error) {
	c := &Controller{
		cfg:      cfg,
		machines: cfg.Machines.Lister(),
		clusters: cfg.Clusters.Lister(),
		seen:     map[string]time.Time{},
		value:    map[string]string{},
		listed:   map[string]bool{},
		pending:  map[string]string{},
		judged:   map[string]string{},
	}
	c.queue = worker.New("liveness", cfg.Clock, c.sync)
	leases, err := cfg.Leases.Informer().AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    c.observeLease,
		UpdateFunc: func(_, n any) { c.observeLease(n, false) },
		DeleteFunc: func(obj any) {
			if k, ok := worker.KeyOf(obj); ok {
				c.queue.Add(nameOf(k))
			}
		},
	})
	if err != nil {
		return nil, err
	}
	machines, err := cfg.Machines.Informer().AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    c.observeMachine,
		UpdateFunc: func(_, n any) { c.observeMachine(n, false) },
		DeleteFunc: func(obj any) {
			if k, ok := worker.KeyOf(obj); ok {
				c.queue.Add(k)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// The syncs read what the handlers saw of the first lists (when each
	// Lease was first seen): they wait for the handlers, not only the
	// caches.
	c.synced = []cache.DoneChecker{machines.HasSyncedChecker(), cfg.Clusters.Informer().HasSyncedChecker(), leases.HasSyncedChecker()}
	return c, nil
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return c.queue.Run(ctx, workers, c.synced...)
}

// LastSeen is when this copy last saw the machine's Node Lease change (or
// first saw it).
func (c *Controller) LastSeen(name string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.seen[name]
	return t, ok
}

// Silent is true when the machine's Node Lease has not been seen renewed
// for the lost-after duration, even before Lost is written, so that a grant
// never races the verdict; it errs towards true (docs/design/protocol.md#liveness).
func (c *Controller) Silent(name string, now time.Time) bool {
	if !c.cfg.Leases.Informer().HasSynced() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.silentLocked(name, now)
}

// Hold blocks Lost verdicts until the returned release is called. The turn
// decision holds it while it reads the machines and asks Silent, so that
// each machine it reads alive is not being written Lost at that moment.
func (c *Controller) Hold() (release func()) {
	c.verdicts.RLock()
	return c.verdicts.RUnlock
}

func (c *Controller) silentLocked(name string, now time.Time) bool {
	if _, ok := c.pending[name]; ok {
		return true
	}
	seen, ok := c.seen[name]
	if !ok || c.listed[name] || seen.Before(c.cfg.Term.Since) {
		seen = c.cfg.Term.Since
	}
	return !now.Before(seen.Add(c.cfg.LostAfter))
}

func nameOf(key string) string {
	_, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return key
	}
	return name
}

// renewal identifies one renewal of a Lease.
func renewal(l *coordinationv1.Lease) string {
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		return holder + "@" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	return holder + "#" + l.ResourceVersion
}

// observeLease notes a Lease. A Lease in the first list was renewed at
// some unknown time before this copy looked; the verdict counts it as seen
// when the list arrived (a list that arrives late must not make every
// machine Lost), and Silent as seen when leading started.
func (c *Controller) observeLease(obj any, initial bool) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	old, had := c.value[l.Name]
	value := renewal(l)
	if had && old == value {
		c.mu.Unlock()
		return
	}
	wasSilent := !initial && c.silentLocked(l.Name, now)
	c.value[l.Name] = value
	c.seen[l.Name] = now
	if initial {
		c.listed[l.Name] = true
	} else {
		delete(c.listed, l.Name)
	}
	c.mu.Unlock()
	c.queue.Add(l.Name)
	if wasSilent && c.cfg.Recovered != nil {
		c.cfg.Recovered(l.Name)
	}
}

func (c *Controller) observedAt(initial bool) time.Time {
	if initial {
		return c.cfg.Term.Since
	}
	return c.cfg.Clock.Now()
}

// record notes a renewal read now; it returns true when it is a new one.
func (c *Controller) record(name, value string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.value[name]; ok && old == value {
		return false
	}
	c.value[name] = value
	c.seen[name] = c.cfg.Clock.Now()
	delete(c.listed, name)
	return true
}

func (c *Controller) observeMachine(obj any, initial bool) {
	m, ok := obj.(*likenv1.Machine)
	if !ok {
		return
	}
	// The cache now holds what the verdict wrote, or something newer: a
	// decision that reads the Machine sees it, and the mark can go.
	c.mu.Lock()
	rv, judged := c.pending[m.Name]
	c.mu.Unlock()
	if judged && rv != m.ResourceVersion {
		c.endVerdict(m.Name, rv)
	}
	c.mu.Lock()
	if _, ok := c.seen[m.Name]; !ok {
		c.seen[m.Name] = c.observedAt(initial)
	}
	c.mu.Unlock()
	c.queue.Add(m.Name)
}

// endVerdict drops the pending mark of a machine's verdict, if it is still
// the one that overwrote resourceVersion rv.
func (c *Controller) endVerdict(name, rv string) {
	c.verdicts.Lock()
	defer c.verdicts.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[name] == rv {
		delete(c.pending, name)
	}
}

func (c *Controller) sync(ctx context.Context, name string) (time.Duration, error) {
	m, err := c.machines.Get(name)
	if apierrors.IsNotFound(err) {
		c.verdicts.Lock()
		defer c.verdicts.Unlock()
		c.mu.Lock()
		delete(c.seen, name)
		delete(c.value, name)
		delete(c.listed, name)
		delete(c.pending, name)
		delete(c.judged, name)
		c.mu.Unlock()
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if m.Status.Phase == likenv1.MachineLost {
		return 0, nil // the machine writes its own phase when it is back
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	seen, ok := c.seen[name]
	verdict, judged := c.judged[name]
	same := judged && verdict == c.value[name]
	c.mu.Unlock()
	if same {
		// Written Lost already in this silence; a renewal wakes this sync.
		return 0, nil
	}
	if !ok || seen.Before(c.cfg.Term.Since) {
		seen = c.cfg.Term.Since
	}
	if wait := seen.Add(c.cfg.LostAfter).Sub(now); wait > 0 {
		return wait, nil
	}
	written, err := c.writeLost(ctx, m, seen)
	if err != nil {
		return 0, err
	}
	if !written {
		return c.cfg.LostAfter, nil
	}
	silent := now.Sub(seen).Round(time.Second)
	note := fmt.Sprintf("The Node Lease %s/%s of machine %s was not renewed for %s, as seen by cluster-operator since %s: its kubelet sends no heartbeat. It reads Lost and counts against the disruption budget until it reports again. Check its power, its network and its kubelet (kubectl get node %s).",
		LeaseNamespace, name, name, silent, seen.UTC().Format(time.RFC3339), name)
	klog.FromContext(ctx).Info("Machine lost", "machine", klog.KObj(m), "silentFor", silent, "previousPhase", m.Status.Phase)
	c.cfg.Metrics.MachinesLost.WithLabelValues(m.Spec.Cluster).Inc()
	// One event, on the Machine (related to its Cluster when there is one).
	var related runtime.Object
	if cl, err := c.clusters.Get(m.Spec.Cluster); err == nil {
		related = cl
	}
	c.cfg.Recorder.Eventf(m, related, corev1.EventTypeWarning, EventMachineLost, "Judge", "%s", note)
	return 0, nil
}

// writeLost writes the machine Lost unless its Lease, read again, was
// renewed after judged, and reports whether it did. The machine stays
// pending until the informer delivers the write (docs/design/protocol.md#liveness).
func (c *Controller) writeLost(ctx context.Context, m *likenv1.Machine, judged time.Time) (bool, error) {
	name := m.Name
	c.verdicts.Lock()
	defer c.verdicts.Unlock()
	c.mu.Lock()
	c.pending[name] = m.ResourceVersion
	c.mu.Unlock()
	written := false
	defer func() {
		if !written {
			c.mu.Lock()
			delete(c.pending, name)
			c.mu.Unlock()
		}
	}()
	// Before the verdict, read the Lease itself: a renewal may be on its
	// way through the watch.
	l, err := c.cfg.LeaseReader.Leases(LeaseNamespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, fmt.Errorf("reading the Node Lease %s/%s of machine %s: %w", LeaseNamespace, name, name, err)
	default:
		if c.record(name, renewal(l)) {
			return false, nil
		}
	}
	// The informer may have delivered a renewal while the Lease was read
	// (the read then shows the same renewal, and is no news to record).
	c.mu.Lock()
	heard := c.seen[name].After(judged)
	c.mu.Unlock()
	if heard {
		return false, nil
	}
	if err := c.cfg.Term.Fence.Confirm(ctx, "writing machine "+name+" Lost"); err != nil {
		return false, fmt.Errorf("not writing machine %s Lost: %w", name, err)
	}
	lost := m.DeepCopy()
	lost.Status.Phase = likenv1.MachineLost
	if _, err := c.cfg.Writer.UpdateStatus(ctx, lost, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return false, fmt.Errorf("writing machine %s Lost: %w", name, err)
	}
	written = true
	c.mu.Lock()
	c.judged[name] = c.value[name]
	c.mu.Unlock()
	return true, nil
}
