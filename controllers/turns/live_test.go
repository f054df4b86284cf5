package turns

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	tu "liken.sh/liken/controllers/internal/testutil"
)

// A Live change (a sysctl, DNS or NTP servers, the CA bundle, registry
// mirrors) reaches the machines in turns under the disruption budget, as
// a restart of k3s does: a value that breaks a machine reaches at most
// maxUnavailable of them. No cordon, no drain, no approval.
func TestLiveGrants(t *testing.T) {
	pending := func(classes ...likenv1.DisruptionClass) func(*likenv1.Machine) {
		return func(m *likenv1.Machine) {
			m.Status.Phase, m.Status.Change, m.Status.Pending = likenv1.MachineRebootPending, "change-"+m.Name, nil
			for _, c := range classes {
				m.Status.Pending = append(m.Status.Pending, likenv1.PendingChange{Field: "a field of class " + string(c), Class: c})
			}
		}
	}
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		drains   map[string]Drain
		want     []string
		reason   likenv1.TurnReason
	}{
		{
			name:    "five workers, maxUnavailable 2: two apply at once",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.WantsLive), tu.Machine("w2", tu.WantsLive), tu.Machine("w3", tu.WantsLive),
				tu.Machine("w4", tu.WantsLive), tu.Machine("w5", tu.WantsLive)},
			want: []string{"w1", "w2"}, reason: likenv1.TurnLive,
		},
		{
			name:    "leaders apply one at a time, whatever the budget",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("100%")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsLive), tu.Machine("l2", tu.Leader, tu.WantsLive),
				tu.Machine("l3", tu.Leader, tu.WantsLive)},
			want: []string{"l1"}, reason: likenv1.TurnLive,
		},
		{
			name:     "a Manual machine needs no approval: nothing reboots",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.Manual, tu.WantsLive)},
			want:     []string{"w1"}, reason: likenv1.TurnLive,
		},
		{
			name:     "a drain a PodDisruptionBudget blocks does not hold a Live turn: nothing is drained",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.WantsLive)},
			drains:   map[string]Drain{"w1": {Needs: map[string][]string{"app/web": {"app/web-1"}}}},
			want:     []string{"w1"}, reason: likenv1.TurnLive,
		},
		{
			name:     "Live and RestartK3s changes waiting: the Live turn first",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("w1", pending(likenv1.ClassRestartK3s, likenv1.ClassLive))},
			want:     []string{"w1"}, reason: likenv1.TurnLive,
		},
		{
			name:     "a Reboot change waiting with a Live one: the Live turn first",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.Manual, pending(likenv1.ClassLive, likenv1.ClassReboot))},
			want:     []string{"w1"}, reason: likenv1.TurnLive,
		},
		{
			name:     "a release staged with a Live change waiting: the Live turn first",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("w1", pending(likenv1.ClassLive, likenv1.ClassReboot), func(m *likenv1.Machine) { m.Status.Staged = "2026.12.01-002" })},
			want:     []string{"w1"}, reason: likenv1.TurnLive,
		},
		{
			name: "a failed restart of k3s halts RestartK3s turns only",
			cluster: tu.Cluster("lab", func(c *likenv1.Cluster) {
				c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonK3sRestartFailed, Machine: "w1", Message: "Machine w1's restart of k3s failed"}
			}),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.WantsRestartK3s, tu.K3sRestartFailed), tu.Machine("w2", tu.WantsRestartK3s), tu.Machine("w3", tu.WantsLive)},
			want:     []string{"w3"}, reason: likenv1.TurnLive,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := input(tc.cluster, tc.machines, nil)
			in.Drains = tc.drains
			d := Decide(in)
			assert.DeepEqual(t, granted(d), tc.want)
			for _, g := range d.Granted {
				assert.Equal(t, g.Reason, tc.reason)
				assert.Equal(t, g.Version, "")
			}
		})
	}
}

