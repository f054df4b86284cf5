package fleetsim

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/generated/clientset/versioned"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

// A Fleet's Cluster and its two releases. The channel is never read: the
// machines are simulated.
const (
	FleetCluster  = "bench"
	FleetVersion1 = "2026.11.01-001"
	FleetVersion2 = "2026.11.20-001"
)

var (
	digest1 = "sha256:" + strings.Repeat("1", 64)
	digest2 = "sha256:" + strings.Repeat("2", 64)
)

// FleetOptions shape a simulated fleet.
type FleetOptions struct {
	// Machines and Leaders: how many machines, and how many of them (the
	// first by name) are leaders.
	Machines, Leaders int
	// MaxUnavailable is the Cluster's initial budget.
	MaxUnavailable string
	// RenewEvery is the heartbeat period of every machine.
	RenewEvery time.Duration
	// RebootFor is how long a turn keeps a machine away.
	RebootFor time.Duration
	// Nodes registers a Node per machine, simulated by kwok (Ready);
	// machines cordon it for their turn, as the node daemon does, and
	// their new boot posts its Ready. Either way each machine renews its
	// Node Lease itself.
	Nodes bool
	// StageQPS bounds how fast the machines report a staged release once
	// spec.version changes (a fleet does not stage all at once).
	StageQPS float64
	// KeepDir, when set, is a folder where the control plane's files (and
	// the operator's logs) are kept after the test.
	KeepDir string
}

// Fleet is a real control plane with liken's manifests, one Cluster and
// its Machines, played in this process at low cost per machine: one watch
// of the Cluster for all of them (a machine stages the version it names
// and takes the turns it grants, writing only when its state changes), and
// one scheduler for their heartbeats. Each Machine writes as
// system:node:<name>, through one shared connection; a Fleet counts their
// writes and heartbeats, and remembers when each turn finished.
type Fleet struct {
	t      testing.TB
	ctx    context.Context
	cancel context.CancelFunc
	o      FleetOptions
	// CP is the control plane.
	CP *controlplane.ControlPlane
	// Liken and Kube are admin clients.
	Liken versioned.Interface
	Kube  kubernetes.Interface
	// Names are the machine names, sorted; leaders first.
	Names []string

	machines map[string]*Machine
	counts   counts
	// cluster is the Cluster as created.
	cluster *likenv1.Cluster

	failures     atomic.Int64
	firstFailure atomic.Value // string

	mu       sync.Mutex
	renewLag []time.Duration
	// observers get every Cluster seen by the fleet's watch, in order,
	// with the time it arrived.
	observers []func(c *likenv1.Cluster, at time.Time)
	staged    int
}

// FleetPodCIDR is a simulated fleet's pod range: 32768 Node ranges of
// /24, so the controller manager gives every simulated Node one, as on a
// real fleet, and none is left retrying for a range.
const FleetPodCIDR = "10.128.0.0/9"

// MachineName is the name of machine i (0-based) of a Fleet.
func MachineName(i int) string { return fmt.Sprintf("m-%05d", i) }

// NewFleet starts the control plane, installs liken, creates the Cluster
// and the Machines (and Nodes), and starts every machine's heartbeat and
// status. Everything stops when the test ends.
func NewFleet(t testing.TB, o FleetOptions) *Fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{t: t, ctx: ctx, cancel: cancel, o: o, machines: map[string]*Machine{}}
	f.counts.fail = f.fail
	for i := range o.Machines {
		f.Names = append(f.Names, MachineName(i))
	}
	start := time.Now()
	cpo := controlplane.Options{TokenMachines: f.Names, PodCIDR: FleetPodCIDR}
	if o.KeepDir != "" {
		must(t, os.MkdirAll(o.KeepDir, 0o755))
		dir, err := os.MkdirTemp(o.KeepDir, "fleet-")
		must(t, err)
		cpo.Dir = dir
		t.Logf("the fleet's files are kept in %s", dir)
	}
	f.CP = controlplanetest.Start(t, cpo)
	// Cleanups run last first: the load generator stops before the
	// control plane.
	t.Cleanup(cancel)
	admin := f.CP.AdminConfig()
	admin.QPS, admin.Burst = 2000, 4000
	var err error
	f.Liken, err = versioned.NewForConfig(admin)
	must(t, err)
	f.Kube, err = kubernetes.NewForConfig(admin)
	must(t, err)
	Install(ctx, t, f.CP)
	must(t, f.createCluster())
	must(t, f.createMachines())
	t.Logf("fleet of %d machines (%d leaders, nodes: %v) created in %s", o.Machines, o.Leaders, o.Nodes, time.Since(start).Round(time.Second))
	f.watchCluster()
	go f.heartbeatLoop()
	return f
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Context is the fleet's context, done when the test ends.
func (f *Fleet) Context() context.Context { return f.ctx }

