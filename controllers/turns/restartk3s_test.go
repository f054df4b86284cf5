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
	"liken.sh/liken/internal/rules"
)

// A machine restarts k3s for a RestartK3s change only in a turn of its
// own: a restart that does not bring its node back takes it out of the
// fleet, and a leader's datastore member goes down with k3s. The turn
// follows a reboot turn's rules, with no drain and no approval.
func TestRestartK3sGrants(t *testing.T) {
	blockedDrain := map[string]Drain{"l1": {Needs: map[string][]string{"app/web": {"app/web-1"}}}}
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		nodes    map[string]Node
		drains   map[string]Drain
		want     []string
		reason   string
	}{
		{
			name:    "two leaders restarting k3s: only one is granted, whatever the budget",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("100%")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s), tu.Machine("l2", tu.Leader, tu.WantsRestartK3s),
				tu.Machine("l3", tu.Leader, tu.WantsRestartK3s), tu.Machine("w1")},
			want: []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no leader restarts k3s while another leader holds a RestartK3s turn",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnRestartK3s, true, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.Phase(likenv1.MachineRebooting)),
				tu.Machine("l2", tu.Leader, tu.WantsRestartK3s), tu.Machine("w1", tu.WantsReboot)},
			want: []string{"w1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "no leader restarts k3s while another leader reboots",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnReboot, true, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsReboot, tu.Phase(likenv1.MachineRebooting)),
				tu.Machine("l2", tu.Leader, tu.WantsRestartK3s)},
			want: nil, reason: likenv1.ReasonGranting,
		},
		{
			name:     "no leader restarts k3s while another leader's Node is NotReady",
			cluster:  tu.Cluster("lab", tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s), tu.Machine("l2", tu.Leader)},
			nodes:    notReady("l2"),
			want:     nil, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a RestartK3s turn counts against maxUnavailable",
			cluster:  tu.Cluster("lab", tu.Turns(tu.Turn("w1", likenv1.TurnReboot, false, after))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s), tu.Machine("w1", tu.WantsReboot, tu.Phase(likenv1.MachineRebooting))},
			want:     nil, reason: likenv1.ReasonGranting,
		},
		{
			name:    "workers restart k3s up to maxUnavailable at once",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.WantsRestartK3s), tu.Machine("w2", tu.WantsRestartK3s),
				tu.Machine("w3", tu.WantsRestartK3s)},
			want: []string{"w1", "w2"}, reason: likenv1.ReasonGranting,
		},
		{
			name: "after a failed restart of k3s, no machine restarts k3s, and reboots go on",
			cluster: tu.Cluster("lab", tu.MaxUnavailable("2"), func(c *likenv1.Cluster) {
				c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonK3sRestartFailed, Machine: "w1", Message: "Machine w1's restart of k3s failed"}
			}),
			machines: []*likenv1.Machine{tu.Machine("w1", tu.K3sRestartFailed), tu.Machine("w2", tu.WantsRestartK3s), tu.Machine("w3", tu.WantsReboot)},
			want:     []string{"w3"}, reason: likenv1.ReasonK3sRestartFailed,
		},
		{
			name:     "a Manual leader needs no approval to restart k3s",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.Manual, tu.WantsRestartK3s)},
			want:     []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:    "a Manual leader that lists a Reboot change too waits for approval",
			cluster: tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.Manual, tu.WantsRestartK3s, func(m *likenv1.Machine) {
				m.Status.Pending = append(m.Status.Pending, likenv1.PendingChange{Field: "cluster.spec.settings.kernelArgs", Class: likenv1.ClassReboot})
			})},
			want: nil, reason: likenv1.ReasonIdle,
		},
		{
			name:     "a leader whose drain PodDisruptionBudgets would block still restarts k3s: nothing is drained",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s)},
			drains:   blockedDrain,
			want:     []string{"l1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "outside every maintenance window no leader restarts k3s",
			cluster:  tu.Cluster("lab", tu.Windows(tu.Window("Sat", "00:00", time.Hour, "UTC"))),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s)},
			want:     nil, reason: likenv1.ReasonOutsideWindow,
		},
		{
			name:     "a worker asks for nothing: it restarted k3s at once",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader), tu.Machine("w1")},
			want:     nil, reason: likenv1.ReasonIdle,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := input(tc.cluster, tc.machines, tc.nodes)
			in.Drains = tc.drains
			d := Decide(in)
			assert.DeepEqual(t, granted(d), tc.want)
			assert.Equal(t, progressing(t, d.Status).Reason, tc.reason)
			assert.Assert(t, is.Len(d.Skipped, 0))
			for _, g := range d.Granted {
				m := findMachine(tc.machines, g.Machine)
				want := likenv1.TurnReboot
				if len(m.Status.Pending) > 0 && m.Status.Pending[0].Class == likenv1.ClassRestartK3s {
					want = likenv1.TurnRestartK3s
				}
				assert.Equal(t, g.Reason, want)
				assert.Equal(t, g.Leader, rules.IsLeader(m))
				assert.Equal(t, g.Change, m.Status.Change)
				assert.Equal(t, g.BootID, m.Status.Observed.BootID)
				assert.Equal(t, g.Version, "")
			}
		})
	}
}

