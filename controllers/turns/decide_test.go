package turns

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	tu "liken.sh/liken/controllers/internal/testutil"
	"liken.sh/liken/internal/rules"
)

// after is the test's "now": well past the startup grace.
var after = tu.Epoch.Add(time.Hour)

func input(c *likenv1.Cluster, machines []*likenv1.Machine, nodes map[string]Node) Input {
	return Input{Cluster: c, Machines: machines, Nodes: nodes, Now: after, GrantFrom: tu.Epoch.Add(40 * time.Second), Identity: "op-1"}
}

func granted(d Decision) []string {
	var out []string
	for _, t := range d.Granted {
		out = append(out, t.Machine)
	}
	return out
}

func progressing(t *testing.T, st likenv1.ClusterStatus) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, likenv1.ConditionProgressing)
	assert.Assert(t, c != nil, "no Progressing condition")
	return *c
}

func notReady(names ...string) map[string]Node {
	out := map[string]Node{}
	for _, n := range names {
		out[n] = Node{State: fleet.NodeNotReady}
	}
	return out
}

// staged sets status.staged.
func staged(v string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) { m.Status.Staged = v }
}

func TestBudget(t *testing.T) {
	onV2 := tu.Runs(tu.Version2)
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		nodes    map[string]Node
		want     []string
		reason   string
	}{
		{
			name:     "default budget is one machine",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c")},
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "integer two",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease)},
			want:     []string{"a", "b"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "forty percent of five is two",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("40%")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease),
				tu.Machine("d", tu.WantsRelease), tu.Machine("e", tu.WantsRelease)},
			want: []string{"a", "b"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "ten percent of five rounds up to one",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("10%")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease),
				tu.Machine("d", tu.WantsRelease), tu.Machine("e", tu.WantsRelease)},
			want: []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "zero pauses",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease)},
			want:     nil, reason: likenv1.ReasonPaused,
		},
		{
			name:     "zero percent pauses",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0%")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)},
			want:     nil, reason: likenv1.ReasonPaused,
		},
		{
			name:     "a held turn fills the budget",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("c", likenv1.TurnRelease, false, after))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating))},
			want:     nil, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a Lost machine without a turn counts",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.Phase(likenv1.MachineLost))},
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a Lost machine fills a budget of one",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("c", tu.Phase(likenv1.MachineLost))},
			want:     nil, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a NotReady node without a turn counts",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c")},
			nodes:    notReady("c"),
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a machine with no Node does not count",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c")},
			nodes:    map[string]Node{"a": {State: fleet.NodeReady}, "b": {State: fleet.NodeReady}},
			want:     []string{"a", "b"}, reason: likenv1.ReasonGranting,
		},
		{
			name: "a Lost machine that holds a turn counts once",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"),
				tu.Turns(tu.Turn("c", likenv1.TurnRelease, false, after))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.Phase(likenv1.MachineLost))},
			nodes:    notReady("c"),
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a NotReady machine asking for a turn costs nothing more",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsReboot), tu.Machine("b", tu.WantsReboot)},
			nodes:    notReady("b"),
			want:     []string{"b"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "one leader at a time whatever the budget",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("100%")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease), tu.Machine("l2", tu.Leader, tu.WantsRelease),
				tu.Machine("l3", tu.Leader, tu.WantsRelease)},
			want: []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "no leader while another leader is NotReady",
			cluster:  tu.Cluster("lab", tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot), tu.Machine("l2", tu.Leader), tu.Machine("w1", tu.WantsReboot)},
			nodes:    notReady("l2"),
			want:     []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no leader while another leader's own control plane is not ready",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot), tu.Machine("w1", tu.WantsReboot),
				tu.Machine("l2", tu.Leader, func(m *likenv1.Machine) {
					m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: likenv1.ConditionControlPlaneReady, Status: metav1.ConditionFalse})
				})},
			want: []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "no leader while another leader is Lost",
			cluster:  tu.Cluster("lab", tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot), tu.Machine("l2", tu.Leader, tu.Phase(likenv1.MachineLost))},
			want:     nil, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no leader while another leader holds a turn",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnReboot, true, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot, tu.Phase(likenv1.MachineRebooting)),
				tu.Machine("l2", tu.Leader, tu.WantsReboot), tu.Machine("w1", tu.WantsReboot)},
			want: []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a leader that is itself NotReady may take its turn",
			cluster: tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot), tu.Machine("l2", tu.Leader),
				tu.Machine("w1")},
			nodes: notReady("l1"),
			want:  []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "leaders before workers",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("a-worker", tu.WantsRelease), tu.Machine("z-leader", tu.Leader, tu.WantsRelease),
				tu.Machine("y-leader", tu.Leader, onV2)},
			want: []string{"z-leader"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "workers get Release turns once every leader runs the target",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("a-worker", tu.WantsRelease), tu.Machine("b-worker", tu.WantsRelease),
				tu.Machine("l1", tu.Leader, onV2), tu.Machine("l2", tu.Leader, onV2)},
			want: []string{"a-worker", "b-worker"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a leader behind holds back worker Release turns, not Reboot turns",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnRelease, true, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)),
				tu.Machine("w-release", tu.WantsRelease), tu.Machine("w-reboot", tu.WantsReboot)},
			want: []string{"w-reboot"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a leader in its trial holds back worker Release turns",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnRelease, true, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, tu.Rebooted, onV2, tu.Phase(likenv1.MachineUpdating)),
				tu.Machine("w1", tu.WantsRelease)},
			want: nil, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a leader Updating without a turn is not proven either",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, tu.Rebooted, onV2, tu.Phase(likenv1.MachineUpdating)),
				tu.Machine("w1", tu.WantsRelease)},
			want: nil, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a downgrade goes workers first",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version1), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, onV2, staged(tu.Version1)),
				tu.Machine("w1", tu.WantsRelease, onV2, staged(tu.Version1))},
			want: []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a downgrade reaches the leaders once every worker runs the target",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version1), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, onV2, staged(tu.Version1)),
				tu.Machine("w1", tu.FinishedOn(tu.Version1))},
			want: []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a Node Ready by the word of an earlier boot counts as NotReady",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.Rebooted)},
			nodes:    map[string]Node{"c": {State: fleet.NodeReady, BootID: "boot-1-c"}},
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "no leader while another leader's Node shows an earlier boot",
			cluster:  tu.Cluster("lab", tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.Rebooted), tu.Machine("l2", tu.Leader, tu.WantsReboot), tu.Machine("w1", tu.WantsReboot)},
			nodes:    map[string]Node{"l1": {State: fleet.NodeReady, BootID: "boot-1-l1"}},
			want:     []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a Node Ready from the machine's boot does not count",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.Rebooted)},
			nodes:    map[string]Node{"c": {State: fleet.NodeReady, BootID: "boot-2-c"}},
			want:     []string{"a", "b"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "byte order of names within a group",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-2", tu.WantsRelease), tu.Machine("node-10", tu.WantsRelease), tu.Machine("Node-3", tu.WantsRelease)},
			want:     []string{"Node-3"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no Release turn for a release staged for an earlier target",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease, staged("2026.11.10-001")), tu.Machine("b", tu.WantsRelease, staged("")),
				tu.Machine("c", tu.WantsRelease)},
			want: []string{"c"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no Release turn for a leader with an earlier target staged",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRelease, staged(tu.Version1)),
				tu.Machine("w1", tu.WantsRelease), tu.Machine("w2", tu.WantsReboot, staged(tu.Version1))},
			want: []string{"w2"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "manual machine without approval waits",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Manual, tu.WantsRelease)},
			want:     nil, reason: likenv1.ReasonIdle,
		},
		{
			name:     "approval of an earlier change does not approve a newer one",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Manual, tu.WantsRelease, tu.Approve("change-old"))},
			want:     nil, reason: likenv1.ReasonIdle,
		},
		{
			name:     "approval of the staged change grants",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Manual, tu.WantsRelease, tu.Approve("change-a")), tu.Machine("b", tu.WantsRelease)},
			want:     []string{"a"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "nothing staged, nothing granted",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a"), tu.Machine("b", tu.Phase(likenv1.MachineDownloading))},
			want:     nil, reason: likenv1.ReasonIdle,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cluster.DeepCopy()
			d := Decide(input(tc.cluster, tc.machines, tc.nodes))
			assert.DeepEqual(t, granted(d), tc.want)
			assert.DeepEqual(t, tc.cluster, before) // the input is never changed
			assert.Equal(t, progressing(t, d.Status).Reason, tc.reason)
			assert.Equal(t, d.Status.Turns, fleet.TurnsString(d.Status.RebootTurns))
			for _, g := range d.Granted {
				var m *likenv1.Machine
				for _, x := range tc.machines {
					if x.Name == g.Machine {
						m = x
					}
				}
				assert.Equal(t, g.Change, m.Status.Change)
				assert.Equal(t, g.BootID, m.Status.Observed.BootID)
				assert.Equal(t, g.Leader, rules.IsLeader(m))
				assert.Equal(t, g.GrantedAt.Time, after)
				if g.Reason == likenv1.TurnRelease {
					assert.Equal(t, g.Version, m.Status.Staged, "a Release turn records the release it is for")
				}
			}
		})
	}
}

