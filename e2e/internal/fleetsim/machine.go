package fleetsim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/poll"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	likenclient "liken.sh/liken/generated/clientset/versioned/typed/liken/v1alpha1"
	"liken.sh/liken/node/daemon"
)

// MachineOptions describe how a simulated machine behaves.
type MachineOptions struct {
	// Cluster is the name of the machine's Cluster.
	Cluster string
	// Version is the release the machine runs when it starts.
	Version string
	// Tick is how often a machine started with StartMachine reads its
	// Machine and Cluster and acts (default 200ms). A Fleet's machines act
	// on its watch of the Cluster instead.
	Tick time.Duration
	// RenewEvery is the period of its heartbeat, the renewal of its Node
	// Lease in kube-node-lease as a kubelet does it (default 1s).
	RenewEvery time.Duration
	// RebootFor is how long a reboot keeps the machine away. Zero: it is
	// back at once.
	RebootFor time.Duration
	// PowerOff: a reboot powers the machine's Node off (kwok reports it
	// NotReady and stops renewing its Lease) until it is back.
	PowerOff bool
	// Cordon: the machine cordons its Node for its turn and lifts the
	// cordon once back, as the node daemon does; back from the reboot, its
	// Node reads NotReady (the kubelet starting) until the new boot's
	// Ready.
	Cordon bool
	// SilentKubelet: the kubelet of a new boot posts nothing, so the Node
	// keeps the Ready of the last boot until the test posts one
	// (controlplane.PostNodeBoot); also for a machine without a Node.
	// Otherwise, back from a reboot, the Node's Ready is posted with the
	// new boot's ID, as a kubelet does when it starts.
	SilentKubelet bool
}

// Machine plays one machine's side of the turn protocol
// (docs/design/protocol.md) as system:node:<name>: it renews its Node
// Lease in kube-node-lease as its kubelet would, stages its Cluster's
// spec.version or a requested reboot, waits for approval (Manual) and for
// its turn, reports Updating or Rebooting when the ledger lists it,
// reboots and comes back Ready from a new boot. StartMachine runs one
// alone; a Fleet runs thousands.
type Machine struct {
	name   string
	o      MachineOptions
	ctx    context.Context
	liken  likenclient.LikenV1alpha1Interface
	leases coordinationclient.CoordinationV1Interface
	core   coreclient.CoreV1Interface
	// admin posts what is not the machine's own doing: its Node's power
	// and its kubelet's Ready.
	admin kubernetes.Interface
	// counts is where its writes, heartbeats, turns and errors are told.
	counts *counts

	// alive false: hung, no heartbeat and no status; the Node untouched.
	alive atomic.Bool
	// ticks counts the loop's iterations.
	ticks atomic.Int64

	mu sync.Mutex
	// obj is the Machine as last read or written, cluster its Cluster as
	// last read; lease the Node Lease.
	obj     *likenv1.Machine
	cluster *likenv1.Cluster
	lease   *coordinationv1.Lease
	version string
	slot    string
	boot    int
	// target is the release staged, change the change staged ("" when
	// nothing is), request the reboot request it stages.
	target, change, request string
	requested               string // a reboot asked for with RequestReboot
	observed                string // the last reboot request acted on
	inTurn                  bool
	stayDown                bool // takes its turn and never comes back
	// readyAt is when the write that ended its last turn returned.
	readyAt time.Time
}

// counts are what the machines of a fleet did, for the benchmarks.
type counts struct {
	heartbeats atomic.Int64
	writes     atomic.Int64
	// fail records an error the machine cannot retry; nil: ignored (a
	// lone machine tries again at its next tick).
	fail func(format string, args ...any)

	mu sync.Mutex
	// finishes are the times machines finished a turn, oldest first,
	// not yet taken.
	finishes []time.Time
}

func (c *counts) failed(err error) {
	if c.fail != nil && err != nil {
		c.fail("%v", err)
	}
}

