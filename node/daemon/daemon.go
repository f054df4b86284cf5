// Package daemon is the node daemon's reconcile loop: one machine keeps
// itself in step with its own Machine and its Cluster.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeinformers "k8s.io/client-go/informers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/lastwrite"
	"liken.sh/liken/internal/trust"
	"liken.sh/liken/internal/worker"
	"liken.sh/liken/node/slots"
)

// FieldManager is the field manager of every write the daemon makes.
const FieldManager = "liken-node"

// key is the only key of the work queue: there is one machine.
const key = "machine"

// bootMode says how the running boot relates to the boot state.
type bootMode int

const (
	// modeNormal: running the proven slot.
	modeNormal bootMode = iota
	// modeTrial: a trial boot that has not committed yet.
	modeTrial
	// modeConfused: the booted slot is neither proven nor on trial; the
	// machine writes no slot and takes no turn.
	modeConfused
)

// Daemon reconciles one machine.
type Daemon struct {
	o     Options
	t     Timing
	clock clock.WithTickerAndDelayedExecution
	http  *http.Client
	// trust is http's transport when Options.HTTPClient is nil.
	trust  *trust.Transport
	slots  *slots.Store
	events events.EventRecorder
	queue  *worker.Queue

	machines likenlisters.MachineLister
	clusters likenlisters.ClusterLister
	nodes    corelisters.NodeLister

	sink *sentSink
	stop context.CancelCauseFunc
	wg   sync.WaitGroup

	// mu guards what follows: what actors (a download, a drain, a
	// re-check, the trial timer) and actions report, which observe reads
	// for the next decision. It is never held across an API call, a
	// command, or a write of the boot loader.
	mu sync.Mutex
	// st is the state on disk; change it only through update.
	st   *diskState
	mode bootMode
	// confusion explains modeConfused.
	confusion string
	// rebooting is set once a reboot was asked for: nothing more happens.
	rebooting bool
	// committing is set while a trial's commit is under way: the trial
	// timer leaves it alone.
	committing bool

	dl        *download
	dlFailure *downloadFailure

	// run is the reboot turn this liken-node runs; runCtx ends its actors.
	run       *turnRun
	runCtx    context.Context
	runCancel context.CancelFunc
	// actors counts the turn's actors still running (those of a turn
	// given back may still be stopping).
	actors      int
	staleLedger *likenv1.Cluster
	// downWaitingFor says why a leader holding its turn did not go down
	// at its last try (ControlPlaneHealth.SafeToStop).
	downWaitingFor string

	config configFailure
	// slotErr says the slot store disagrees with the boot loader and
	// could not be repaired at start (reconcileSlots).
	slotErr error
	// bootErr is the failure of this boot's Applier.Boot (a disk that did
	// not mount, a port that did not come up). Only a later Boot that
	// succeeds clears it; until then the machine is Degraded.
	bootErr error

	// pendingEvents wait for the next reconcile, which has the objects.
	pendingEvents []pendingEvent
	// retry holds, per action key, when a failed action may run again.
	retry      map[string]time.Time
	uncordoned *corev1.Node

	trialTimer          clock.Timer
	trialWaitingFor     string
	statusWrittenInBoot bool
	lastProgressWrite   time.Time
	lastStatusErr       error
	statusBackoff       time.Duration
	statusRefusedAt     string
	lastSent            *likenv1.MachineStatus
	lastSentVersion     string
	// expiredInCommit: the trial's deadline passed while its commit was
	// under way.
	expiredInCommit bool
	// written is the Machine as the last status writes returned it,
	// newer than the informer's copy until the informer delivers them.
	written lastwrite.Writes[*likenv1.Machine]

	// wdMu guards wdDone: set once the watchdog is disarmed (or let go),
	// after which nobody feeds it.
	wdMu   sync.Mutex
	wdDone bool
}