func (f *Fleet) createCluster() error {
	mu := intstr.Parse(f.o.MaxUnavailable)
	c, err := f.Liken.LikenV1alpha1().Clusters().Create(f.ctx, &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: FleetCluster},
		Spec: likenv1.ClusterSpec{
			Version: FleetVersion1,
			Releases: likenv1.ReleasesSpec{
				// Nothing listens there; the operator's channel reads fail
				// quietly once per poll interval.
				Source:       "http://127.0.0.1:1/liken",
				PollInterval: &metav1.Duration{Duration: time.Hour},
				Catalog:      []likenv1.CatalogEntry{{Version: FleetVersion1, Digest: digest1}, {Version: FleetVersion2, Digest: digest2}},
			},
			Network: likenv1.NetworkSpec{Endpoint: f.CP.Server, PodCIDR: FleetPodCIDR},
			// Settle 0s: the benchmark times the grant itself; its machines
			// run no workloads to wait for.
			Disruption: likenv1.DisruptionSpec{MaxUnavailable: &mu, Settle: &metav1.Duration{}},
		},
	}, metav1.CreateOptions{})
	f.cluster = c
	return err
}

// Parallel runs fn for every name with a few workers and returns the
// first error.
func Parallel(names []string, workers int, fn func(i int, name string) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  atomic.Int64
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				if err := fn(i, names[i]); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// createMachines creates every Machine (and Node) as the admin, then has
// every machine report Ready on FleetVersion1 and take over its Node
// Lease as itself.
func (f *Fleet) createMachines() error {
	mo := MachineOptions{Cluster: FleetCluster, Version: FleetVersion1, RenewEvery: f.o.RenewEvery, RebootFor: f.o.RebootFor,
		Cordon: f.o.Nodes, SilentKubelet: !f.o.Nodes}
	for _, name := range f.Names {
		// Every machine's token rides the same TLS settings: one shared
		// connection.
		cfg := f.CP.Config("system:node:" + name)
		cfg.QPS, cfg.Burst = -1, 0 // the load generator paces itself
		m, err := newMachine(f.ctx, cfg, f.Kube, &f.counts, name, mo)
		if err != nil {
			return err
		}
		f.machines[name] = m
	}
	return Parallel(f.Names, 16, func(i int, name string) error {
		m := f.machines[name]
		leader := i < f.o.Leaders
		role := likenv1.RoleWorker
		if leader {
			role = likenv1.RoleLeader
		}
		if f.o.Nodes {
			labels := map[string]string{"node-role.kubernetes.io/worker": ""}
			if leader {
				labels = map[string]string{"node-role.kubernetes.io/control-plane": ""}
			}
			if err := f.CP.AddNode(f.ctx, name, labels); err != nil {
				return err
			}
		}
		obj, err := f.Liken.LikenV1alpha1().Machines().Create(f.ctx, &likenv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       likenv1.MachineSpec{Cluster: FleetCluster, Role: role, RebootPolicy: likenv1.RebootAuto},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating Machine %s: %w", name, err)
		}
		m.mu.Lock()
		m.obj, m.cluster = obj, f.cluster
		err = m.writeStatus(m.status())
		m.mu.Unlock()
		if err != nil {
			return err
		}
		// The machine's heartbeat is its Node Lease, as its kubelet renews
		// it; with Nodes, kwok registered it and the machine takes it over.
		return m.renew()
	})
}

// fail records an error of the load generator; the benchmark checks that
// there was none.
func (f *Fleet) fail(format string, args ...any) {
	if f.ctx.Err() != nil {
		return
	}
	if f.failures.Add(1) == 1 {
		f.firstFailure.Store(fmt.Sprintf(format, args...))
	}
}

// Failures is the number of load-generator errors and the first one.
func (f *Fleet) Failures() (int64, string) {
	s, _ := f.firstFailure.Load().(string)
	return f.failures.Load(), s
}

// heartbeatLoop renews every machine's Lease every RenewEvery, machine i
// at offset i/N of the period, with a pool of workers.
func (f *Fleet) heartbeatLoop() {
	n := len(f.Names)
	type due struct {
		m  *Machine
		at time.Time
	}
	work := make(chan due, 4*n)
	for range 128 {
		go func() {
			for d := range work {
				lag := time.Since(d.at)
				if lag > f.o.RenewEvery*2 {
					f.fail("the load generator fell behind: a heartbeat started %s late (the API server or this machine is overloaded)", lag.Round(time.Millisecond))
				}
				if !d.m.alive.Load() {
					continue // hung
				}
				if err := d.m.renew(); err != nil {
					f.fail("%v", err)
					continue
				}
				f.mu.Lock()
				f.renewLag = append(f.renewLag, lag)
				f.mu.Unlock()
			}
		}()
	}
	defer close(work)
	start := time.Now()
	step := f.o.RenewEvery / time.Duration(n)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	next := 0 // renewals scheduled so far
	for {
		select {
		case <-f.ctx.Done():
			return
		case now := <-tick.C:
			for {
				// Machine i renews at i/N of each period: the first round
				// is spread over the first period after the start.
				at := start.Add(time.Duration(next+1) * step)
				if at.After(now) {
					break
				}
				select {
				case work <- due{m: f.machines[f.Names[next%n]], at: at}:
				case <-f.ctx.Done():
					return
				}
				next++
			}
		}
	}
}

// Heartbeats is the number of Lease renewals so far.
func (f *Fleet) Heartbeats() int64 { return f.counts.heartbeats.Load() }

// MachineWrites is the number of writes the machines made so far besides
// their heartbeats.
func (f *Fleet) MachineWrites() int64 { return f.counts.writes.Load() }

// RenewLag returns how late the renewals since the last call started
// against their schedule, and forgets them.
func (f *Fleet) RenewLag() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.renewLag
	f.renewLag = nil
	return out
}