func TestSilentMachineCountsBeforeItReadsLost(t *testing.T) {
	// At the end of the startup grace the liveness verdict and the first
	// grant are due together: a silent machine must count either way.
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	machines := []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b")}
	in := input(c, machines, nil)
	in.Silent = map[string]bool{"b": true}
	d := Decide(in)
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, progressing(t, d.Status).Message,
		"Down without a turn (Lost, silent, NotReady, or a leader whose control plane is not ready; they count against maxUnavailable 1): b. Waiting for a turn: a.")

	// A silent machine that asked for a turn before it went quiet does not
	// get one: it could not act on it.
	machines = append(machines, tu.Machine("c", tu.WantsRelease))
	in = input(c, machines, nil)
	in.Silent = map[string]bool{"c": true}
	d = Decide(in)
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, progressing(t, d.Status).Message,
		"Down without a turn (Lost, silent, NotReady, or a leader whose control plane is not ready; they count against maxUnavailable 1): c. Waiting for a turn: a.")
}

func TestPausedSaysWhatToDo(t *testing.T) {
	d := Decide(input(tu.Cluster("lab", tu.MaxUnavailable("0")), []*likenv1.Machine{tu.Machine("a", tu.WantsReboot)}, nil))
	c := progressing(t, d.Status)
	assert.Equal(t, c.Status, metav1.ConditionFalse)
	assert.Assert(t, is.Contains(c.Message, "maxUnavailable is 0"))
}

func TestGrantsRespectBudgetOverSuccessiveDecisions(t *testing.T) {
	// Repeated decisions never push the ledger over the budget, and never
	// hold two leaders, whatever order machines finish in.
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"))
	machines := []*likenv1.Machine{
		tu.Machine("l1", tu.Leader, tu.WantsRelease), tu.Machine("l2", tu.Leader, tu.WantsRelease), tu.Machine("l3", tu.Leader, tu.WantsRelease),
		tu.Machine("w1", tu.WantsRelease), tu.Machine("w2", tu.WantsRelease), tu.Machine("w3", tu.WantsRelease),
	}
	var order []string
	for round := 0; round < 20 && len(order) < len(machines); round++ {
		d := Decide(input(c, machines, nil))
		c = c.DeepCopy()
		c.Status = d.Status
		assert.Assert(t, len(c.Status.RebootTurns) <= 2, "ledger over budget: %v", c.Status.Turns)
		leaders := 0
		for _, tr := range c.Status.RebootTurns {
			if tr.Leader {
				leaders++
			}
		}
		assert.Assert(t, leaders <= 1, "two leaders hold turns: %v", c.Status.Turns)
		// Every machine in the ledger finishes before the next decision.
		for i, m := range machines {
			if fleet.FindTurn(c.Status.RebootTurns, m.Name) != nil {
				machines[i] = tu.Machine(m.Name, func(x *likenv1.Machine) { x.Spec = m.Spec }, tu.FinishedOn(tu.Version2))
				order = append(order, m.Name)
			}
		}
	}
	assert.DeepEqual(t, order, []string{"l1", "l2", "l3", "w1", "w2", "w3"})
}