// newMachine makes the simulator of machine name, whose clients use cfg,
// the machine's own identity.
func newMachine(ctx context.Context, cfg *rest.Config, admin kubernetes.Interface, c *counts, name string, o MachineOptions) (*Machine, error) {
	m := &Machine{name: name, o: o, ctx: ctx, admin: admin, counts: c, version: o.Version, slot: "A", boot: 1}
	var err error
	if m.liken, err = likenclient.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("client of machine %s: %w", name, err)
	}
	if m.leases, err = coordinationclient.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("client of machine %s: %w", name, err)
	}
	if m.core, err = coreclient.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("client of machine %s: %w", name, err)
	}
	m.alive.Store(true)
	return m, nil
}

// StartMachine starts simulating the machine name alone until ctx ends:
// every Tick it reads its Machine and its Cluster and acts. Its Machine,
// and its Node if PowerOff or Cordon is set, must exist.
func StartMachine(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane, name string, o MachineOptions) *Machine {
	t.Helper()
	if o.Tick == 0 {
		o.Tick = 200 * time.Millisecond
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = time.Second
	}
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	m, err := newMachine(ctx, cp.Config("system:node:"+name), admin, &counts{}, name, o)
	if err != nil {
		t.Fatal(err)
	}
	go m.run()
	return m
}

// BootID is the identity of the machine's current boot.
func (m *Machine) BootID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bootID()
}

func (m *Machine) bootID() string { return fmt.Sprintf("%s-boot-%d", m.name, m.boot) }

// RequestReboot stages a reboot that is not a release change, as the node
// daemon does for a change that needs one.
func (m *Machine) RequestReboot() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requested = m.bootID()
}

// StayDownInTurns makes the machine, from its next turn on, report
// Updating or Rebooting and never come back (its heartbeat goes on).
func (m *Machine) StayDownInTurns(v bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stayDown = v
}

// Hang stops the machine's heartbeat and status writes (its Node stays
// Ready) and returns once no write of its can still be under way.
func (m *Machine) Hang(t testing.TB) {
	t.Helper()
	m.alive.Store(false)
	start := m.ticks.Load()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if m.ticks.Load() >= start+2 {
			return poll.Success()
		}
		return poll.Continue("waiting for %s to stop", m.name)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
}

// Wake ends a Hang: the machine heartbeats and writes its status again.
func (m *Machine) Wake() { m.alive.Store(true) }

// run is a lone machine's loop.
func (m *Machine) run() {
	tick := time.NewTicker(m.o.Tick)
	defer tick.Stop()
	var renewed time.Time
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		m.ticks.Add(1)
		if !m.alive.Load() {
			continue
		}
		if time.Since(renewed) >= m.o.RenewEvery && m.renew() == nil {
			renewed = time.Now()
		}
		m.step()
	}
}

// step reads the machine's Machine and Cluster, and moves one step
// towards what the Cluster wants: it stages what there is to stage, takes
// a turn the ledger gives it, and writes its status when it changed.
func (m *Machine) step() {
	cur, err := m.liken.Machines().Get(m.ctx, m.name, metav1.GetOptions{})
	if err != nil {
		return
	}
	cl, err := m.liken.Clusters().Get(m.ctx, m.o.Cluster, metav1.GetOptions{})
	if err != nil {
		return
	}
	m.mu.Lock()
	m.obj, m.cluster = cur, cl
	m.target, m.change, m.request = "", "", ""
	request := m.requested
	if a := cur.Annotations[likenv1.AnnotationRequestReboot]; request == "" && a != m.observed {
		request = a
	}
	switch {
	case m.version != cl.Spec.Version:
		m.target = cl.Spec.Version
	case request != "":
		m.request = request
	}
	m.inTurn = false // a lone machine's turns run inside its step
	want := m.status()
	m.change = want.Change
	change, stayDown := m.change, m.stayDown
	if stayDown && (cur.Status.Phase == likenv1.MachineUpdating || cur.Status.Phase == likenv1.MachineRebooting) {
		m.mu.Unlock()
		return // down for good
	}
	for _, turn := range cl.Status.RebootTurns {
		if turn.Machine == m.name && change != "" && turn.Change == change {
			m.mu.Unlock()
			m.takeTurn(turn)
			return
		}
	}
	defer m.mu.Unlock()
	if differs(cur.Status, want) {
		_ = m.writeStatus(want)
	}
}