func TestRestartK3sTurnsEnd(t *testing.T) {
	granted := after.Add(-time.Minute)
	turn := tu.Turn("l1", likenv1.TurnRestartK3s, true, granted)
	// done is the leader once k3s is back: Ready, nothing pending.
	done := func(m *likenv1.Machine) {
		m.Status.Phase, m.Status.Change, m.Status.Pending = likenv1.MachineReady, "", nil
	}
	back := Node{State: fleet.NodeReady, Heartbeat: after, BootID: "boot-1-l1"}
	cases := []struct {
		name    string
		machine *likenv1.Machine // nil: deleted
		node    Node
		result  Result // "" keeps the turn
	}{
		{name: "restarting keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.Phase(likenv1.MachineRebooting)), node: back},
		{name: "granted, not started yet, keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s), node: back},
		{name: "a restart that failed keeps the turn: k3s may be down", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.Phase(likenv1.MachineDegraded)),
			node: Node{State: fleet.NodeNotReady, Heartbeat: granted.Add(-time.Minute), BootID: "boot-1-l1"}},
		{name: "Degraded before it started gives the turn back", machine: tu.Machine("l1", tu.Leader, tu.Phase(likenv1.MachineDegraded)), node: back, result: ResultTakenBack},
		{name: "lost keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.Phase(likenv1.MachineLost))},
		{name: "done and its Node Ready after the grant finishes", machine: tu.Machine("l1", tu.Leader, done), node: back, result: ResultFinished},
		{name: "done, but its Node's Ready is from before the grant: keeps the turn", machine: tu.Machine("l1", tu.Leader, done),
			node: Node{State: fleet.NodeReady, Heartbeat: granted.Add(-10 * time.Second), BootID: "boot-1-l1"}},
		{name: "done, but its Node's Ready is from the grant's second: keeps the turn", machine: tu.Machine("l1", tu.Leader, done),
			node: Node{State: fleet.NodeReady, Heartbeat: granted, BootID: "boot-1-l1"}},
		{name: "done, but its Node is NotReady: keeps the turn", machine: tu.Machine("l1", tu.Leader, done),
			node: Node{State: fleet.NodeNotReady, Heartbeat: after, BootID: "boot-1-l1"}},
		{name: "back from a power cut with the change applied, its Node from the new boot: finishes", machine: tu.Machine("l1", tu.Leader, done, tu.Rebooted),
			node: Node{State: fleet.NodeReady, Heartbeat: after, BootID: "boot-2-l1"}, result: ResultFinished},
		{name: "back from a power cut, its Node still Ready by the last boot's word: keeps the turn", machine: tu.Machine("l1", tu.Leader, done, tu.Rebooted), node: back},
		{name: "back from a power cut before the restart, asking again: keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.Rebooted),
			node: Node{State: fleet.NodeReady, Heartbeat: after, BootID: "boot-2-l1"}},
		{name: "a trial failure reported from long ago is not this turn's", machine: tu.Machine("l1", tu.Leader, done, func(m *likenv1.Machine) {
			meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: likenv1.ConditionTrialFailed, Status: metav1.ConditionTrue, Reason: "NoRejoin"})
		}), node: back, result: ResultFinished},
		{name: "rolled back, waiting for its Node on the old configuration, keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.K3sRestartFailed, tu.Change(turn.Change)),
			node: Node{State: fleet.NodeNotReady, Heartbeat: granted.Add(-time.Minute), BootID: "boot-1-l1"}},
		{name: "rolled back and reported, its Node Ready: ends the turn as failed", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.K3sRestartFailed),
			node: back, result: ResultK3sRestartFailed},
		{name: "rolled back and reported, its Node NotReady: keeps the turn", machine: tu.Machine("l1", tu.Leader, tu.WantsRestartK3s, tu.K3sRestartFailed),
			node: Node{State: fleet.NodeNotReady, Heartbeat: after, BootID: "boot-1-l1"}},
		{name: "deleted", result: ResultTakenBack},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decideHeldTurn(t, turn, tc.machine, tc.node, tc.result)
			if tc.result == "" {
				return
			}
			if tc.result != ResultK3sRestartFailed {
				assert.Assert(t, d.Halted == nil, "a RestartK3s turn that did not fail halts nothing")
				return
			}
			assert.Assert(t, d.Halted != nil)
			assert.Equal(t, d.Halted.Reason, likenv1.ReasonK3sRestartFailed)
			assert.Equal(t, d.Halted.Machine, "l1")
			assert.Check(t, is.Contains(d.Ended[0].Message, "did not bring the node back Ready within 10m0s"))
		})
	}
}