func TestTurnsEnd(t *testing.T) {
	granted := after.Add(-time.Minute)
	// back is a Node whose kubelet posted Ready after the grant from the
	// machine's new boot.
	back := Node{State: fleet.NodeReady, Heartbeat: after, BootID: "boot-2-a"}
	// legacy is a Release turn granted by a cluster-operator that did not
	// record the turn's release.
	legacy := tu.Turn("a", likenv1.TurnRelease, false, granted)
	legacy.Version = ""
	cases := []struct {
		name    string
		turn    likenv1.RebootTurn
		machine *likenv1.Machine // nil: deleted
		node    Node
		result  Result // "" keeps the turn
		message string
		proved  string // the release a finished Release turn proved
	}{
		{name: "ready from a new boot finishes", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.FinishedOn(tu.Version2)), result: ResultFinished, message: "Ready on " + tu.Version2, proved: tu.Version2},
		{name: "ready from a new boot with its Node back finishes", turn: tu.Turn("a", likenv1.TurnRelease, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version2)), node: back, result: ResultFinished, message: "Ready on " + tu.Version2, proved: tu.Version2},
		{name: "a simulated Node without boot ID is back with a heartbeat after the grant", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeReady, Heartbeat: after},
			result: ResultFinished, message: "Ready on " + tu.Version1},
		{name: "a leader whose Node is Ready with a heartbeat from before the grant keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version2)), node: Node{State: fleet.NodeReady, Heartbeat: granted.Add(-10 * time.Second), BootID: "boot-2-a"}},
		{name: "a leader whose Node is Ready in the same second as the grant keeps the turn", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeReady, Heartbeat: granted}},
		{name: "a leader whose Node reports a new boot, Ready in the same second as the grant, finishes", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeReady, Heartbeat: granted, BootID: "boot-2-a"},
			result: ResultFinished, message: "Ready on " + tu.Version1},
		{name: "a leader whose Node reports a new boot but a Ready from before the grant keeps the turn", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeReady, Heartbeat: granted.Add(-time.Second), BootID: "boot-2-a"}},
		{name: "a leader whose Node reports the boot of the grant keeps the turn", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeReady, Heartbeat: after, BootID: "boot-1-a"}},
		{name: "a leader whose Node is NotReady keeps the turn", turn: tu.Turn("a", likenv1.TurnReboot, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version1)), node: Node{State: fleet.NodeNotReady, Heartbeat: after, BootID: "boot-2-a"}},
		{name: "a worker whose Node is Ready from before the grant keeps the turn too", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.FinishedOn(tu.Version2)), node: Node{State: fleet.NodeReady, Heartbeat: granted.Add(-time.Second)}},
		{name: "ready from a new boot on the old release is a failed trial", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.FinishedOn(tu.Version1)), node: back, result: ResultTrialFailed,
			message: "back from a new boot on release " + tu.Version1 + ", not on " + tu.Version2},
		{name: "back downloading with nothing staged on the old release is a failed trial", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Rebooted, tu.Phase(likenv1.MachineDownloading), tu.Change("")), node: back, result: ResultTrialFailed,
			message: "and reports Downloading"},
		{name: "back downloading another release on the turn's release finishes", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Rebooted, tu.Runs(tu.Version2), tu.Phase(likenv1.MachineDownloading), tu.Change("")), node: back,
			result: ResultFinished, message: "downloading another release", proved: tu.Version2},
		{name: "a Release turn recorded without its release, back on spec.version, proves spec.version", turn: legacy,
			machine: tu.Machine("a", tu.FinishedOn(tu.Version2)), result: ResultFinished, message: "Ready on " + tu.Version2, proved: tu.Version2},
		{name: "a Release turn recorded without its release, back on another release, is a failed trial of spec.version", turn: legacy,
			machine: tu.Machine("a", tu.FinishedOn(tu.Version1)), result: ResultTrialFailed,
			message: "back from a new boot on release " + tu.Version1 + ", not on " + tu.Version2 + ", and reports Ready; the turn, granted by an older cluster-operator, recorded no release"},
		{name: "back from a new boot with the same change asking keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.Rebooted), node: back},
		{name: "degraded before it started gives the turn back", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Phase(likenv1.MachineDegraded), degradedBecause("apply failed: sysctl net.core.somaxconn")),
			result:  ResultTakenBack, message: "it is Degraded (apply failed: sysctl net.core.somaxconn)"},
		{name: "degraded with its change still reported gives the turn back", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineDegraded)), result: ResultTakenBack, message: "Degraded"},
		{name: "degraded after liken cordoned keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Phase(likenv1.MachineDegraded)), node: Node{State: fleet.NodeReady, CordonedByLiken: true}},
		{name: "ready from a new boot but still cordoned by liken keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.FinishedOn(tu.Version2)), node: Node{State: fleet.NodeReady, CordonedByLiken: true}},
		{name: "ready from the same boot keeps the turn of a started machine", turn: tu.Turn("a", likenv1.TurnReboot, false, granted),
			machine: tu.Machine("a", tu.WantsReboot, tu.Phase(likenv1.MachineRebooting))},
		{name: "back from a new boot with another change staged finishes", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsReboot, tu.Runs(tu.Version2), tu.Change("change-newer"), tu.Rebooted), result: ResultFinished, message: "another change staged", proved: tu.Version2},
		{name: "back from a new boot with another change but still cordoned by liken keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsReboot, tu.Runs(tu.Version2), tu.Change("change-newer"), tu.Rebooted), node: Node{State: fleet.NodeReady, CordonedByLiken: true, Heartbeat: after}},
		{name: "failed trial ends the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.TrialFailed), result: ResultTrialFailed, message: "NoRejoin"},
		{name: "a failed trial ends the turn without waiting for the Node", turn: tu.Turn("a", likenv1.TurnRelease, true, granted),
			machine: tu.Machine("a", tu.Leader, tu.WantsRelease, tu.TrialFailed), node: Node{State: fleet.NodeReady, Heartbeat: granted.Add(-time.Minute), BootID: "boot-1-a"},
			result: ResultTrialFailed, message: "NoRejoin"},
		{name: "deleted machine without a Node", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			result: ResultTakenBack, message: "the Machine was deleted, and it has no Node"},
		{name: "deleted machine whose Node is down keeps its place", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			node: Node{State: fleet.NodeNotReady, BootID: "boot-1-a"}},
		{name: "deleted machine draining (its Node cordoned by liken, same boot) keeps its place", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			node: Node{State: fleet.NodeReady, CordonedByLiken: true, Heartbeat: after, BootID: "boot-1-a"}},
		{name: "deleted machine back from a new boot, still cordoned, ends", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			node:   Node{State: fleet.NodeReady, CordonedByLiken: true, Heartbeat: after, BootID: "boot-2-a"},
			result: ResultTakenBack, message: "the Machine was deleted, and its Node is Ready"},
		{name: "deleted machine whose Node is Ready, not cordoned, ends", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			node:   Node{State: fleet.NodeReady, Heartbeat: granted.Add(-time.Minute), BootID: "boot-1-a"},
			result: ResultTakenBack, message: "the Machine was deleted, and its Node is Ready"},
		{name: "new staged change before start", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.Change("change-newer")), result: ResultTakenBack, message: `now "change-newer"`},
		{name: "new staged change while liken's cordon is on its Node keeps the turn until the machine lifts it", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.Change("change-newer")), node: Node{State: fleet.NodeReady, CordonedByLiken: true, BootID: "boot-1-a"}},
		{name: "need vanished while liken's cordon is on its Node keeps the turn", turn: tu.Turn("a", likenv1.TurnReboot, false, granted),
			machine: tu.Machine("a", tu.Phase(likenv1.MachineReady)), node: Node{State: fleet.NodeReady, CordonedByLiken: true, BootID: "boot-1-a"}},
		{name: "approval withdrawn while liken's cordon is on its Node keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Manual, tu.WantsRelease), node: Node{State: fleet.NodeReady, CordonedByLiken: true, BootID: "boot-1-a"}},
		{name: "need vanished before start", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Phase(likenv1.MachineDownloading)), result: ResultTakenBack, message: "no longer has anything staged"},
		{name: "approval withdrawn before start", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Manual, tu.WantsRelease), result: ResultTakenBack, message: "approval"},
		{name: "approval withdrawn after start keeps the turn", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Manual, tu.WantsRelease, tu.Phase(likenv1.MachineUpdating))},
		{name: "lost while holding the turn keeps it", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineLost))},
		{name: "approved manual machine not yet started keeps it", turn: tu.Turn("a", likenv1.TurnRelease, false, granted),
			machine: tu.Machine("a", tu.Manual, tu.WantsRelease, tu.Approve("change-a"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var machines []*likenv1.Machine
			nodes := map[string]Node{tc.turn.Machine: tc.node}
			if tc.machine != nil {
				machines = append(machines, tc.machine)
			}
			// maxUnavailable 0: nothing new is granted, only endings show.
			c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0"), tu.Turns(tc.turn))
			d := Decide(input(c, machines, nodes))
			if tc.result == "" {
				assert.Equal(t, len(d.Ended), 0)
				assert.Equal(t, d.Status.Turns, tc.turn.Machine)
				return
			}
			assert.Equal(t, len(d.Ended), 1)
			assert.Equal(t, d.Ended[0].Result, tc.result)
			assert.Assert(t, is.Contains(d.Ended[0].Message, tc.message))
			assert.Equal(t, d.Ended[0].Proved, tc.proved)
			assert.Equal(t, len(d.Status.RebootTurns), 0)
			assert.Equal(t, d.Status.Turns, "")
		})
	}
}

