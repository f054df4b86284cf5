// Package fleet reads a Cluster and its Machines the way the turn protocol sees them: who holds turns, who waits, and what blocks granting.
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

// Approved reports whether the machine's staged change carries a person's
// approval.
func Approved(m *v1alpha1.Machine) bool {
	return m.Status.Change != "" && m.Annotations[v1alpha1.AnnotationApprovedChange] == m.Status.Change
}

// IsLeader reports whether the machine is a leader.
func IsLeader(m *v1alpha1.Machine) bool { return m.Spec.Role == v1alpha1.RoleLeader }

// Before orders machines the way turns are granted: leaders first, then by
// name (byte order).
func Before(a, b *v1alpha1.Machine) bool {
	if IsLeader(a) != IsLeader(b) {
		return IsLeader(a)
	}
	return a.Name < b.Name
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

// Budget is where a cluster stands under its disruption budget.
type Budget struct {
	// Max is spec.disruption.maxUnavailable resolved for the cluster's size.
	Max int
	// MaxSpec is the value as written (such as "1" or "25%").
	MaxSpec string
	// Turns are the machines that hold a turn, in ledger order.
	Turns []string
	// Down are machines without a turn that are Lost; they count too.
	Down []string
	// Halt is why granting stopped, if it did.
	Halt *v1alpha1.RolloutHalt
	// Progressing is the cluster's Progressing condition, if any.
	Progressing *metav1.Condition
	// Window is where the cluster stands against its maintenance windows
	// when the budget was read.
	Window Window
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

// Used is how much of the budget is taken.
func (b Budget) Used() int { return len(b.Turns) + len(b.Down) }

// BudgetOf reads the budget of a cluster from its status and machines,
// and its maintenance windows at now.
func BudgetOf(c *v1alpha1.Cluster, members []*v1alpha1.Machine, now time.Time) (Budget, error) {
	b := Budget{MaxSpec: "1", Halt: c.Status.Halt, Window: WindowOf(c, now)}
	if mu := c.Spec.Disruption.MaxUnavailable; mu != nil {
		b.MaxSpec = mu.String()
	}
	max, err := c.Spec.Disruption.MaxUnavailableFor(len(members))
	if err != nil {
		return b, fmt.Errorf("cluster %s: spec.disruption.maxUnavailable: %w", c.Name, err)
	}
	b.Max = max
	held := map[string]bool{}
	for _, t := range c.Status.RebootTurns {
		b.Turns = append(b.Turns, t.Machine)
		held[t.Machine] = true
	}
	for _, m := range members {
		if m.Status.Phase == v1alpha1.MachineLost && !held[m.Name] {
			b.Down = append(b.Down, m.Name)
		}
	}
	b.Progressing = meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionProgressing)
	return b, nil
}

// HoldsTurn reports whether the machine is in the ledger.
func (b Budget) HoldsTurn(name string) bool {
	for _, t := range b.Turns {
		if t == name {
			return true
		}
	}
	return false
}

// Ahead lists the machines that wait for a turn and come before m in the
// grant order (leaders first, then by name).
func Ahead(m *v1alpha1.Machine, members []*v1alpha1.Machine, b Budget) []string {
	var out []*v1alpha1.Machine
	for _, o := range members {
		if o.Name == m.Name || b.HoldsTurn(o.Name) {
			continue
		}
		if (AwaitingTurn(o) || (AwaitingApproval(o) && Approved(o))) && Before(o, m) {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return Before(out[i], out[j]) })
	names := make([]string, 0, len(out))
	for _, o := range out {
		names = append(names, o.Name)
	}
	return names
}

// Blocked says why no turn can be granted now, or "" when turns can be
// granted.
func (b Budget) Blocked(c *v1alpha1.Cluster, release bool) string {
	switch {
	case b.Halt != nil && (b.Halt.Reason != v1alpha1.ReasonTrialFailed || release):
		return fmt.Sprintf("the rollout is halted (%s on %s): no turn is granted until a person resumes it with liken rollout resume %s", b.Halt.Reason, b.Halt.Machine, c.Name)
	case b.Max == 0:
		return "spec.disruption.maxUnavailable is " + b.MaxSpec + ": every turn is paused until it is raised"
	case len(b.Window.Errs) > 0:
		return b.Window.Note()
	case b.Progressing != nil && b.Progressing.Reason == v1alpha1.ReasonStartupGrace:
		return "cluster-operator has just started and grants no turn yet: " + printable.Text(b.Progressing.Message)
	}
	return ""
}