// New checks o and returns a Daemon; Run starts it.
func New(o Options) (*Daemon, error) {
	switch {
	case o.Machine == "":
		return nil, errors.New("the machine name is required (--machine)")
	case o.Root == "":
		return nil, errors.New("the state folder is required (--root)")
	case o.Kube == nil || o.Liken == nil:
		return nil, errors.New("API clients are required")
	case o.Bootloader == nil:
		return nil, errors.New("a bootloader is required")
	case o.Applier == nil || o.Observer == nil:
		return nil, errors.New("an applier and an observer are required")
	case o.Rebooter == nil:
		return nil, errors.New("a rebooter is required")
	case !o.Boot.Slot.Valid():
		return nil, fmt.Errorf("booted slot %q is not A or B", o.Boot.Slot)
	case o.Boot.BootID == "":
		return nil, errors.New("the boot ID is required")
	case o.Boot.BootedAt.IsZero():
		return nil, errors.New("the time the machine booted is required")
	}
	d := &Daemon{o: o, t: o.Timing, clock: o.Clock, http: o.HTTPClient}
	d.t.defaults()
	if d.clock == nil {
		d.clock = clock.RealClock{}
	}
	d.queue = worker.New("liken-node", d.clock, func(ctx context.Context, _ string) (time.Duration, error) { return d.sync(ctx) },
		worker.WithBackoff(200*time.Millisecond, 30*time.Second))
	if d.http == nil {
		// Releases are read trusting the public CAs and the Cluster's
		// settings.caBundle (runDownload gives it the bundle).
		d.trust = &trust.Transport{Base: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: time.Minute,
			IdleConnTimeout:       90 * time.Second,
		}}
		d.http = &http.Client{Transport: d.trust}
	}
	return d, nil
}

// Alive returns an error when liken-node is stuck: one reconcile has run
// for longer than Timing.Stuck (a call that never returns, a lock never
// released). liken-node then stops answering systemd's watchdog, which
// restarts it; the state on disk carries the work on.
func (d *Daemon) Alive() error {
	if b := d.queue.Busy(); b > d.t.Stuck {
		return fmt.Errorf("a reconcile has run for %s, longer than the %s one may take", b.Round(time.Second), d.t.Stuck)
	}
	return nil
}

// Scheme knows the Kubernetes types and liken's, for event references.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(likenv1.AddToScheme(s))
	return s
}

// Run reconciles until ctx ends (it returns nil) or the machine reboots
// (a real reboot does not return; a simulated one returns ErrRebooted).
// It deals with the boot first, from disk alone, so a trial boot that
// never reaches the API server still returns to its proven slot in time.
func (d *Daemon) Run(ctx context.Context) error {
	log := klog.FromContext(ctx).WithValues("machine", d.o.Machine)
	ctx = klog.NewContext(ctx, log)
	ctx, stop := context.WithCancelCause(ctx)
	d.stop = stop
	defer stop(nil)

	if err := d.startBoot(ctx); err != nil {
		return err
	}

	d.sink = &sentSink{EventSink: &events.EventSinkImpl{Interface: d.o.Kube.EventsV1()}}
	broadcaster := events.NewBroadcaster(d.sink)
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("starting the event recorder: %w", err)
	}
	defer broadcaster.Shutdown()
	d.events = broadcaster.NewRecorder(Scheme(), FieldManager)

	defer d.queue.ShutDown()

	byName := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", d.o.Machine).String()
	}
	own := likeninformers.NewSharedInformerFactoryWithOptions(d.o.Liken, 0, likeninformers.WithTweakListOptions(byName))
	all := likeninformers.NewSharedInformerFactory(d.o.Liken, 0)
	kube := kubeinformers.NewSharedInformerFactoryWithOptions(d.o.Kube, 0, kubeinformers.WithTweakListOptions(byName))
	mi := own.Liken().V1alpha1().Machines()
	ci := all.Liken().V1alpha1().Clusters()
	ni := kube.Core().V1().Nodes()
	d.machines, d.clusters, d.nodes = mi.Lister(), ci.Lister(), ni.Lister()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.queue.Add(key) },
		UpdateFunc: func(any, any) { d.queue.Add(key) },
		DeleteFunc: func(any) { d.queue.Add(key) },
	}
	for _, inf := range []cache.SharedIndexInformer{mi.Informer(), ci.Informer(), ni.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	own.Start(ctx.Done())
	all.Start(ctx.Done())
	kube.Start(ctx.Done())
	defer func() {
		if errors.Is(context.Cause(ctx), ErrRebooted) {
			// The machine reboots: do not wait for the informers, which
			// can sit in a back-off of up to 30 s; a trial that gave up
			// must reach its proven slot in time.
			return
		}
		own.Shutdown()
		all.Shutdown()
		kube.Shutdown()
	}()

	// One worker reconciles, once the Machine, Cluster and Node caches
	// are synced; it returns when ctx ends (before the caches synced,
	// that is no failure: the daemon is stopping).
	d.queue.Add(key)
	d.wg.Go(func() {
		_ = d.queue.Run(ctx, 1, mi.Informer().HasSyncedChecker(), ci.Informer().HasSyncedChecker(), ni.Informer().HasSyncedChecker())
	})
	<-ctx.Done()
	return d.finish(ctx, log)
}