// degradedBecause makes the machine's Ready condition say why it is
// Degraded, as the node daemon writes it.
func degradedBecause(msg string) func(*likenv1.Machine) {
	return func(m *likenv1.Machine) {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type: likenv1.ConditionReady, Status: metav1.ConditionFalse, Reason: string(likenv1.MachineDegraded), Message: msg,
		})
	}
}

func TestStall(t *testing.T) {
	grantedAt := after.Add(-31 * time.Minute)
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, grantedAt)))
	machines := []*likenv1.Machine{tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)), tu.Machine("b", tu.WantsRelease)}

	d := Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Granted), 0, "a stalled rollout grants nothing")
	assert.Assert(t, d.Status.Halt != nil)
	assert.Equal(t, d.Status.Halt.Reason, likenv1.ReasonRolloutStalled)
	assert.Equal(t, d.Status.Halt.Machine, "a")
	assert.Assert(t, d.Halted != nil)
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Status, metav1.ConditionFalse)
	assert.Equal(t, cond.Reason, likenv1.ReasonRolloutStalled)
	assert.Assert(t, is.Contains(cond.Message, "Machine a has held"))
	assert.Assert(t, is.Contains(cond.Message, "liken rollout resume lab"))
	assert.Equal(t, d.Status.Turns, "a", "the stalled turn stays in the ledger")

	// Deciding again changes nothing.
	c.Status = d.Status
	again := Decide(input(c, machines, nil))
	assert.DeepEqual(t, again.Status, d.Status)
	assert.Assert(t, again.Halted == nil)

	// The machine comes back: its turn ends, the halt lifts, b gets a turn.
	machines[0] = tu.Machine("a", tu.FinishedOn(tu.Version2))
	back := Decide(input(c, machines, nil))
	assert.Assert(t, back.Status.Halt == nil)
	assert.Assert(t, back.Lifted != nil)
	assert.DeepEqual(t, granted(back), []string{"b"})
}

