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
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/rules"
)

// MachineOptions describe how a simulated machine behaves.
type MachineOptions struct {
	// Cluster is the name of the machine's Cluster.
	Cluster string
	// Version is the release the machine runs when it starts.
	Version string
	// Tick is how often the machine reads its Machine and Cluster and acts
	// (default 200ms).
	Tick time.Duration
	// RenewEvery is the period of its heartbeat, the renewal of its Node
	// Lease in kube-node-lease as a kubelet does it (default 1s).
	RenewEvery time.Duration
	// RebootFor is how long a reboot keeps the machine down: its Node is
	// powered off for that long. Zero: it is back at once.
	RebootFor time.Duration
	// SilentKubelet: the kubelet of a new boot posts nothing, so the Node
	// keeps the Ready of the last boot until the test posts one
	// (controlplane.PostNodeBoot). Otherwise, back from a reboot, the
	// machine posts its Node's Ready with the new boot's ID, as a kubelet
	// does when it starts.
	SilentKubelet bool
}

// since is the time every pending change and condition of a simulated
// machine reports, so that its status changes only when its state does.
var since = metav1.NewTime(time.Unix(1700000000, 0))

// Machine plays one machine's side of the turn protocol
// (docs/design/protocol.md) as system:node:<name>: it renews its Node
// Lease in kube-node-lease as its kubelet would, stages its Cluster's spec.version or a requested reboot, waits
// for approval (Manual) and for its turn, reports Updating or Rebooting
// when the ledger lists it, reboots and comes back Ready from a new boot.
type Machine struct {
	name  string
	o     MachineOptions
	cp    *controlplane.ControlPlane
	liken versioned.Interface
	kube  kubernetes.Interface

	// alive false: hung, no heartbeat and no status; the Node untouched.
	alive atomic.Bool
	// ticks counts the loop's iterations.
	ticks atomic.Int64

	mu        sync.Mutex
	version   string
	slot      string
	boot      int
	requested string // a reboot asked for with RequestReboot
	observed  string // the last reboot request acted on
	stayDown  bool   // takes its turn and never comes back
}

// StartMachine starts simulating the machine name until ctx ends. Its
// Machine, and its Node if RebootFor is set, must exist.
func StartMachine(ctx context.Context, t testing.TB, cp *controlplane.ControlPlane, name string, o MachineOptions) *Machine {
	t.Helper()
	if o.Tick == 0 {
		o.Tick = 200 * time.Millisecond
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = time.Second
	}
	m := &Machine{name: name, o: o, cp: cp, version: o.Version, slot: "A", boot: 1}
	cfg := cp.Config("system:node:" + name)
	var err error
	if m.liken, err = versioned.NewForConfig(cfg); err != nil {
		t.Fatalf("client of machine %s: %v", name, err)
	}
	if m.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatalf("client of machine %s: %v", name, err)
	}
	m.alive.Store(true)
	go m.run(ctx)
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

func (m *Machine) run(ctx context.Context) {
	tick := time.NewTicker(m.o.Tick)
	defer tick.Stop()
	var renewed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m.ticks.Add(1)
		if !m.alive.Load() {
			continue
		}
		if time.Since(renewed) >= m.o.RenewEvery && m.renew(ctx) == nil {
			renewed = time.Now()
		}
		m.step(ctx)
	}
}

