// Package testutil builds Clusters, Machines and Nodes for controller
// tests, and makes the generated fake clientset refuse stale writes as the
// API server does.
package testutil

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clienttesting "k8s.io/client-go/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Epoch is the start of every test clock.
var Epoch = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// Version1 and Version2 are the releases tests move between.
const (
	Version1 = "2026.11.01-001"
	Version2 = "2026.11.20-001"
)

// Cluster returns a Cluster named name on Version1 with both versions
// catalogued, changed by opts. Its spec.disruption.settle is 0s, so that
// tests of other rules grant the next turn as soon as the workloads allow
// (Settle sets it; nil is the default).
func Cluster(name string, opts ...func(*likenv1.Cluster)) *likenv1.Cluster {
	c := &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, ResourceVersion: "1", Annotations: map[string]string{}},
		Spec: likenv1.ClusterSpec{
			Version: Version1,
			Releases: likenv1.ReleasesSpec{
				Source: "http://channel.invalid/liken",
				Catalog: []likenv1.CatalogEntry{
					{Version: Version1, Digest: "sha256:" + fmt.Sprintf("%064x", 1)},
					{Version: Version2, Digest: "sha256:" + fmt.Sprintf("%064x", 2)},
				},
			},
			Network:    likenv1.NetworkSpec{Endpoint: "https://10.0.0.1:6443"},
			Disruption: likenv1.DisruptionSpec{Settle: &metav1.Duration{}},
		},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// MaxUnavailable sets spec.disruption.maxUnavailable ("40%" or "2").
func MaxUnavailable(v string) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) {
		iv := intstr.Parse(v)
		c.Spec.Disruption.MaxUnavailable = &iv
	}
}

// Settle sets spec.disruption.settle; nil leaves it unset (the default).
func Settle(d *time.Duration) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) {
		c.Spec.Disruption.Settle = nil
		if d != nil {
			c.Spec.Disruption.Settle = &metav1.Duration{Duration: *d}
		}
	}
}

// TargetVersion sets spec.version.
func TargetVersion(v string) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) { c.Spec.Version = v }
}

// Windows sets spec.disruption.windows.
func Windows(ws ...likenv1.MaintenanceWindow) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) { c.Spec.Disruption.Windows = ws }
}

// Window is a maintenance window: days such as "Sat,Sun", start "HH:MM",
// duration, IANA time zone.
func Window(days, start string, d time.Duration, zone string) likenv1.MaintenanceWindow {
	return likenv1.MaintenanceWindow{Days: strings.Split(days, ","), Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: zone}
}

// Turns puts entries in the ledger.
func Turns(turns ...likenv1.RebootTurn) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) { c.Status.RebootTurns = append(c.Status.RebootTurns, turns...) }
}

// Turn is a ledger entry granted at at, for a machine built with Machine
// (its change and boot ID as Machine sets them); a Release turn is for
// Version2, the release WantsRelease stages.
func Turn(machine string, reason likenv1.TurnReason, leader bool, at time.Time) likenv1.RebootTurn {
	t := likenv1.RebootTurn{
		Machine: machine, Reason: reason, Change: "change-" + machine, Leader: leader,
		BootID: "boot-1-" + machine, GrantedAt: metav1.NewTime(at),
	}
	if reason == likenv1.TurnRelease {
		t.Version = Version2
	}
	return t
}

// Machine returns a Ready Auto worker of cluster "lab" on Version1,
// booted once, changed by opts.
func Machine(name string, opts ...func(*likenv1.Machine)) *likenv1.Machine {
	m := &likenv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{}},
		Spec:       likenv1.MachineSpec{Cluster: "lab", Role: likenv1.RoleWorker, RebootPolicy: likenv1.RebootAuto},
		Status: likenv1.MachineStatus{
			Phase:    likenv1.MachineReady,
			Version:  Version1,
			Observed: likenv1.ObservedState{BootID: "boot-1-" + name},
		},
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Leader makes the machine a leader.
func Leader(m *likenv1.Machine) { m.Spec.Role = likenv1.RoleLeader }

// Manual sets rebootPolicy Manual.
func Manual(m *likenv1.Machine) { m.Spec.RebootPolicy = likenv1.RebootManual }

// InCluster moves the machine to another cluster.
func InCluster(name string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Spec.Cluster = name }
}

// Runs sets status.version.
func Runs(v string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Status.Version = v }
}

// Phase sets status.phase.
func Phase(p likenv1.MachinePhase) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Status.Phase = p }
}

// WantsRelease stages a release: phase UpdatePending, change
// "change-<name>".
func WantsRelease(m *likenv1.Machine) {
	m.Status.Phase = likenv1.MachineUpdatePending
	m.Status.Change = "change-" + m.Name
	m.Status.Staged = Version2
}

// WantsReboot stages a change of class Reboot: phase RebootPending,
// change "change-<name>".
func WantsReboot(m *likenv1.Machine) {
	m.Status.Phase = likenv1.MachineRebootPending
	m.Status.Change = "change-" + m.Name
}