// decideHeldTurn decides for a Cluster whose ledger holds turn alone, of
// machine m (nil: deleted) whose Node is node, with no place free, and
// checks that the turn ends with result ("": is kept).
func decideHeldTurn(t *testing.T, turn likenv1.RebootTurn, m *likenv1.Machine, node Node, result Result) Decision {
	t.Helper()
	var machines []*likenv1.Machine
	nodes := map[string]Node{}
	if m != nil {
		machines = append(machines, m)
		nodes[m.Name] = node
	}
	c := tu.Cluster("lab", tu.MaxUnavailable("0"), tu.Turns(turn))
	d := Decide(input(c, machines, nodes))
	if result == "" {
		assert.Equal(t, len(d.Ended), 0)
		assert.Equal(t, d.Status.Turns, turn.Machine)
		return d
	}
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, result)
	assert.Equal(t, d.Status.Turns, "")
	return d
}

// TestLeadersRestartK3sOneAfterAnother plays a Cluster-wide k3sArgs change
// on three leaders through successive decisions: each leader's turn ends
// only once its Node is Ready after its grant, and no two leaders ever
// hold a turn at once.
func TestLeadersRestartK3sOneAfterAnother(t *testing.T) {
	c := tu.Cluster("lab", tu.MaxUnavailable("100%"))
	machines := []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.WantsRestartK3s), tu.Machine("l2", tu.Leader, tu.WantsRestartK3s),
		tu.Machine("l3", tu.Leader, tu.WantsRestartK3s)}
	nodes := map[string]Node{}
	for _, m := range machines {
		nodes[m.Name] = Node{State: fleet.NodeReady, Heartbeat: tu.Epoch, BootID: m.Status.Observed.BootID}
	}
	now := after
	var order []string
	for step := 0; step < 20 && len(order) < 3; step++ {
		in := input(c, machines, nodes)
		in.Now = now
		d := Decide(in)
		c = c.DeepCopy()
		c.Status = d.Status
		assert.Assert(t, len(c.Status.RebootTurns) <= 1, "step %d: two leaders hold turns: %s", step, c.Status.Turns)
		for _, g := range d.Granted {
			order = append(order, g.Machine)
		}
		now = now.Add(5 * time.Second)
		// The leader holding the turn restarts k3s, its Node goes NotReady,
		// then its kubelet posts Ready again, then the machine reports the
		// change done.
		for _, tr := range c.Status.RebootTurns {
			m := findMachine(machines, tr.Machine)
			n := nodes[m.Name]
			switch {
			case m.Status.Phase == likenv1.MachineRebootPending:
				m.Status.Phase = likenv1.MachineRebooting
				n.State = fleet.NodeNotReady
			case n.State == fleet.NodeNotReady:
				n.State, n.Heartbeat = fleet.NodeReady, now
			default:
				m.Status.Phase, m.Status.Change, m.Status.Pending = likenv1.MachineReady, "", nil
			}
			nodes[m.Name] = n
		}
	}
	assert.DeepEqual(t, order, []string{"l1", "l2", "l3"})
}

