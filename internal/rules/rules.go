// Package rules holds the turn protocol's rules that cluster-operator, the node daemon and the liken command read the same way (docs/design/protocol.md).
package rules

import (
	"k8s.io/apimachinery/pkg/api/meta"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// IsLeader reports whether the machine's role is Leader: it runs the
// datastore and the control plane, updates before the workers in an
// upgrade, and is never down while another leader is.
func IsLeader(m *likenv1.Machine) bool { return m.Spec.Role == likenv1.RoleLeader }

// IsManual reports whether the machine waits for a person's approval
// before each reboot: its rebootPolicy is anything but Auto (Manual is the
// default).
func IsManual(m *likenv1.Machine) bool { return m.Spec.RebootPolicy != likenv1.RebootAuto }

// Approved reports whether a person approved exactly change: the
// machine's annotation liken.sh/approved-change equals it. An approval
// covers the change staged when it was given, never a later one.
func Approved(m *likenv1.Machine, change string) bool {
	return change != "" && m.Annotations[likenv1.AnnotationApprovedChange] == change
}

// Cleared reports whether the machine's reboot policy lets it take a turn
// for change: it is Auto, or a person approved exactly that change.
func Cleared(m *likenv1.Machine, change string) bool {
	return !IsManual(m) || Approved(m, change)
}

// Node is what the disruption budget reads of a machine's Node.
type Node struct {
	// Joined: a Node carries the machine's name. A machine without one
	// is not counted as NotReady: its heartbeat decides whether it reads
	// Lost.
	Joined bool
	// Ready: the Node's Ready condition is True.
	Ready bool
	// BootID is the boot the Node's kubelet last reported; "" when it
	// reports none.
	BootID string
}

// Unavailable reports whether a machine that holds no turn counts against
// maxUnavailable: it reads Lost; its heartbeat stopped for the lost-after
// duration although it may not read Lost yet (silent); it is a leader whose
// own control plane is not ready (its ControlPlaneReady condition is False:
// a member of the datastore down or still catching up); or its Node is
// NotReady, or Ready only by the word of an earlier boot (the kubelet
// reports a boot ID other than the machine's).
func Unavailable(m *likenv1.Machine, silent bool, node Node) bool {
	switch {
	case m.Status.Phase == likenv1.MachineLost || silent:
		return true
	case IsLeader(m) && meta.IsStatusConditionFalse(m.Status.Conditions, likenv1.ConditionControlPlaneReady):
		return true
	case !node.Joined:
		return false
	case !node.Ready:
		return true
	}
	return node.BootID != "" && m.Status.Observed.BootID != "" && node.BootID != m.Status.Observed.BootID
}

// GrantOrder puts machines in the order turns are granted: leaders first,
// then workers, each by name (byte order). machines must be sorted by
// name; the result is a new slice.
func GrantOrder(machines []*likenv1.Machine) []*likenv1.Machine {
	out := make([]*likenv1.Machine, 0, len(machines))
	for _, m := range machines {
		if IsLeader(m) {
			out = append(out, m)
		}
	}
	for _, m := range machines {
		if !IsLeader(m) {
			out = append(out, m)
		}
	}
	return out
}