// WantsRestartK3s lists a change of class RestartK3s that waits for a
// turn, as a node daemon does: phase RebootPending, change
// "change-<name>".
func WantsRestartK3s(m *likenv1.Machine) {
	m.Status.Phase = likenv1.MachineRebootPending
	m.Status.Change = "change-" + m.Name
	m.Status.Pending = []likenv1.PendingChange{{Field: "cluster.spec.settings.k3sArgs", Class: likenv1.ClassRestartK3s}}
}

// WantsLive lists a change of class Live that waits for a Live turn.
func WantsLive(m *likenv1.Machine) {
	m.Status.Phase = likenv1.MachineRebootPending
	m.Status.Change = "change-" + m.Name
	m.Status.Pending = []likenv1.PendingChange{{Field: "cluster.spec.settings.sysctls", Class: likenv1.ClassLive}}
}

// Change sets status.change.
func Change(ch string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Status.Change = ch }
}

// Approve sets the liken.sh/approved-change annotation.
func Approve(ch string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationApprovedChange] = ch }
}

// Rebooted gives the machine a new boot ID.
func Rebooted(m *likenv1.Machine) { m.Status.Observed.BootID = "boot-2-" + m.Name }

// FinishedOn makes the machine Ready on v from a new boot, nothing staged.
func FinishedOn(v string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) {
		Rebooted(m)
		m.Status.Phase = likenv1.MachineReady
		m.Status.Version = v
		m.Status.Change = ""
		m.Status.Staged = ""
	}
}

// TrialFailed makes the machine report a failed trial from a new boot.
func TrialFailed(m *likenv1.Machine) {
	Rebooted(m)
	m.Status.Phase = likenv1.MachineDegraded
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: likenv1.ConditionTrialFailed, Status: metav1.ConditionTrue,
		Reason: "NoRejoin", Message: "the node did not rejoin within the trial timeout",
	})
}

// K3sRestartFailed makes the machine report a restart of k3s that was
// rolled back, as its node daemon does once its Node is Ready again on
// the configuration it ran before: Degraded, no change asked for.
func K3sRestartFailed(m *likenv1.Machine) {
	m.Status.Phase = likenv1.MachineDegraded
	m.Status.Change = ""
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type: likenv1.ConditionConfigApplied, Status: metav1.ConditionFalse, Reason: likenv1.ReasonK3sRestartFailed,
		Message: "the restart of k3s for cluster.spec.settings.k3sArgs did not bring the node back Ready within 10m0s",
	})
}

// Node returns a Node named name whose Ready condition is ready.
func Node(name string, ready bool, opts ...func(*corev1.Node)) *corev1.Node {
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

// Heartbeat sets the lastHeartbeatTime of the Node's Ready condition.
func Heartbeat(at time.Time) func(*corev1.Node) {
	return func(n *corev1.Node) {
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(at)
			}
		}
	}
}

// NodeBootID sets the boot ID the Node's kubelet reports.
func NodeBootID(id string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Status.NodeInfo.BootID = id }
}

// Cordoned marks the Node cordoned by liken for a turn (unschedulable,
// with the annotation liken.sh/cordoned).
func Cordoned(n *corev1.Node) {
	n.Spec.Unschedulable = true
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[likenv1.AnnotationCordoned] = "change-1"
}

// CordonedByPerson marks the Node unschedulable without liken's
// annotation, as kubectl cordon does.
func CordonedByPerson(n *corev1.Node) { n.Spec.Unschedulable = true }

// Tracker is what OptimisticUpdates needs of a fake clientset.
type Tracker interface {
	Tracker() clienttesting.ObjectTracker
	PrependReactor(verb, resource string, fn clienttesting.ReactionFunc)
}

// OptimisticUpdates makes updates of resource (status subresource
// included) behave as on the API server: a write whose resourceVersion
// differs from the stored one is refused with a conflict, and a write that
// passes bumps the resourceVersion.
func OptimisticUpdates(cs Tracker, resource string) {
	cs.PrependReactor("update", resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		ua := action.(clienttesting.UpdateAction)
		obj := ua.GetObject()
		acc, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		gvr := ua.GetResource()
		stored, err := cs.Tracker().Get(gvr, ua.GetNamespace(), acc.GetName())
		if err != nil {
			return true, nil, err
		}
		sacc, _ := meta.Accessor(stored)
		if acc.GetResourceVersion() != sacc.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), acc.GetName(),
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
		}
		rv, _ := strconv.Atoi(sacc.GetResourceVersion())
		obj = obj.DeepCopyObject()
		acc, _ = meta.Accessor(obj)
		acc.SetResourceVersion(strconv.Itoa(rv + 1))
		if err := cs.Tracker().Update(gvr, obj, ua.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
}

// Recorder is an events.EventRecorder that keeps each event as
// "<Kind>/<name> <type> <reason> <note>", so that a test sees which
// object an event is about.
type Recorder struct {
	mu     sync.Mutex
	events []string
}

// Eventf records the event.
func (r *Recorder) Eventf(regarding, _ runtime.Object, eventtype, reason, _ string, note string, args ...interface{}) {
	kind := reflect.TypeOf(regarding).Elem().Name()
	name := ""
	if o, ok := regarding.(metav1.Object); ok {
		name = o.GetName()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s/%s %s %s %s", kind, name, eventtype, reason, fmt.Sprintf(note, args...)))
}

// Take returns the events recorded since the last Take.
func (r *Recorder) Take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}