// TestK3sRestartFailureHaltsTheRestarts plays a bad k3sArgs value on three
// workers with maxUnavailable 1 through successive decisions: the first
// worker's restart is rolled back, and no other worker restarts k3s (the
// rollout halts, Progressing says why) until the value changes; a resume
// lets one more try, and its failure halts again.
func TestK3sRestartFailureHaltsTheRestarts(t *testing.T) {
	c := tu.Cluster("lab", tu.MaxUnavailable("1"))
	machines := []*likenv1.Machine{tu.Machine("w1", tu.WantsRestartK3s), tu.Machine("w2", tu.WantsRestartK3s), tu.Machine("w3", tu.WantsRestartK3s)}
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

	// w1 rolls back and reports the failure once its Node is Ready again.
	tu.K3sRestartFailed(machines[0])
	nodes["w1"] = Node{State: fleet.NodeReady, Heartbeat: after.Add(11 * time.Minute), BootID: nodes["w1"].BootID}
	d = decide(after.Add(11 * time.Minute))
	assert.Equal(t, len(d.Ended), 1)
	assert.Equal(t, d.Ended[0].Result, ResultK3sRestartFailed)
	assert.Assert(t, d.Halted != nil)
	assert.Assert(t, is.Len(d.Granted, 0), "no other machine restarts k3s")
	cond := progressing(t, d.Status)
	assert.Equal(t, cond.Status, metav1.ConditionFalse)
	assert.Equal(t, cond.Reason, likenv1.ReasonK3sRestartFailed)
	assert.Check(t, is.Contains(cond.Message, "Machine w1's restart of k3s failed"))
	assert.Check(t, is.Contains(cond.Message, "liken rollout resume"))
	d = decide(after.Add(12 * time.Minute))
	assert.Assert(t, is.Len(d.Granted, 0), "still halted")

	// A person resumes: one more machine tries, and its failure halts again.
	c.Annotations[likenv1.AnnotationResumeRollout] = "once-more"
	d = decide(after.Add(13 * time.Minute))
	assert.Assert(t, d.Lifted != nil)
	assert.DeepEqual(t, granted(d), []string{"w2"})
	tu.K3sRestartFailed(machines[1])
	nodes["w2"] = Node{State: fleet.NodeReady, Heartbeat: after.Add(24 * time.Minute), BootID: nodes["w2"].BootID}
	d = decide(after.Add(24 * time.Minute))
	assert.Assert(t, d.Halted != nil)
	assert.Equal(t, d.Halted.Machine, "w2")
	assert.Assert(t, is.Len(d.Granted, 0))

	// The value changes: w2 forgets its failure and asks again, and the
	// halt is lifted.
	tu.WantsRestartK3s(machines[1])
	machines[1].Status.Conditions = nil
	d = decide(after.Add(25 * time.Minute))
	assert.Assert(t, d.Lifted != nil)
	assert.Check(t, is.Contains(d.LiftedBecause, "machine w2 no longer reports a failed restart of k3s"))
	assert.DeepEqual(t, granted(d), []string{"w2"})
}