// TestStallNamesNewKernelArguments: a machine that has not come back
// from a reboot that passes new kernel arguments is halted on with what to
// do about them; a turn without them, or an in-place one, does not say so.
func TestStallNamesNewKernelArguments(t *testing.T) {
	kernelArgs := func(m *likenv1.Machine) {
		m.Status.Pending = append(m.Status.Pending, likenv1.PendingChange{Field: likenv1.PendingKernelArgs, Class: likenv1.ClassReboot})
	}
	for _, tc := range []struct {
		name   string
		reason likenv1.TurnReason
		edits  []func(*likenv1.Machine)
		want   bool
	}{
		{name: "a reboot with new kernel arguments", reason: likenv1.TurnReboot, edits: []func(*likenv1.Machine){tu.WantsReboot, kernelArgs}, want: true},
		{name: "a release with new kernel arguments", reason: likenv1.TurnRelease, edits: []func(*likenv1.Machine){tu.WantsRelease, kernelArgs}, want: true},
		{name: "a reboot without", reason: likenv1.TurnReboot, edits: []func(*likenv1.Machine){tu.WantsReboot}},
		{name: "a restart of k3s", reason: likenv1.TurnRestartK3s, edits: []func(*likenv1.Machine){tu.WantsRestartK3s, kernelArgs}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("a", tc.reason, false, after.Add(-31*time.Minute))))
			d := Decide(input(c, []*likenv1.Machine{tu.Machine("a", tc.edits...)}, nil))
			assert.Assert(t, d.Status.Halt != nil && d.Status.Halt.Reason == likenv1.ReasonRolloutStalled, "halt %+v", d.Status.Halt)
			msg := progressing(t, d.Status).Message
			assert.Equal(t, strings.Contains(msg, "new kernel arguments"), tc.want, msg)
			assert.Equal(t, strings.Contains(msg, "delete liken-args.cfg"), tc.want, msg)
		})
	}
}

func TestStallDeadlineRequeues(t *testing.T) {
	c := tu.Cluster("lab", tu.Turns(tu.Turn("a", likenv1.TurnReboot, false, after.Add(-10*time.Minute))))
	d := Decide(input(c, []*likenv1.Machine{tu.Machine("a", tu.WantsReboot, tu.Phase(likenv1.MachineRebooting))}, nil))
	assert.Equal(t, d.RequeueAfter, 20*time.Minute)
	assert.Assert(t, d.Status.Halt == nil)
}

func TestResumeReleasesStalledTurn(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Hour))))
	machines := []*likenv1.Machine{tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineLost)), tu.Machine("b", tu.WantsRelease)}
	d := Decide(input(c, machines, nil))
	c.Status = d.Status
	assert.Equal(t, c.Status.Halt.Reason, likenv1.ReasonRolloutStalled)

	c.Annotations[likenv1.AnnotationResumeRollout] = "2026-11-30T11:00:00Z"
	d = Decide(input(c, machines, nil))
	assert.Equal(t, d.Status.ObservedResume, "2026-11-30T11:00:00Z")
	assert.Assert(t, d.Status.Halt == nil)
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, ResultReleased)
	assert.Equal(t, d.Ended[0].Turn.Machine, "a")
	// a is Lost without a turn now: it fills the budget of one.
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, d.Status.Turns, "")

	// The same annotation value is not a new request.
	c.Status = d.Status
	machines[0] = tu.Machine("a", tu.WantsRelease)
	c.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Hour))}
	d = Decide(input(c, machines, nil))
	assert.Equal(t, d.Status.Halt.Reason, likenv1.ReasonRolloutStalled, "an old resume value does not resume again")
}

func TestTrialFailedHaltsReleaseTurns(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-5*time.Minute))))
	machines := []*likenv1.Machine{
		tu.Machine("a", tu.WantsRelease, tu.TrialFailed),
		tu.Machine("b", tu.WantsRelease),
		tu.Machine("c", tu.WantsReboot),
	}
	d := Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, ResultTrialFailed)
	assert.Assert(t, d.Status.Halt != nil)
	assert.Equal(t, d.Status.Halt.Reason, likenv1.ReasonTrialFailed)
	assert.Equal(t, d.Status.Halt.Machine, "a")
	assert.Equal(t, d.Status.Halt.Version, tu.Version2)
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Status, metav1.ConditionFalse)
	assert.Equal(t, cond.Reason, likenv1.ReasonTrialFailed)
	assert.Assert(t, is.Contains(cond.Message, "trial boot of release "+tu.Version2+" on machine a failed"))
	assert.Assert(t, is.Contains(cond.Message, "NoRejoin"))
	assert.DeepEqual(t, granted(d), []string{"c"}) // Reboot turns go on

	// Still halted while spec.version stays.
	c.Status = d.Status
	machines[2] = tu.Machine("c", tu.FinishedOn(tu.Version1))
	c.Status.RebootTurns = nil
	d = Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, d.Status.Halt.Reason, likenv1.ReasonTrialFailed)

	t.Run("a new spec.version lifts it", func(t *testing.T) {
		c := c.DeepCopy()
		c.Spec.Version = "2026.11.25-001"
		d := Decide(input(c, machines, nil))
		assert.Assert(t, d.Status.Halt == nil)
		assert.Assert(t, is.Contains(d.LiftedBecause, "spec.version changed"))
		// b still has the previous target staged: no Release turn yet.
		assert.Equal(t, len(d.Granted), 0)

		// Once b staged the new target, it gets its turn.
		c.Status = d.Status
		machines := slices.Clone(machines)
		machines[1] = tu.Machine("b", tu.WantsRelease, staged(c.Spec.Version), tu.Change("change-b2"))
		d = Decide(input(c, machines, nil))
		assert.DeepEqual(t, granted(d), []string{"b"})
	})
	t.Run("a resume lifts it", func(t *testing.T) {
		c := c.DeepCopy()
		c.Annotations[likenv1.AnnotationResumeRollout] = "now"
		d := Decide(input(c, machines, nil))
		assert.Assert(t, d.Status.Halt == nil)
		assert.Equal(t, d.Status.ObservedResume, "now")
		assert.DeepEqual(t, granted(d), []string{"b"})
		assert.Equal(t, progressing(t, d.Status).Reason, likenv1.ReasonGranting)
	})
}

