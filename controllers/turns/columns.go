package turns

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/internal/metrics"
)

// Reasons of the Cluster's Ready condition.
const (
	// ReasonAllMachinesReady: every machine is Ready on spec.version.
	ReasonAllMachinesReady = "AllMachinesReady"
	// ReasonMachinesNotReady: some machine is not Ready on spec.version.
	ReasonMachinesNotReady = "MachinesNotReady"
	// ReasonNoMachines: the cluster has no Machine yet.
	ReasonNoMachines = "NoMachines"
)

// notReadyShown is how many machines the Ready condition names before it
// only counts the rest.
const notReadyShown = 8

// phases are counted by the machines-by-phase metric; a machine without a
// known phase counts as Unknown (the last entry).
var phases = []likenv1.MachinePhase{
	likenv1.MachineReady, likenv1.MachineDownloading, likenv1.MachineUpdatePending, likenv1.MachineRebootPending,
	likenv1.MachineUpdating, likenv1.MachineRebooting, likenv1.MachineLost, likenv1.MachineDegraded, "Unknown",
}

// countPhases sets the machines-by-phase metric of cluster.
func countPhases(m *metrics.Metrics, cluster string, machines []*likenv1.Machine) {
	var counts [9]int
	for _, x := range machines {
		i := len(phases) - 1
		for j, p := range phases[:len(phases)-1] {
			if x.Status.Phase == p {
				i = j
				break
			}
		}
		counts[i]++
	}
	for i, p := range phases {
		m.Machines.WithLabelValues(cluster, string(p)).Set(float64(counts[i]))
	}
}

// Columns brings the columns of st up to date for cluster c and its
// machines: phase, MACHINES, LEADERS, ENDPOINT, TURNS (from st's ledger),
// releases.newest, the Ready condition and observedGeneration. The other
// fields of st are kept. The turn controller applies it to the status it
// decided, so that the ledger and the columns go out in one write.
func Columns(st *likenv1.ClusterStatus, c *likenv1.Cluster, machines []*likenv1.Machine, now time.Time) {
	ready, settled, behind := 0, 0, 0
	var shown []string
	for _, m := range machines {
		onTarget := m.Status.Version == c.Spec.Version
		if onTarget && m.Status.Phase == likenv1.MachineReady {
			ready++
		} else {
			behind++
			if len(shown) < notReadyShown {
				shown = append(shown, describe(m, c.Spec.Version))
			}
		}
		if onTarget && m.Status.Change == "" && len(m.Status.Pending) == 0 {
			settled++
		}
	}
	st.Machines = fmt.Sprintf("%d/%d", ready, len(machines))
	st.Phase = likenv1.ClusterUpdating
	if settled == len(machines) && len(st.RebootTurns) == 0 {
		st.Phase = likenv1.ClusterReady
	}
	st.Leaders = fleet.Leaders(machines)
	st.Endpoint = c.Spec.Network.Endpoint
	st.Turns = fleet.TurnsString(st.RebootTurns)
	versions := make([]string, 0, len(c.Spec.Releases.Catalog))
	for _, e := range c.Spec.Releases.Catalog {
		versions = append(versions, e.Version)
	}
	st.Releases.Newest = fleet.NewestVersion(versions)
	st.ObservedGeneration = c.Generation

	cond := metav1.Condition{Type: likenv1.ConditionReady, ObservedGeneration: c.Generation}
	switch {
	case len(machines) == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoMachines
		cond.Message = fmt.Sprintf("No Machine names cluster %s in spec.cluster yet.", c.Name)
	case behind == 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonAllMachinesReady
		cond.Message = fmt.Sprintf("All %d machines are Ready on %s.", len(machines), c.Spec.Version)
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonMachinesNotReady
		list := strings.Join(shown, ", ")
		if behind > len(shown) {
			list += fmt.Sprintf(" and %d more", behind-len(shown))
		}
		cond.Message = fmt.Sprintf("%d of %d machines are not Ready on %s: %s.", behind, len(machines), c.Spec.Version, list)
	}
	fleet.SetCondition(&st.Conditions, cond, now)
}

// describe says in a few words where a machine stands.
func describe(m *likenv1.Machine, target string) string {
	phase := string(m.Status.Phase)
	if phase == "" {
		phase = "no status yet"
	}
	if m.Status.Version != "" && m.Status.Version != target {
		return fmt.Sprintf("%s (%s, runs %s)", m.Name, phase, m.Status.Version)
	}
	return fmt.Sprintf("%s (%s)", m.Name, phase)
}