// differs reports whether the status got differs from want in what the
// machine reports.
func differs(got, want likenv1.MachineStatus) bool {
	if got.Phase != want.Phase || got.Change != want.Change || got.Version != want.Version || got.Slot != want.Slot ||
		got.Observed.BootID != want.Observed.BootID || got.ObservedRebootRequest != want.ObservedRebootRequest || len(got.Conditions) != len(want.Conditions) {
		return true
	}
	for i, c := range want.Conditions {
		g := got.Conditions[i]
		if g.Type != c.Type || g.Status != c.Status || g.Reason != c.Reason || g.Message != c.Message {
			return true
		}
	}
	return false
}

// status is the status the machine reports, from what it holds, made by
// the node daemon's own rules (daemon.Report): Ready with nothing staged,
// UpdatePending or RebootPending with a change staged (the daemon's change
// identifier), Updating or Rebooting in its turn. Call with m.mu held.
func (m *Machine) status() likenv1.MachineStatus {
	obj, cl := m.obj, m.cluster
	if obj == nil {
		obj = &likenv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: m.name},
			Spec: likenv1.MachineSpec{Cluster: m.o.Cluster, RebootPolicy: likenv1.RebootAuto}}
	}
	if cl == nil {
		cl = &likenv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: m.o.Cluster}, Spec: likenv1.ClusterSpec{Version: m.version}}
	}
	return daemon.Report(daemon.Simulated{Machine: obj, Cluster: cl, Slot: m.slot, BootID: m.bootID(), Version: m.version,
		Staged: m.target, RebootRequest: m.request, ObservedRebootRequest: m.observed, InTurn: m.inTurn}, time.Now())
}

// writeStatus writes st as the machine's status, re-reading the Machine
// on a conflict. Call with m.mu held (or before the machine runs).
func (m *Machine) writeStatus(st likenv1.MachineStatus) error {
	if m.obj == nil {
		obj, err := m.liken.Machines().Get(m.ctx, m.name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("machine %s reading its Machine: %w", m.name, err)
		}
		m.obj = obj
	}
	for range 5 {
		obj := m.obj.DeepCopy()
		obj.Status = st
		out, err := m.liken.Machines().UpdateStatus(m.ctx, obj, metav1.UpdateOptions{})
		m.counts.writes.Add(1)
		if err == nil {
			m.obj = out
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("machine %s writing its status: %w", m.name, err)
		}
		if m.obj, err = m.liken.Machines().Get(m.ctx, m.name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("machine %s reading its Machine: %w", m.name, err)
		}
	}
	return fmt.Errorf("machine %s: its status kept conflicting", m.name)
}

// renew renews the machine's Node Lease, as its kubelet would: an update
// of the Lease it last wrote, read again (or created) when someone else
// wrote it since (kwok, whose renewals stop once the machine holds it, or
// the power switch) or when there is none.
func (m *Machine) renew() error {
	m.mu.Lock()
	l := m.lease.DeepCopy()
	m.mu.Unlock()
	leases := m.leases.Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	var (
		out *coordinationv1.Lease
		err error
	)
	if l != nil {
		l.Spec.RenewTime = &now
		out, err = leases.Update(m.ctx, l, metav1.UpdateOptions{})
	}
	// Read again and retry while others write it too (the power switch in
	// the machine's own turn, a last renewal of kwok's).
	again := l == nil || apierrors.IsConflict(err)
	for try := 0; again && try < 5; try++ {
		l, err = leases.Get(m.ctx, m.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			out, err = leases.Create(m.ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: m.name, Namespace: corev1.NamespaceNodeLease},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
			}, metav1.CreateOptions{})
			again = apierrors.IsAlreadyExists(err) // created meanwhile: read it
		case err == nil:
			l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(m.name), &now
			out, err = leases.Update(m.ctx, l, metav1.UpdateOptions{})
			again = apierrors.IsConflict(err)
		default:
			again = false
		}
	}
	if err != nil {
		return fmt.Errorf("machine %s renewing its Node Lease: %w", m.name, err)
	}
	m.counts.heartbeats.Add(1)
	m.mu.Lock()
	m.lease = out
	m.mu.Unlock()
	return nil
}