func TestStartupGrace(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	machines := []*likenv1.Machine{tu.Machine("a", tu.WantsRelease)}
	in := input(c, machines, nil)
	in.Now = tu.Epoch.Add(25 * time.Second)
	d := Decide(in)
	assert.Equal(t, len(d.Granted), 0)
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Status, metav1.ConditionFalse)
	assert.Equal(t, cond.Reason, likenv1.ReasonStartupGrace)
	assert.Assert(t, is.Contains(cond.Message, "until 2026-11-30T10:00:40Z"), cond.Message)
	assert.Equal(t, d.RequeueAfter, 15*time.Second)

	in.Now = tu.Epoch.Add(40 * time.Second)
	d = Decide(in)
	assert.DeepEqual(t, granted(d), []string{"a"})
	assert.Equal(t, progressing(t, d.Status).Reason, likenv1.ReasonGranting)

	// A grace ending within a second is announced at the next whole second.
	in.GrantFrom = tu.Epoch.Add(40*time.Second + 300*time.Millisecond)
	in.Now = tu.Epoch.Add(time.Second)
	assert.Assert(t, is.Contains(progressing(t, Decide(in).Status).Message, "until 2026-11-30T10:00:41Z"))
}

func TestGrantingMessage(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	d := Decide(input(c, []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}, nil))
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Status, metav1.ConditionTrue)
	assert.Equal(t, cond.Message, "Holding a turn: a (maxUnavailable 1). Waiting for a turn: b.")
	assert.Assert(t, !strings.Contains(cond.Message, "  "))
}

// Workers waiting behind a leader must be told which leader and why, or a
// person reading "Waiting for a turn" cannot tell what to do.
func TestWorkersWaitingBehindALeaderSayWhy(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"))
	machines := []*likenv1.Machine{
		tu.Machine("leader-1", tu.Leader, tu.Manual, tu.WantsRelease),
		tu.Machine("leader-2", tu.Leader, tu.FinishedOn(tu.Version2)),
		tu.Machine("worker-1", tu.WantsRelease),
	}
	d := Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, progressing(t, d.Status).Message, "Waiting for a turn: worker-1. Workers update to "+tu.Version2+
		" after every leader runs it; leaders not on it yet: leader-1 (UpdatePending, waits for `liken approve-reboot lab leader-1`).")

	// Approved, the leader takes its turn; the worker still waits for it.
	machines[0] = tu.Machine("leader-1", tu.Leader, tu.Manual, tu.WantsRelease, tu.Approve("change-leader-1"))
	d = Decide(input(c, machines, nil))
	assert.Equal(t, fleet.TurnsString(d.Granted), "leader-1")
	assert.Assert(t, is.Contains(progressing(t, d.Status).Message, "leaders not on it yet: leader-1 (UpdatePending)."))

	// With every leader on the target, nothing is added.
	machines[0] = tu.Machine("leader-1", tu.Leader, tu.FinishedOn(tu.Version2))
	d = Decide(input(c, machines, nil))
	assert.Assert(t, !strings.Contains(progressing(t, d.Status).Message, "leaders not on it"))
}

// After a retarget, the failure of the earlier target's trial is reported
// but does not halt the rollout of the new one: the halt names the
// release that failed, and only a failure of spec.version halts.
func TestTrialFailedHaltNamesTheReleaseThatFailed(t *testing.T) {
	const version3 = "2026.11.28-001"
	c := tu.Cluster("lab", tu.TargetVersion(version3), tu.MaxUnavailable("2"), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-5*time.Minute))))
	machines := []*likenv1.Machine{
		tu.Machine("a", tu.WantsRelease, tu.TrialFailed),
		tu.Machine("b", tu.WantsRelease, staged(version3)),
	}
	d := Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, ResultTrialFailed)
	assert.Equal(t, d.Ended[0].Failed, tu.Version2)
	assert.Assert(t, is.Contains(d.Ended[0].Message, "release "+tu.Version2))
	assert.Assert(t, is.Contains(d.Ended[0].Message, "spec.version is now "+version3+", so the rollout goes on without halting"))
	assert.Assert(t, d.Status.Halt == nil, "a failure of %s halted the rollout of %s: %+v", tu.Version2, version3, d.Status.Halt)
	assert.DeepEqual(t, granted(d), []string{"b"})

	// The same failure while spec.version is the release that failed
	// halts, and the halt names that release.
	c.Spec.Version = tu.Version2
	d = Decide(input(c, []*likenv1.Machine{machines[0], tu.Machine("b", tu.WantsRelease)}, nil))
	assert.Assert(t, d.Status.Halt != nil)
	assert.Equal(t, d.Status.Halt.Version, tu.Version2)
	assert.Equal(t, len(d.Granted), 0)

	// Retargeted to version3, the halt of version2 lifts.
	c.Status = d.Status
	c.Spec.Version = version3
	d = Decide(input(c, machines[1:], nil))
	assert.Assert(t, d.Status.Halt == nil)
	assert.DeepEqual(t, granted(d), []string{"b"})
}

// A resumed rollout halts again at the next failure, even when the
// machine does not report TrialFailed: a Release turn that ends on a new
// boot of the old release failed.
func TestFailureAfterResumeHaltsAgain(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonTrialFailed, Machine: "a", Version: tu.Version2, Since: metav1.NewTime(after.Add(-time.Hour))}
	c.Annotations[likenv1.AnnotationResumeRollout] = "try-again"
	machines := []*likenv1.Machine{tu.Machine("a", tu.Phase(likenv1.MachineDegraded)), tu.Machine("b", tu.WantsRelease)}
	d := Decide(input(c, machines, nil))
	assert.Assert(t, d.Status.Halt == nil)
	assert.DeepEqual(t, granted(d), []string{"b"})

	// b's trial fails; its daemon reports Ready on the old release without
	// TrialFailed.
	c.Status = d.Status
	c.Status.RebootTurns[0].GrantedAt = metav1.NewTime(after.Add(-5 * time.Minute))
	machines[1] = tu.Machine("b", tu.FinishedOn(tu.Version1))
	d = Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, ResultTrialFailed)
	assert.Assert(t, d.Status.Halt != nil, "the failure after a resume did not halt the rollout")
	assert.Equal(t, d.Status.Halt.Machine, "b")
	assert.Equal(t, d.Status.Halt.Version, tu.Version2)
	assert.Equal(t, progressing(t, d.Status).Reason, likenv1.ReasonTrialFailed)
}