// renew renews the machine's Node Lease, as the kubelet does (and takes it
// over from kwok, which renews only the Leases it holds).
func (m *Machine) renew(ctx context.Context) error {
	leases := m.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, m.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: m.name, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity = ptr.To(m.name)
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// step moves the machine one step towards what its Cluster wants.
func (m *Machine) step(ctx context.Context) {
	cur, err := m.liken.LikenV1alpha1().Machines().Get(ctx, m.name, metav1.GetOptions{})
	if err != nil {
		return
	}
	cl, err := m.liken.LikenV1alpha1().Clusters().Get(ctx, m.o.Cluster, metav1.GetOptions{})
	if err != nil {
		return
	}
	m.mu.Lock()
	want := likenv1.MachineStatus{Phase: likenv1.MachineReady, Version: m.version, Slot: m.slot,
		ObservedRebootRequest: m.observed, Observed: likenv1.ObservedState{BootID: m.bootID()}}
	request := m.requested
	if a := cur.Annotations[likenv1.AnnotationRequestReboot]; request == "" && a != m.observed {
		request = a
	}
	release := m.version != cl.Spec.Version
	stayDown := m.stayDown
	m.mu.Unlock()

	switch {
	case release:
		want.Phase, want.Staged = likenv1.MachineUpdatePending, cl.Spec.Version
		want.Change = fmt.Sprintf("release-%s-%s", cl.Spec.Version, want.Observed.BootID)
		want.Pending = []likenv1.PendingChange{{Field: "cluster.spec.version", Class: likenv1.ClassReboot, Since: since}}
	case request != "":
		want.Phase, want.Change = likenv1.MachineRebootPending, "reboot-"+request
	}
	if want.Change != "" {
		reason, msg := likenv1.ReasonAwaitingTurn, "waits for a reboot turn"
		if !rules.Cleared(cur, want.Change) {
			reason, msg = likenv1.ReasonAwaitingApproval, fmt.Sprintf("waits for approval: liken approve-reboot %s %s", m.o.Cluster, m.name)
		}
		want.Conditions = []metav1.Condition{{Type: likenv1.ConditionRebootPending, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: since}}
	} else {
		want.Conditions = []metav1.Condition{{Type: likenv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "runs " + want.Version, LastTransitionTime: since}}
	}

	if stayDown && (cur.Status.Phase == likenv1.MachineUpdating || cur.Status.Phase == likenv1.MachineRebooting) {
		return // down for good
	}
	for _, turn := range cl.Status.RebootTurns {
		if turn.Machine == m.name && want.Change != "" && turn.Change == want.Change {
			m.takeTurn(ctx, cur, want, release, cl.Spec.Version, request, stayDown)
			return
		}
	}
	got := cur.Status
	if got.Phase != want.Phase || got.Change != want.Change || got.Version != want.Version || got.Observed.BootID != want.Observed.BootID ||
		len(got.Conditions) == 0 || got.Conditions[0].Reason != want.Conditions[0].Reason || got.ObservedRebootRequest != want.ObservedRebootRequest {
		cur.Status = want
		_, _ = m.liken.LikenV1alpha1().Machines().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	}
}

// takeTurn reports Updating (a release) or Rebooting, goes down for
// RebootFor with its Node powered off, and comes back from a new boot on
// target; the next step reports Ready.
func (m *Machine) takeTurn(ctx context.Context, cur *likenv1.Machine, want likenv1.MachineStatus, release bool, target, request string, stayDown bool) {
	want.Phase = likenv1.MachineRebooting
	if release {
		want.Phase = likenv1.MachineUpdating
	}
	cur.Status = want
	if _, err := m.liken.LikenV1alpha1().Machines().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil || stayDown {
		return
	}
	if m.o.RebootFor > 0 {
		_ = m.cp.SetPower(ctx, m.name, false)
		select {
		case <-ctx.Done():
			return
		case <-time.After(m.o.RebootFor):
		}
	}
	m.mu.Lock()
	m.boot++
	if release {
		m.version = target
		m.slot = map[string]string{"A": "B", "B": "A"}[m.slot]
	} else {
		m.observed = request
	}
	m.requested = "" // a reboot was what it asked for
	boot := m.bootID()
	m.mu.Unlock()
	if m.o.RebootFor > 0 {
		_ = m.cp.SetPower(ctx, m.name, true)
		_ = m.renew(ctx)
	}
	if !m.o.SilentKubelet {
		// A machine without a Node has nothing to post to.
		_ = controlplane.PostNodeBoot(ctx, m.kube, m.name, boot)
	}
}