// Observe calls fn with every version of the Cluster the fleet sees, in
// order, with the time it arrived.
func (f *Fleet) Observe(fn func(c *likenv1.Cluster, at time.Time)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observers = append(f.observers, fn)
}

// watchCluster follows the Cluster: the machines take the turns it grants
// and stage the version it names.
func (f *Fleet) watchCluster() {
	factory := likeninformers.NewSharedInformerFactory(f.Liken, 0)
	inf := factory.Liken().V1alpha1().Clusters().Informer()
	var version string
	granted := map[string]bool{}
	on := func(obj any) {
		at := time.Now()
		c, ok := obj.(*likenv1.Cluster)
		if !ok || c.Name != FleetCluster {
			return
		}
		f.mu.Lock()
		obs := append([]func(*likenv1.Cluster, time.Time){}, f.observers...)
		f.mu.Unlock()
		for _, fn := range obs {
			fn(c, at)
		}
		if c.Spec.Version != version {
			version = c.Spec.Version
			go f.stageAll(c)
		}
		now := map[string]bool{}
		for _, tr := range c.Status.RebootTurns {
			now[tr.Machine] = true
			if !granted[tr.Machine] {
				if m := f.machines[tr.Machine]; m != nil {
					go m.takeTurn(tr)
				}
			}
		}
		granted = now
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }})
	must(f.t, err)
	factory.Start(f.ctx.Done())
	f.t.Cleanup(func() {
		f.cancel()
		factory.Shutdown()
	})
	if !WaitForSync(f.ctx, inf.HasSynced) {
		f.t.Fatal("the Cluster watch did not sync")
	}
}

// stageAll has every machine not on version report it staged, at most
// StageQPS a second, in name order, with a few writes in flight.
func (f *Fleet) stageAll(c *likenv1.Cluster) {
	lim := rate.NewLimiter(rate.Limit(f.o.StageQPS), 1)
	work := make(chan *Machine)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				if m.stage(c) {
					f.mu.Lock()
					f.staged++
					f.mu.Unlock()
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(work)
	for _, name := range f.Names {
		if err := lim.Wait(f.ctx); err != nil {
			return
		}
		work <- f.machines[name]
	}
}

// Staged is how many machines reported a staged release so far.
func (f *Fleet) Staged() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.staged
}

// TakeFinishes returns the times machines finished their turns (their
// last write returned) since the last call, oldest first.
func (f *Fleet) TakeFinishes() []time.Time {
	f.counts.mu.Lock()
	defer f.counts.mu.Unlock()
	out := f.counts.finishes
	f.counts.finishes = nil
	return out
}

// FinishedAt is, for every machine that finished a turn, when its last
// turn finished.
func (f *Fleet) FinishedAt() map[string]time.Time {
	out := map[string]time.Time{}
	for name, m := range f.machines {
		m.mu.Lock()
		if !m.readyAt.IsZero() {
			out[name] = m.readyAt
		}
		m.mu.Unlock()
	}
	return out
}

// SetMaxUnavailable changes the Cluster's budget.
func (f *Fleet) SetMaxUnavailable(v string) error {
	patch := fmt.Sprintf(`{"spec":{"disruption":{"maxUnavailable":%s}}}`, v)
	if intstr.Parse(v).Type == intstr.String {
		patch = fmt.Sprintf(`{"spec":{"disruption":{"maxUnavailable":%q}}}`, v)
	}
	_, err := f.Liken.LikenV1alpha1().Clusters().Patch(f.ctx, FleetCluster, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// SetSettle sets spec.disruption.settle to d.
func (f *Fleet) SetSettle(d time.Duration) error {
	patch := fmt.Sprintf(`{"spec":{"disruption":{"settle":%q}}}`, d.String())
	_, err := f.Liken.LikenV1alpha1().Clusters().Patch(f.ctx, FleetCluster, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// SetVersion points spec.version at v.
func (f *Fleet) SetVersion(v string) error {
	patch := fmt.Sprintf(`{"spec":{"version":%q}}`, v)
	_, err := f.Liken.LikenV1alpha1().Clusters().Patch(f.ctx, FleetCluster, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// Cluster reads the Cluster.
func (f *Fleet) Cluster() (*likenv1.Cluster, error) {
	return f.Liken.LikenV1alpha1().Clusters().Get(f.ctx, FleetCluster, metav1.GetOptions{})
}