// One machine's long TrialFailed text must not push the Cluster's
// Progressing message past what the API server accepts (32768 bytes), or
// every ledger write would fail.
func TestMachineTextInTheLedgerIsBounded(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-5*time.Minute))))
	a := tu.Machine("a", tu.WantsRelease, tu.TrialFailed)
	a.Status.Conditions[0].Reason = strings.Repeat("R", 1024)
	a.Status.Conditions[0].Message = strings.Repeat("é", 16<<10) // 32 KiB
	d := Decide(input(c, []*likenv1.Machine{a}, nil))
	assert.Equal(t, d.Ended[0].Result, ResultTrialFailed)
	msg := progressing(t, d.Status).Message
	assert.Assert(t, len(msg) <= 2048, "Progressing message of %d bytes", len(msg))
	assert.Assert(t, utf8.ValidString(msg))
	assert.Assert(t, is.Contains(msg, "..."))
	assert.Equal(t, d.Status.Halt.Message, msg)
}

func TestDowngradeSaysWhy(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version1), tu.MaxUnavailable("2"))
	machines := []*likenv1.Machine{
		tu.Machine("l1", tu.Leader, tu.WantsRelease, tu.Runs(tu.Version2), staged(tu.Version1)),
		tu.Machine("w1", tu.Manual, tu.WantsRelease, tu.Runs(tu.Version2), staged(tu.Version1)),
	}
	d := Decide(input(c, machines, nil))
	assert.Equal(t, len(d.Granted), 0)
	assert.Equal(t, progressing(t, d.Status).Message, "Waiting for a turn: l1. Leaders go back to "+tu.Version1+
		" after every worker runs it (a downgrade goes workers first); workers not on it yet: w1 (UpdatePending, waits for `liken approve-reboot lab w1`).")
}

// Turns are granted only while a maintenance window is open. The test's
// now is Monday 2026-11-30 11:00 UTC (12:00 in Berlin).
func TestMaintenanceWindows(t *testing.T) {
	saturdayNight := tu.Window("Sat", "22:00", 4*time.Hour, "Europe/Berlin")
	mondayMorning := tu.Window("Mon", "11:00", 2*time.Hour, "UTC")
	closedAtNow := tu.Window("Mon", "09:00", 2*time.Hour, "UTC") // 09:00 to 11:00: closes at now
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		want     []string
		turns    string
		status   metav1.ConditionStatus
		reason   string
		message  []string
		requeue  time.Duration
	}{
		{
			name:     "no windows: always",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)},
			want:     []string{"a"}, turns: "a", status: metav1.ConditionTrue, reason: likenv1.ReasonGranting,
			message: []string{"Holding a turn: a (maxUnavailable 1). Waiting for a turn: b."},
			requeue: 30 * time.Minute, // the stall deadline of a's turn
		},
		{
			name:     "a closed window grants nothing and says when the next opens",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(saturdayNight)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)},
			want:     nil, turns: "", status: metav1.ConditionFalse, reason: likenv1.ReasonOutsideWindow,
			message: []string{"Turns wait for the maintenance window: the next opens Sat 2026-12-05 22:00 Europe/Berlin (21:00 UTC) " +
				"(spec.disruption.windows[0]: Sat 22:00 for 4h Europe/Berlin). Waiting for a turn: a,b. " +
				"Machines go on downloading and staging meanwhile. To let turns start now, add or widen a window in spec.disruption.windows."},
			requeue: 5*24*time.Hour + 10*time.Hour, // Saturday 21:00 UTC
		},
		{
			name:     "an open window grants and says until when",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), tu.Windows(saturdayNight, mondayMorning)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease)},
			want:     []string{"a", "b"}, turns: "a,b", status: metav1.ConditionTrue, reason: likenv1.ReasonGranting,
			message: []string{"Holding a turn: a,b (maxUnavailable 2). Waiting for a turn: c. " +
				"The maintenance window is open until Mon 2026-11-30 13:00 UTC; turns not granted by then wait for the next one."},
			requeue: 30 * time.Minute,
		},
		{
			name:     "an open window with nothing left to grant does not requeue for its end",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(mondayMorning)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b")},
			want:     []string{"a"}, turns: "a", status: metav1.ConditionTrue, reason: likenv1.ReasonGranting,
			message: []string{"Holding a turn: a (maxUnavailable 1)."},
			requeue: 30 * time.Minute,
		},
		{
			name: "a window that closed mid-rollout leaves the granted turn running and grants no more",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), tu.Windows(closedAtNow),
				tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-20*time.Minute)))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)),
				tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease)},
			want: nil, turns: "a", status: metav1.ConditionFalse, reason: likenv1.ReasonOutsideWindow,
			message: []string{"the next opens Mon 2026-12-07 09:00 UTC", "Waiting for a turn: b,c.",
				"Turns granted before the window closed go on to their end: a."},
			requeue: 10 * time.Minute, // a's stall deadline comes before the window
		},
		{
			name:     "outside a window, nobody waiting: idle",
			cluster:  tu.Cluster("lab", tu.Windows(saturdayNight)),
			machines: []*likenv1.Machine{tu.Machine("a"), tu.Machine("b", tu.Phase(likenv1.MachineDownloading))},
			want:     nil, turns: "", status: metav1.ConditionTrue, reason: likenv1.ReasonIdle,
			message: []string{"No machine holds or waits for a reboot turn."},
		},
		{
			name:     "a manual machine not approved does not wait for the window",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(saturdayNight)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Manual, tu.WantsRelease)},
			want:     nil, turns: "", status: metav1.ConditionTrue, reason: likenv1.ReasonIdle,
		},
		{
			name:     "an unknown time zone grants nothing, even when another window is open",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(mondayMorning, tu.Window("Sat", "22:00", 4*time.Hour, "Europe/Berln"))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease)},
			want:     nil, turns: "", status: metav1.ConditionFalse, reason: likenv1.ReasonInvalidWindow,
			message: []string{"No turn is granted: cluster-operator cannot tell when the maintenance windows are open, and grants nothing rather than guess. " +
				`spec.disruption.windows[1].timeZone: Invalid value: "Europe/Berln": unknown time zone (names are case-sensitive): ` +
				"use the IANA name of a time zone, such as Europe/Berlin, America/New_York or UTC. " +
				"Fix spec.disruption.windows (kubectl edit cluster lab); granting resumes by itself once every window reads."},
		},
		{
			name:     "an unreadable window stops grants with nobody waiting too",
			cluster:  tu.Cluster("lab", tu.Windows(tu.Window("Sun", "25:00", time.Hour, "UTC"))),
			machines: []*likenv1.Machine{tu.Machine("a")},
			want:     nil, turns: "", status: metav1.ConditionFalse, reason: likenv1.ReasonInvalidWindow,
			message: []string{`spec.disruption.windows[0].start: Invalid value: "25:00"`},
		},
		{
			name:     "a stalled rollout outside a window says it stalled",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(saturdayNight), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Hour)))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)), tu.Machine("b", tu.WantsRelease)},
			want:     nil, turns: "a", status: metav1.ConditionFalse, reason: likenv1.ReasonRolloutStalled,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cluster.DeepCopy()
			d := Decide(input(tc.cluster, tc.machines, nil))
			assert.DeepEqual(t, granted(d), tc.want)
			assert.DeepEqual(t, tc.cluster, before)
			assert.Equal(t, d.Status.Turns, tc.turns)
			assert.Equal(t, len(d.Ended), 0)
			cond := progressing(t, d.Status)
			assert.Equal(t, cond.Status, tc.status)
			assert.Equal(t, cond.Reason, tc.reason)
			for _, m := range tc.message {
				assert.Assert(t, is.Contains(cond.Message, m))
			}
			if tc.requeue != 0 {
				assert.Equal(t, d.RequeueAfter, tc.requeue)
			}
			// The cluster's phase is the columns' business, never the
			// window's: Decide leaves it as it was.
			assert.Equal(t, d.Status.Phase, tc.cluster.Status.Phase)
		})
	}
}

