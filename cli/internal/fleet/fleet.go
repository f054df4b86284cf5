// Package fleet reads a Cluster and its Machines for the liken command: what each machine has staged and waits for, and what cluster-operator last said about the cluster's turns.
package fleet

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/printable"
	"liken.sh/liken/internal/window"
)

// Members returns the machines of the named cluster, sorted by name.
func Members(cluster string, all []*v1alpha1.Machine) []*v1alpha1.Machine {
	var out []*v1alpha1.Machine
	for _, m := range all {
		if m.Spec.Cluster == cluster {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// RebootPending is the machine's RebootPending condition, or nil.
func RebootPending(m *v1alpha1.Machine) *metav1.Condition {
	return meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRebootPending)
}

// AwaitingApproval reports whether the machine waits for a person to run
// liken approve-reboot.
func AwaitingApproval(m *v1alpha1.Machine) bool {
	c := RebootPending(m)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAwaitingApproval
}

// AwaitingTurn reports whether the machine waits for cluster-operator to
// grant it a turn (it needs no approval, or has it).
func AwaitingTurn(m *v1alpha1.Machine) bool {
	c := RebootPending(m)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAwaitingTurn
}

// StagedRelease reports whether the staged change includes a release.
func StagedRelease(m *v1alpha1.Machine) bool {
	for _, p := range m.Status.Pending {
		if p.Field == "cluster.spec.version" {
			return true
		}
	}
	return m.Status.Phase == v1alpha1.MachineUpdatePending || m.Status.Phase == v1alpha1.MachineUpdating
}

// DescribeChange says in a few words what a machine has staged: a release,
// changed fields, or a requested reboot.
func DescribeChange(m *v1alpha1.Machine) string {
	var parts []string
	if StagedRelease(m) {
		v := m.Status.Staged
		if v == "" {
			v = "a new release"
		}
		parts = append(parts, "release "+v)
	}
	var fields []string
	for _, p := range m.Status.Pending {
		if p.Field != "cluster.spec.version" {
			fields = append(fields, p.Field)
		}
	}
	if len(fields) > 0 {
		parts = append(parts, "changes to "+strings.Join(fields, ", "))
	}
	if r := m.Annotations[v1alpha1.AnnotationRequestReboot]; r != "" && r != m.Status.ObservedRebootRequest {
		parts = append(parts, "a requested reboot")
	}
	if len(parts) == 0 {
		return "a reboot"
	}
	return strings.Join(parts, " and ")
}

// Window is where a cluster stands against its maintenance windows
// (spec.disruption.windows) at a moment, read with the rule
// cluster-operator grants by.
type Window struct {
	// State is whether a window is open, and when it closes or the next
	// opens.
	State window.State
	// Errs say why the windows cannot be read; cluster-operator grants
	// nothing then.
	Errs field.ErrorList
	// Now is the moment.
	Now time.Time
}

// WindowOf reads the maintenance windows of c at now.
func WindowOf(c *v1alpha1.Cluster, now time.Time) Window {
	s, errs := window.Parse(c.Spec.Disruption.Windows)
	if len(errs) > 0 {
		return Window{Errs: errs, Now: now}
	}
	return Window{State: s.At(now), Now: now}
}

// Note says whether the maintenance windows are open, and when turns can be
// granted as far as they go, or "" for a cluster without windows.
func (w Window) Note() string {
	st := w.State
	switch {
	case len(w.Errs) > 0:
		return fmt.Sprintf("a maintenance window cannot be read (%s): cluster-operator grants no turn until spec.disruption.windows is fixed",
			printable.Text(w.Errs.ToAggregate().Error()))
	case st.Always:
		return ""
	case !st.Open:
		return fmt.Sprintf("closed now; turns wait for the next window, which opens %s, in %s",
			window.Format(st.Opens, st.Window.Location), window.Until(st.Opens, w.Now))
	case st.Closes.IsZero():
		return "open for the next 7 days or more"
	}
	return fmt.Sprintf("open until %s, %s from now; a turn not granted by then waits for the next window",
		window.Format(st.Closes, st.Window.Location), window.Until(st.Closes, w.Now))
}

// HoldsTurn is the machine's entry in the Cluster's turn ledger
// (status.rebootTurns), or nil.
func HoldsTurn(c *v1alpha1.Cluster, machine string) *v1alpha1.RebootTurn {
	for i := range c.Status.RebootTurns {
		if c.Status.RebootTurns[i].Machine == machine {
			return &c.Status.RebootTurns[i]
		}
	}
	return nil
}

// Progressing is the Cluster's Progressing condition: cluster-operator's
// word on whether turns are granted, and if not, why; nil before
// cluster-operator wrote one.
func Progressing(c *v1alpha1.Cluster) *metav1.Condition {
	return meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionProgressing)
}

// OperatorSays is the message of the Cluster's Progressing condition, made
// safe to print; "" when there is none.
func OperatorSays(c *v1alpha1.Cluster) string {
	p := Progressing(c)
	if p == nil {
		return ""
	}
	return printable.Text(strings.TrimSpace(p.Message))
}

// ClusterWide reports whether reason, a Progressing reason, stops turns for
// the whole cluster whatever each machine does: an approval or a new
// machine in line changes nothing cluster-operator says then.
func ClusterWide(reason string) bool {
	switch reason {
	case v1alpha1.ReasonPaused, v1alpha1.ReasonInvalidWindow, v1alpha1.ReasonStartupGrace,
		v1alpha1.ReasonRolloutStalled, v1alpha1.ReasonTrialFailed:
		return true
	}
	return false
}
