package bench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/generated/clientset/versioned"
	likenclient "liken.sh/liken/generated/clientset/versioned/typed/liken/v1alpha1"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
	"liken.sh/liken/manifests"
)

// The fleet's Cluster and its two releases. The channel is never read:
// the machines are simulated.
const (
	ClusterName = "bench"
	Version1    = "2026.11.01-001"
	Version2    = "2026.11.20-001"
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
	// RenewEvery is the heartbeat period of every machine (10 s).
	RenewEvery time.Duration
	// RebootFor is how long a simulated turn keeps a machine away.
	RebootFor time.Duration
	// Nodes registers a Node per machine, simulated by kwok (Ready);
	// machines cordon and uncordon it in their turn as the node daemon
	// does. Either way each machine renews its Node Lease itself.
	Nodes bool
	// StageQPS bounds how fast the machines report a staged release once
	// spec.version changes (a fleet does not stage all at once).
	StageQPS float64
}

// Fleet is a real control plane with liken's manifests, one Cluster and
// its Machines, whose machines are played by one load generator in this
// process: each machine renews its Node Lease (as its kubelet would) and writes its own
// status as system:node:<name>, through one shared connection.
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

	machines map[string]*simMachine

	heartbeats   atomic.Int64
	machineWrite atomic.Int64
	failures     atomic.Int64
	firstFailure atomic.Value // string

	mu       sync.Mutex
	renewLag []time.Duration
	// observers get every Cluster seen by the fleet's watch, in order,
	// with the time it arrived.
	observers []func(c *likenv1.Cluster, at time.Time)
	// finishes are the times machines finished a turn (their last write
	// returned), oldest first, not yet matched with a grant.
	finishes []time.Time
	staged   int
}

// MachineName is the name of machine i (0-based).
func MachineName(i int) string { return fmt.Sprintf("m-%05d", i) }

