package operator

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
)

// A leader's turn ends only when its Node is Ready from the new boot, not
// on the Ready Kubernetes keeps for a silent Node: otherwise the next
// leader goes down while the first one's datastore member is not back.
// The simulated machines here come back at once and leave their Node
// alone, so the Node shows the Ready of the last boot until the test posts
// the new boot's Ready as its kubelet would.
func TestLeaderTurnEndsWhenItsNodeIsBack(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 2, workers: 1, maxUnavailable: "3", renewEvery: time.Second, silentKubelets: true})
	e.startOperator("op-a", "--startup-grace=2s", "--machine-lost-after=5s")
	e.waitFor("the Cluster to read Ready 3/3", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "3/3"
	})

	e.setMaxUnavailable("0")
	e.waitFor("Progressing to say Paused", time.Minute, func() bool {
		return progressing(e.cluster()).Reason == likenv1.ReasonPaused
	})
	e.machines["node-1"].RequestReboot()
	e.machines["node-2"].RequestReboot()
	e.waitFor("both leaders to ask for a turn", time.Minute, func() bool {
		return e.machine("node-1").Status.Phase == likenv1.MachineRebootPending && e.machine("node-2").Status.Phase == likenv1.MachineRebootPending
	})
	e.setMaxUnavailable("3")
	e.waitFor("node-1 to hold a turn", time.Minute, func() bool { return e.cluster().Status.Turns == "node-1" })
	before := e.cluster().Status.RebootTurns[0].BootID

	// node-1 is back from a new boot and reports Ready; the operator sees
	// it (the MACHINES column counts it) but keeps its turn.
	e.waitFor("node-1 to report Ready from a new boot and the operator to count it", time.Minute, func() bool {
		m := e.machine("node-1")
		return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID != before && e.cluster().Status.Machines == "2/3"
	})
	c := e.cluster()
	assert.Equal(t, c.Status.Turns, "node-1", "the turn ended on the Ready of node-1's last boot")
	assert.Equal(t, len(c.Status.RebootTurns), 1)

	// The kubelet of the new boot posts Ready: the turn ends and node-2
	// gets the next one.
	assert.NilError(t, controlplane.PostNodeBoot(e.ctx, e.kube, "node-1", e.machines["node-1"].BootID()))
	e.waitFor("node-2 to get its turn", time.Minute, func() bool { return e.cluster().Status.Turns == "node-2" })
}
