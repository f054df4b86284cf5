package turns

import (
	"testing"

	"gotest.tools/v3/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	tu "liken.sh/liken/controllers/internal/testutil"
)

func TestColumns(t *testing.T) {
	cases := []struct {
		name      string
		cluster   *likenv1.Cluster
		machines  []*likenv1.Machine
		phase     likenv1.ClusterPhase
		columns   string
		ready     metav1.ConditionStatus
		reason    string
		message   string
		turns     string
		leaderSet []string
	}{
		{
			name:     "every machine on the version",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Leader), tu.Machine("b")},
			phase:    likenv1.ClusterReady, columns: "2/2", ready: metav1.ConditionTrue, reason: ReasonAllMachinesReady,
			message: "All 2 machines are Ready on 2026.11.01-001.", leaderSet: []string{"a"},
		},
		{
			name:    "rollout under way",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("c", likenv1.TurnRelease, false, tu.Epoch))),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2), tu.Leader), tu.Machine("b", tu.WantsRelease),
				tu.Machine("c", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)), tu.Machine("d", tu.Phase(likenv1.MachineDownloading))},
			phase: likenv1.ClusterUpdating, columns: "1/4", ready: metav1.ConditionFalse, reason: ReasonMachinesNotReady,
			message: "3 of 4 machines are not Ready on 2026.11.20-001: b (UpdatePending, runs 2026.11.01-001), c (Updating, runs 2026.11.01-001), d (Downloading, runs 2026.11.01-001).",
			turns:   "c", leaderSet: []string{"a"},
		},
		{
			name:     "a reboot staged on the right version is Updating",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsReboot), tu.Machine("b")},
			phase:    likenv1.ClusterUpdating, columns: "1/2", ready: metav1.ConditionFalse, reason: ReasonMachinesNotReady,
			message: "1 of 2 machines are not Ready on 2026.11.01-001: a (RebootPending).",
		},
		{
			name:     "a Lost machine on the version is not Ready but no rollout",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a", tu.Phase(likenv1.MachineLost)), tu.Machine("b")},
			phase:    likenv1.ClusterReady, columns: "1/2", ready: metav1.ConditionFalse, reason: ReasonMachinesNotReady,
			message: "1 of 2 machines are not Ready on 2026.11.01-001: a (Lost).",
		},
		{
			name:    "no machines",
			cluster: tu.Cluster("lab"),
			phase:   likenv1.ClusterReady, columns: "0/0", ready: metav1.ConditionFalse, reason: ReasonNoMachines,
			message: "No Machine names cluster lab in spec.cluster yet.",
		},
		{
			name:    "names 8 machines and counts the rest",
			cluster: tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a"), tu.Machine("b1", tu.WantsReboot), tu.Machine("b2", tu.WantsReboot),
				tu.Machine("b3", tu.WantsReboot), tu.Machine("b4", tu.WantsReboot), tu.Machine("b5", tu.WantsReboot),
				tu.Machine("b6", tu.WantsReboot), tu.Machine("b7", tu.Phase(likenv1.MachineLost)), tu.Machine("b8", tu.Runs(tu.Version2)),
				tu.Machine("b9", tu.WantsReboot), tu.Machine("c"), tu.Machine("d", tu.WantsReboot)},
			phase: likenv1.ClusterUpdating, columns: "2/12", ready: metav1.ConditionFalse, reason: ReasonMachinesNotReady,
			message: "10 of 12 machines are not Ready on 2026.11.01-001: b1 (RebootPending), b2 (RebootPending), b3 (RebootPending), " +
				"b4 (RebootPending), b5 (RebootPending), b6 (RebootPending), b7 (Lost), b8 (Ready, runs 2026.11.20-001) and 2 more.",
		},
		{
			name:     "a machine that never reported",
			cluster:  tu.Cluster("lab"),
			machines: []*likenv1.Machine{tu.Machine("a", func(m *likenv1.Machine) { m.Status = likenv1.MachineStatus{} })},
			phase:    likenv1.ClusterUpdating, columns: "0/1", ready: metav1.ConditionFalse, reason: ReasonMachinesNotReady,
			message: "1 of 1 machines are not Ready on 2026.11.01-001: a (no status yet).",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := *tc.cluster.Status.DeepCopy()
			Columns(&st, tc.cluster, tc.machines, tu.Epoch)
			assert.Equal(t, st.Phase, tc.phase)
			assert.Equal(t, st.Machines, tc.columns)
			assert.Equal(t, st.Turns, tc.turns)
			assert.DeepEqual(t, st.Leaders, tc.leaderSet)
			assert.Equal(t, st.Endpoint, "https://10.0.0.1:6443")
			assert.Equal(t, st.Releases.Newest, tu.Version2)
			assert.Equal(t, st.ObservedGeneration, int64(1))
			c := meta.FindStatusCondition(st.Conditions, likenv1.ConditionReady)
			assert.Assert(t, c != nil)
			assert.Equal(t, c.Status, tc.ready)
			assert.Equal(t, c.Reason, tc.reason)
			assert.Equal(t, c.Message, tc.message)
		})
	}
}

func TestColumnsKeepOtherFields(t *testing.T) {
	c := tu.Cluster("lab")
	c.Status.Releases.Available = "2026.12.01-001"
	c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonTrialFailed, Machine: "a"}
	c.Status.Conditions = []metav1.Condition{{Type: likenv1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: "Idle"}}
	st := *c.Status.DeepCopy()
	Columns(&st, c, []*likenv1.Machine{tu.Machine("a")}, tu.Epoch)
	assert.Equal(t, st.Releases.Available, "2026.12.01-001")
	assert.Equal(t, st.Halt.Machine, "a")
	assert.Assert(t, meta.FindStatusCondition(st.Conditions, likenv1.ConditionProgressing) != nil)
	assert.Equal(t, st.Conditions[0].Type, likenv1.ConditionProgressing, "conditions are sorted by type")
}