// stage reports release version staged; false when there is nothing to
// stage.
func (m *Machine) stage(cl *likenv1.Cluster) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	version := cl.Spec.Version
	if m.version == version || m.target == version || m.inTurn {
		return false
	}
	m.cluster, m.target = cl, version
	st := m.status()
	m.change = st.Change
	if err := m.writeStatus(st); err != nil {
		m.counts.failed(err)
		return false
	}
	return true
}

// takeTurn runs a granted turn: Updating (a release) or Rebooting; the
// cordon; away for RebootFor, powered off if PowerOff; back from a new
// boot (on the target release), its kubelet's Ready posted unless
// SilentKubelet; the cordon lifted; Ready.
func (m *Machine) takeTurn(turn likenv1.RebootTurn) {
	m.mu.Lock()
	if m.inTurn || m.change == "" || turn.Change != m.change {
		m.mu.Unlock()
		return
	}
	m.inTurn = true
	err := m.writeStatus(m.status())
	stayDown := m.stayDown
	if err != nil || stayDown {
		// Not started: a lone machine tries again at its next step. Down
		// for good: its status says Updating or Rebooting from now on.
		m.inTurn = stayDown && err == nil
		m.mu.Unlock()
		m.counts.failed(err)
		return
	}
	m.mu.Unlock()
	if err := m.reboot(); err != nil {
		m.counts.failed(err)
		return
	}
	m.mu.Lock()
	m.inTurn = false
	err = m.writeStatus(m.status())
	done := time.Now()
	m.readyAt = done
	m.mu.Unlock()
	if err != nil {
		m.counts.failed(err)
		return
	}
	m.counts.mu.Lock()
	m.counts.finishes = append(m.counts.finishes, done)
	m.counts.mu.Unlock()
}

// reboot is the machine's turn between its Updating or Rebooting and its
// Ready: it leaves the machine in its new boot, nothing staged.
func (m *Machine) reboot() error {
	if m.o.Cordon {
		if err := m.cordon(true); err != nil {
			return err
		}
	}
	if m.o.PowerOff {
		if err := controlplane.SetNodePower(m.ctx, m.admin, m.name, false); err != nil {
			return fmt.Errorf("machine %s powering its Node off: %w", m.name, err)
		}
	}
	if m.o.RebootFor > 0 {
		select {
		case <-m.ctx.Done():
			return m.ctx.Err()
		case <-time.After(m.o.RebootFor):
		}
	}
	m.mu.Lock()
	m.boot++
	if m.target != "" {
		m.version = m.target
		m.slot = map[string]string{"A": "B", "B": "A"}[m.slot]
	} else {
		m.observed = m.request
	}
	m.requested = "" // a reboot was what it asked for
	m.target, m.change, m.request = "", "", ""
	boot := m.bootID()
	m.mu.Unlock()
	if m.o.PowerOff || m.o.Cordon {
		// Powered on: the Node reads NotReady until the new kubelet's
		// Ready.
		if err := controlplane.SetNodePower(m.ctx, m.admin, m.name, true); err != nil {
			return fmt.Errorf("machine %s: its Node back from the reboot: %w", m.name, err)
		}
	}
	if m.o.PowerOff {
		_ = m.renew()
	}
	if !m.o.SilentKubelet {
		// The kubelet of the new boot posts Ready with the boot's ID:
		// cluster-operator ends the turn only on a Ready from a new boot.
		if err := controlplane.PostNodeBoot(m.ctx, m.admin, m.name, boot); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("machine %s: its Node's Ready from the new boot: %w", m.name, err)
		}
	}
	if m.o.Cordon {
		return m.cordon(false)
	}
	return nil
}

// cordon marks the machine's Node unschedulable (recording that liken did)
// or lifts it, as the node daemon does around a turn.
func (m *Machine) cordon(on bool) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}},"spec":{"unschedulable":true}}`, likenv1.AnnotationCordoned)
	if !on {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null}},"spec":{"unschedulable":null}}`, likenv1.AnnotationCordoned)
	}
	_, err := m.core.Nodes().Patch(m.ctx, m.name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	m.counts.writes.Add(1)
	if err != nil {
		return fmt.Errorf("machine %s cordoning (%v) its Node: %w", m.name, on, err)
	}
	return nil
}