// NewFleet starts the control plane, installs liken, creates the Cluster
// and the Machines (and Nodes), and starts every machine's heartbeat and
// status. Everything stops when the test ends.
func NewFleet(t testing.TB, o FleetOptions) *Fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{t: t, ctx: ctx, cancel: cancel, o: o, machines: map[string]*simMachine{}}
	for i := range o.Machines {
		f.Names = append(f.Names, MachineName(i))
	}
	start := time.Now()
	cpo := controlplane.Options{TokenMachines: f.Names}
	if d := os.Getenv("LIKEN_BENCH_LOGS"); d != "" {
		// Keep the control plane's and the operator's files for a look
		// afterwards.
		must(t, os.MkdirAll(d, 0o755))
		dir, err := os.MkdirTemp(d, "fleet-")
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
	must(t, f.install())
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

// install applies liken's CRDs, RBAC and admission policy (not the
// operator's Deployment: the operator runs as a process here).
func (f *Fleet) install() error {
	dir := filepath.Join(f.CP.Dir, "manifests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files, err := fs.Glob(manifests.FS, "*.yaml")
	if err != nil {
		return err
	}
	for _, name := range files {
		if strings.HasPrefix(name, "3") {
			continue
		}
		b, err := manifests.FS.ReadFile(name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	if out, err := f.CP.Kubectl(f.ctx, "apply", "--server-side", "-f", dir); err != nil {
		return fmt.Errorf("installing liken's manifests: %w\n%s", err, out)
	}
	if out, err := f.CP.Kubectl(f.ctx, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh"); err != nil {
		return fmt.Errorf("waiting for liken's CRDs: %w\n%s", err, out)
	}
	return nil
}

func (f *Fleet) createCluster() error {
	mu := intstr.Parse(f.o.MaxUnavailable)
	_, err := f.Liken.LikenV1alpha1().Clusters().Create(f.ctx, &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: ClusterName},
		Spec: likenv1.ClusterSpec{
			Version: Version1,
			Releases: likenv1.ReleasesSpec{
				// Nothing listens there; the operator's channel reads fail
				// quietly once per poll interval.
				Source:       "http://127.0.0.1:1/liken",
				PollInterval: &metav1.Duration{Duration: time.Hour},
				Catalog:      []likenv1.CatalogEntry{{Version: Version1, Digest: digest1}, {Version: Version2, Digest: digest2}},
			},
			Network:    likenv1.NetworkSpec{Endpoint: f.CP.Server},
			Disruption: likenv1.DisruptionSpec{MaxUnavailable: &mu},
		},
	}, metav1.CreateOptions{})
	return err
}

// parallel runs fn for every name with a few workers and returns the first
// error.
func parallel(names []string, workers int, fn func(i int, name string) error) error {
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
// every machine report Ready on Version1 and create its heartbeat Lease as
// itself.
func (f *Fleet) createMachines() error {
	base := f.CP.Config(controlplane.AdminUser)
	for i, name := range f.Names {
		cfg := rest.CopyConfig(base)
		cfg.BearerToken = f.CP.Config("system:node:" + name).BearerToken
		cfg.QPS, cfg.Burst = -1, 0 // the load generator paces itself
		m := &simMachine{f: f, name: name, leader: i < f.o.Leaders, boot: 1, version: Version1}
		var err error
		if m.liken, err = likenclient.NewForConfig(cfg); err != nil {
			return err
		}
		if m.leases, err = coordinationclient.NewForConfig(cfg); err != nil {
			return err
		}
		if m.core, err = coreclient.NewForConfig(cfg); err != nil {
			return err
		}
		f.machines[name] = m
	}
	return parallel(f.Names, 16, func(i int, name string) error {
		m := f.machines[name]
		role := likenv1.RoleWorker
		if m.leader {
			role = likenv1.RoleLeader
		}
		if f.o.Nodes {
			labels := map[string]string{"node-role.kubernetes.io/worker": ""}
			if m.leader {
				labels = map[string]string{"node-role.kubernetes.io/control-plane": ""}
			}
			if err := f.CP.AddNode(f.ctx, name, labels); err != nil {
				return err
			}
		}
		obj, err := f.Liken.LikenV1alpha1().Machines().Create(f.ctx, &likenv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       likenv1.MachineSpec{Cluster: ClusterName, Role: role, RebootPolicy: likenv1.RebootAuto},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating Machine %s: %w", name, err)
		}
		m.obj = obj
		if err := m.writeStatus(m.status(likenv1.MachineReady)); err != nil {
			return err
		}
		// The machine's heartbeat is its Node Lease, as its kubelet renews
		// it; with Nodes, kwok registered it and the machine takes it over.
		leases := m.leases.Leases(corev1.NamespaceNodeLease)
		now := metav1.NewMicroTime(time.Now())
		m.lease, err = leases.Create(f.ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var l *coordinationv1.Lease
			if l, err = leases.Get(f.ctx, name, metav1.GetOptions{}); err == nil {
				l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(name), &now
				m.lease, err = leases.Update(f.ctx, l, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("creating the Node Lease of %s: %w", name, err)
		}
		return nil
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
		m  *simMachine
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
				if err := d.m.renew(); err != nil {
					f.fail("renewing the Lease of %s: %v", d.m.name, err)
					continue
				}
				f.heartbeats.Add(1)
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
func (f *Fleet) Heartbeats() int64 { return f.heartbeats.Load() }

// MachineWrites is the number of writes the machines made so far besides
// their heartbeats.
func (f *Fleet) MachineWrites() int64 { return f.machineWrite.Load() }

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
		if !ok || c.Name != ClusterName {
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
			go f.stageAll(version)
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
	if !cache.WaitForCacheSync(f.ctx.Done(), inf.HasSynced) {
		f.t.Fatal("the Cluster watch did not sync")
	}
}

// stageAll has every machine not on version report it staged, at most
// StageQPS a second, in name order, with a few writes in flight.
func (f *Fleet) stageAll(version string) {
	lim := rate.NewLimiter(rate.Limit(f.o.StageQPS), 1)
	work := make(chan *simMachine)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				if m.stage(version) {
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

// TakeFinishes returns the times machines finished their turns since the
// last call, oldest first.
func (f *Fleet) TakeFinishes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.finishes
	f.finishes = nil
	return out
}

// SetMaxUnavailable changes the Cluster's budget.
func (f *Fleet) SetMaxUnavailable(v string) error {
	patch := fmt.Sprintf(`{"spec":{"disruption":{"maxUnavailable":%s}}}`, v)
	if intstr.Parse(v).Type == intstr.String {
		patch = fmt.Sprintf(`{"spec":{"disruption":{"maxUnavailable":%q}}}`, v)
	}
	_, err := f.Liken.LikenV1alpha1().Clusters().Patch(f.ctx, ClusterName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// SetVersion points spec.version at v.
func (f *Fleet) SetVersion(v string) error {
	patch := fmt.Sprintf(`{"spec":{"version":%q}}`, v)
	_, err := f.Liken.LikenV1alpha1().Clusters().Patch(f.ctx, ClusterName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// Cluster reads the Cluster.
func (f *Fleet) Cluster() (*likenv1.Cluster, error) {
	return f.Liken.LikenV1alpha1().Clusters().Get(f.ctx, ClusterName, metav1.GetOptions{})
}

// simMachine plays one machine: its heartbeat, its status, and its turn
// (cordon, reboot, uncordon, Ready from a new boot on the target).
type simMachine struct {
	f      *Fleet
	name   string
	leader bool
	liken  likenclient.LikenV1alpha1Interface
	leases coordinationclient.CoordinationV1Interface
	core   coreclient.CoreV1Interface

	mu      sync.Mutex
	obj     *likenv1.Machine
	lease   *coordinationv1.Lease
	boot    int
	version string
	target  string
	change  string
	inTurn  bool
	// readyAt is when the write that ended the machine's last turn
	// returned.
	readyAt time.Time
}

func (m *simMachine) bootID() string { return bootIDOf(m.name, m.boot) }

// bootIDOf is the ID of boot n of machine name.
func bootIDOf(name string, n int) string { return fmt.Sprintf("%s-boot-%d", name, n) }

// status is the status the machine reports in phase, from what it holds.
// Call with m.mu held.
func (m *simMachine) status(phase likenv1.MachinePhase) likenv1.MachineStatus {
	st := likenv1.MachineStatus{
		Phase: phase, Version: m.version, Slot: "A",
		Observed: likenv1.ObservedState{BootID: m.bootID()},
	}
	ready := metav1.Condition{Type: likenv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "Runs " + m.version + " with nothing pending.", LastTransitionTime: metav1.Now()}
	if m.change != "" {
		st.Staged, st.Change = m.target, m.change
		st.Pending = []likenv1.PendingChange{{Field: "cluster.spec.version", Class: likenv1.ClassReboot, Since: metav1.Now()}}
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, "RebootPending", "Release "+m.target+" is staged."
		st.Conditions = append(st.Conditions, metav1.Condition{Type: likenv1.ConditionRebootPending, Status: metav1.ConditionTrue,
			Reason: likenv1.ReasonAwaitingTurn, Message: "Waits for a reboot turn.", LastTransitionTime: metav1.Now()})
	}
	st.Conditions = append(st.Conditions, ready)
	return st
}

// writeStatus writes st as the machine's status, re-reading the Machine
// on a conflict. Call with m.mu held (or before the machine runs).
func (m *simMachine) writeStatus(st likenv1.MachineStatus) error {
	for range 5 {
		obj := m.obj.DeepCopy()
		obj.Status = st
		out, err := m.liken.Machines().UpdateStatus(m.f.ctx, obj, metav1.UpdateOptions{})
		m.f.machineWrite.Add(1)
		if err == nil {
			m.obj = out
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("machine %s writing its status: %w", m.name, err)
		}
		if m.obj, err = m.liken.Machines().Get(m.f.ctx, m.name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	return fmt.Errorf("machine %s: its status kept conflicting", m.name)
}

// renew renews the machine's Node Lease, as its kubelet would.
func (m *simMachine) renew() error {
	m.mu.Lock()
	l := m.lease.DeepCopy()
	m.mu.Unlock()
	leases := m.leases.Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	out, err := leases.Update(m.f.ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// Someone else wrote the Lease since (kwok's last renewal,
		// scheduled before the machine took the Lease over): read it again
		// and renew that, as a kubelet does.
		if l, err = leases.Get(m.f.ctx, m.name, metav1.GetOptions{}); err == nil {
			l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(m.name), &now
			out, err = leases.Update(m.f.ctx, l, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.lease = out
	m.mu.Unlock()
	return nil
}

// stage reports version staged; false when there is nothing to stage.
func (m *simMachine) stage(version string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.version == version || m.target == version || m.inTurn {
		return false
	}
	m.target = version
	m.change = fmt.Sprintf("release-%s-%s", version, m.bootID())
	if err := m.writeStatus(m.status(likenv1.MachineUpdatePending)); err != nil {
		m.f.fail("%v", err)
		return false
	}
	return true
}

// takeTurn runs a granted turn: Updating, cordon, away for RebootFor,
// uncordon, then Ready on the target from a new boot.
func (m *simMachine) takeTurn(t likenv1.RebootTurn) {
	m.mu.Lock()
	if m.inTurn || t.Change != m.change || m.change == "" {
		m.mu.Unlock()
		return
	}
	m.inTurn = true
	err := m.writeStatus(m.status(likenv1.MachineUpdating))
	m.mu.Unlock()
	if err != nil {
		m.f.fail("%v", err)
		return
	}
	if m.f.o.Nodes {
		if err := m.cordon(true); err != nil {
			m.f.fail("%v", err)
			return
		}
	}
	select {
	case <-m.f.ctx.Done():
		return
	case <-time.After(m.f.o.RebootFor):
	}
	if m.f.o.Nodes {
		// The kubelet of the new boot posts Ready with the boot's ID:
		// cluster-operator ends the turn only on a Ready from a new boot.
		if err := controlplane.SetNodePower(m.f.ctx, m.f.Kube, m.name, true); err != nil {
			m.f.fail("machine %s: its Node back from the reboot: %v", m.name, err)
			return
		}
		m.mu.Lock()
		next := bootIDOf(m.name, m.boot+1)
		m.mu.Unlock()
		if err := controlplane.PostNodeBoot(m.f.ctx, m.f.Kube, m.name, next); err != nil {
			m.f.fail("machine %s: its Node's Ready from the new boot: %v", m.name, err)
			return
		}
		if err := m.cordon(false); err != nil {
			m.f.fail("%v", err)
			return
		}
	}
	m.mu.Lock()
	m.boot++
	m.version, m.target, m.change = m.target, "", ""
	err = m.writeStatus(m.status(likenv1.MachineReady))
	done := time.Now()
	m.readyAt = done
	m.inTurn = false
	m.mu.Unlock()
	if err != nil {
		m.f.fail("%v", err)
		return
	}
	m.f.mu.Lock()
	m.f.finishes = append(m.f.finishes, done)
	m.f.mu.Unlock()
}

// cordon marks the machine's Node unschedulable (recording that liken did)
// or lifts it, as the node daemon does around a turn.
func (m *simMachine) cordon(on bool) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}},"spec":{"unschedulable":true}}`, likenv1.AnnotationCordoned)
	if !on {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null}},"spec":{"unschedulable":null}}`, likenv1.AnnotationCordoned)
	}
	_, err := m.core.Nodes().Patch(m.f.ctx, m.name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	m.f.machineWrite.Add(1)
	if err != nil {
		return fmt.Errorf("machine %s cordoning (%v) its node: %w", m.name, on, err)
	}
	return nil
}