// finish stops everything the daemon started and says why it stopped.
func (d *Daemon) finish(ctx context.Context, log klog.Logger) error {
	d.queue.ShutDown()
	d.mu.Lock()
	if d.dl != nil {
		d.dl.cancel()
	}
	if d.runCancel != nil {
		d.runCancel()
	}
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	d.mu.Unlock()
	d.wg.Wait()
	if errors.Is(context.Cause(ctx), ErrRebooted) {
		log.Info("Stopped for a reboot")
		return ErrRebooted
	}
	log.Info("Stopped")
	return nil
}

// enqueue asks for a reconcile soon.
func (d *Daemon) enqueue() {
	if d.queue != nil {
		d.queue.Add(key)
	}
}

// sentSink writes events to the API server and tells when one of a given
// reason was sent. Events are sent in the background; before a turn's
// reboot the daemon waits for the turn's last ones, which would otherwise
// be lost when the machine reboots at once.
type sentSink struct {
	events.EventSink
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

// expect returns a channel closed when the next event of reason has been
// sent, or refused. Call it before recording the event.
func (s *sentSink) expect(reason string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting == nil {
		s.waiting = map[string]chan struct{}{}
	}
	ch, ok := s.waiting[reason]
	if !ok {
		ch = make(chan struct{})
		s.waiting[reason] = ch
	}
	return ch
}

func (s *sentSink) sent(ev *eventsv1.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.waiting[ev.Reason]; ok {
		close(ch)
		delete(s.waiting, ev.Reason)
	}
}

// Create sends a new event.
func (s *sentSink) Create(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.sent(ev)
	return s.EventSink.Create(ctx, ev)
}

// Update sends an event again.
func (s *sentSink) Update(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.sent(ev)
	return s.EventSink.Update(ctx, ev)
}

// Patch sends a repeated event's new count.
func (s *sentSink) Patch(ctx context.Context, old *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	defer s.sent(old)
	return s.EventSink.Patch(ctx, old, data)
}

// awaitSent waits until every channel in sent is closed, for at most
// Timing.EventFlush in all.
func (d *Daemon) awaitSent(ctx context.Context, sent ...<-chan struct{}) {
	timeout := d.clock.After(d.t.EventFlush)
	for _, ch := range sent {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-timeout:
			klog.FromContext(ctx).Info("The turn's last events may not reach the API server before the reboot", "waited", d.t.EventFlush)
			return
		}
	}
}

// event records an event on the Machine (and the Cluster when related).
func (d *Daemon) event(m *likenv1.Machine, c *likenv1.Cluster, typ, reason, action, format string, args ...any) {
	if d.events == nil || m == nil {
		return
	}
	var related runtime.Object
	if c != nil {
		related = c
	}
	d.events.Eventf(withKind(m), withKindCluster(related), typ, reason, action, format, args...)
}

func withKind(m *likenv1.Machine) runtime.Object {
	m = m.DeepCopy()
	m.SetGroupVersionKind(likenv1.SchemeGroupVersion.WithKind("Machine"))
	return m
}

func withKindCluster(o runtime.Object) runtime.Object {
	c, ok := o.(*likenv1.Cluster)
	if !ok || c == nil {
		return nil
	}
	c = c.DeepCopy()
	c.SetGroupVersionKind(likenv1.SchemeGroupVersion.WithKind("Cluster"))
	return c
}

// update changes the state on disk and keeps it in memory only once it
// is written.
func (d *Daemon) update(change func(st *diskState)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.updateLocked(change)
}

// updateLocked is update with d.mu held.
func (d *Daemon) updateLocked(change func(st *diskState)) error {
	next := d.st.clone()
	change(next)
	if err := next.save(d.o.Root); err != nil {
		return err
	}
	d.st = next
	return nil
}