func TestLiveTurnsEnd(t *testing.T) {
	granted := after.Add(-time.Minute)
	turn := tu.Turn("w1", likenv1.TurnLive, false, granted)
	done := func(m *likenv1.Machine) {
		m.Status.Phase, m.Status.Change, m.Status.Pending = likenv1.MachineReady, "", nil
	}
	// applyFailed is the machine as it reports a failed apply: Degraded,
	// still naming the turn's change.
	applyFailed := func(m *likenv1.Machine) {
		tu.WantsLive(m)
		m.Status.Phase = likenv1.MachineDegraded
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: likenv1.ConditionConfigApplied, Status: metav1.ConditionFalse,
			Reason: "ApplyFailed", Message: "sysctl net.core.somaxconn: invalid argument"})
	}
	ready := Node{State: fleet.NodeReady, Heartbeat: granted.Add(-30 * time.Second), BootID: "boot-1-w1"}
	cases := []struct {
		name    string
		machine *likenv1.Machine // nil: deleted
		node    Node
		result  Result // "" keeps the turn
	}{
		{name: "granted, not applied yet, keeps the turn", machine: tu.Machine("w1", tu.WantsLive), node: ready},
		{name: "applied, its Node Ready: finishes (no heartbeat after the grant needed: nothing restarted)", machine: tu.Machine("w1", done), node: ready, result: ResultFinished},
		{name: "applied, but its Node NotReady: keeps the turn", machine: tu.Machine("w1", done),
			node: Node{State: fleet.NodeNotReady, Heartbeat: after, BootID: "boot-1-w1"}},
		{name: "its apply failed: keeps the turn, so the value goes no further", machine: tu.Machine("w1", applyFailed), node: ready},
		{name: "the value corrected after its apply failed, asking for the new one: taken back", machine: tu.Machine("w1", tu.WantsLive, tu.Change("change-w1-corrected")),
			node: ready, result: ResultTakenBack},
		{name: "lost keeps the turn", machine: tu.Machine("w1", tu.Phase(likenv1.MachineLost))},
		{name: "deleted", result: ResultTakenBack},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decideHeldTurn(t, turn, tc.machine, tc.node, tc.result)
			assert.Assert(t, d.Halted == nil)
		})
	}
}

// TestAFailingLiveValueReachesOnlyTheBudget plays a sysctl that the
// machines refuse on four workers with maxUnavailable 1: the first
// machine's failure keeps its turn, no other machine gets one, and past
// the stall timeout the halt names the error.
func TestAFailingLiveValueReachesOnlyTheBudget(t *testing.T) {
	c := tu.Cluster("lab", tu.MaxUnavailable("1"))
	machines := []*likenv1.Machine{tu.Machine("w1", tu.WantsLive), tu.Machine("w2", tu.WantsLive), tu.Machine("w3", tu.WantsLive), tu.Machine("w4", tu.WantsLive)}
	nodes := map[string]Node{}
	for _, m := range machines {
		nodes[m.Name] = Node{State: fleet.NodeReady, Heartbeat: after, BootID: m.Status.Observed.BootID}
	}
	decide := func(now time.Time) Decision {
		in := input(c, machines, nodes)
		in.Now = now
		d := Decide(in)
		c = c.DeepCopy()
		c.Status = d.Status
		return d
	}
	d := decide(after)
	assert.DeepEqual(t, granted(d), []string{"w1"})
	machines[0].Status.Phase = likenv1.MachineDegraded // still naming the turn's change
	meta.SetStatusCondition(&machines[0].Status.Conditions, metav1.Condition{Type: likenv1.ConditionConfigApplied, Status: metav1.ConditionFalse, Reason: "ApplyFailed",
		Message: "live change of cluster.spec.settings.sysctls: sysctl net.ipv4.bad: this machine's kernel has no such parameter"})
	for _, at := range []time.Duration{time.Second, time.Minute, 10 * time.Minute} {
		d = decide(after.Add(at))
		assert.Assert(t, is.Len(d.Granted, 0), "after %s", at)
		assert.Equal(t, d.Status.Turns, "w1")
	}
	// Past the stall timeout, the halt names the error to fix.
	d = decide(after.Add(31 * time.Minute))
	assert.Assert(t, d.Halted != nil)
	assert.Equal(t, d.Halted.Machine, "w1")
	assert.Check(t, is.Contains(d.Halted.Message, "could not apply its change: live change of cluster.spec.settings.sysctls: sysctl net.ipv4.bad"))
	assert.Assert(t, is.Len(d.Granted, 0))
}