// A decision outside the window asks to be taken again when it opens; taken
// then, it grants. Walked with a clock across a night the clocks go
// forward in Berlin.
func TestWindowOpensAtTheRequeue(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(tu.Window("Sun", "02:30", 2*time.Hour, "Europe/Berlin")))
	machines := []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}
	in := input(c, machines, nil)
	in.GrantFrom = time.Time{}
	in.Now = time.Date(2027, 3, 27, 20, 0, 0, 0, time.UTC) // Saturday
	d := Decide(in)
	assert.Equal(t, len(d.Granted), 0)
	// 02:30 does not exist that night: the window opens when the clocks
	// skip from 02:00 to 03:00, at 01:00 UTC.
	assert.Assert(t, is.Contains(progressing(t, d.Status).Message, "the next opens Sun 2027-03-28 03:00 Europe/Berlin (01:00 UTC)"))
	assert.Equal(t, d.RequeueAfter, 5*time.Hour)

	in.Now = in.Now.Add(d.RequeueAfter - time.Second)
	assert.Equal(t, len(Decide(in).Granted), 0, "a second early")
	in.Now = in.Now.Add(time.Second)
	d = Decide(in)
	assert.DeepEqual(t, granted(d), []string{"a"})
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Reason, likenv1.ReasonGranting)
	// 02:30 plus 2h on the clock: 04:30 CEST, 1h30m after it opened.
	assert.Assert(t, is.Contains(cond.Message, "open until Sun 2027-03-28 04:30 Europe/Berlin (02:30 UTC)"), cond.Message)
	assert.Equal(t, d.RequeueAfter, 30*time.Minute) // a's stall deadline

	// At its close, b still waits: nothing more is granted, and the next
	// window is a week away.
	c = c.DeepCopy()
	c.Status = d.Status
	machines[0] = tu.Machine("a", tu.FinishedOn(tu.Version2))
	in = input(c, machines, nil)
	in.Now = time.Date(2027, 3, 28, 2, 30, 0, 0, time.UTC)
	d = Decide(in)
	assert.Equal(t, len(d.Granted), 0)
	assert.Assert(t, is.Contains(progressing(t, d.Status).Message, "the next opens Sun 2027-04-04 02:30 Europe/Berlin (00:30 UTC)"))
	assert.Equal(t, d.RequeueAfter, 7*24*time.Hour-2*time.Hour)
}

// However many windows are wrong, and however long their values, the
// message fits in a condition and names the first problems.
func TestInvalidWindowMessageIsBounded(t *testing.T) {
	var ws []likenv1.MaintenanceWindow
	for range 40 {
		ws = append(ws, tu.Window("Mon,Tue,Wed,Thu,Fri,Sat,Sun,Mo,Di,Mi,Do", strings.Repeat("9", 300), 400*time.Hour, "Mars/"+strings.Repeat("x", 5000)))
	}
	d := Decide(input(tu.Cluster("lab", tu.Windows(ws...)), []*likenv1.Machine{tu.Machine("a", tu.WantsReboot)}, nil))
	assert.Equal(t, len(d.Granted), 0)
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Reason, likenv1.ReasonInvalidWindow)
	assert.Assert(t, len(cond.Message) < 8192, "%d bytes", len(cond.Message))
	assert.Assert(t, is.Contains(cond.Message, "spec.disruption.windows: Too many: 40: must have at most 32 items"))
	assert.Assert(t, is.Contains(cond.Message, "and 271 more"))
}

// TestDeletedMachineKeepsItsPlace: a machine whose Machine was deleted
// during its turn keeps its place in the budget while its Node is down, so
// no other machine goes down beside it; once its Node is gone the next
// machine gets the turn.
func TestDeletedMachineKeepsItsPlace(t *testing.T) {
	granted := after.Add(-time.Minute)
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("1"), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, granted)))
	b := tu.Machine("b", tu.WantsRelease)
	down := map[string]Node{"a": {State: fleet.NodeNotReady, BootID: "boot-1-a"}, "b": {State: fleet.NodeReady, BootID: "boot-1-b"}}
	d := Decide(input(c, []*likenv1.Machine{b}, down))
	assert.Equal(t, len(d.Ended), 0)
	assert.Equal(t, len(d.Granted), 0, "machine b went down beside the deleted machine a, whose Node is down")
	assert.Equal(t, d.Status.Turns, "a")

	gone := map[string]Node{"b": down["b"]}
	d = Decide(input(c, []*likenv1.Machine{b}, gone))
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, len(d.Granted), 1)
	assert.Equal(t, d.Granted[0].Machine, "b")
}
