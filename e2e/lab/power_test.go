package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// A machine loses power: its Node reads NotReady at once, its Node Lease
// is no longer renewed, its Machine reads Lost once 40 s pass without a
// renewal, and it counts against the
// budget all along, so a machine that asks for a reboot gets no turn with
// maxUnavailable 1. Power back on: the machine is Ready again and the
// waiting machine takes its turn.
func TestPowerLossCountsAgainstTheBudget(t *testing.T) {
	l := startLab(t, "e2e-power", labOptions{policy: "Auto"})
	budget, err := l.cluster().Spec.Disruption.MaxUnavailableFor(len(machineNames(l)))
	assert.NilError(t, err)
	assert.Equal(t, budget, 1)

	out := l.mustLiken("lab", "power", "off", "node-5", "--name", l.name)
	off := time.Now()
	t.Logf("liken lab power off node-5: %s", strings.TrimSpace(out))
	l.waitFor("node-5's Node to read NotReady", time.Minute, func() (bool, string) {
		return !l.nodeReady("node-5"), "Ready"
	})

	requested := l.w.settle(t)
	out = l.mustLiken("request-reboot", l.name, "node-4")
	t.Logf("liken request-reboot %s node-4:\n%s", l.name, out)
	l.waitFor("node-4 to wait for a turn while node-5 is down", 2*time.Minute, func() (bool, string) {
		m, c := l.machine("node-4"), l.cluster()
		rp := condition(m.Status.Conditions, likenv1.ConditionRebootPending)
		p := condition(c.Status.Conditions, likenv1.ConditionProgressing)
		return m.Status.Phase == likenv1.MachineRebootPending && rp.Reason == likenv1.ReasonAwaitingTurn &&
				p.Reason == likenv1.ReasonGranting && strings.Contains(p.Message, "Waiting for a turn: node-4") && c.Status.Turns == "",
			fmt.Sprintf("node-4 %s %s; Progressing %s: %s; turns %q", m.Status.Phase, rp.Reason, p.Reason, p.Message, c.Status.Turns)
	})

	l.waitFor("node-5 to read Lost", 2*time.Minute, func() (bool, string) {
		m := l.machine("node-5")
		return m.Status.Phase == likenv1.MachineLost, string(m.Status.Phase)
	})
	l.w.settle(t)
	// The heartbeat is the Node Lease kube-node-lease/node-5: its last
	// renewal, which stopped with the power.
	lease, err := l.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), "node-5", metav1.GetOptions{})
	assert.NilError(t, err)
	lastBeat := lease.Spec.RenewTime.Time
	assert.Assert(t, lastBeat.Before(off.Add(11*time.Second)), "the Node Lease of node-5 was renewed %s after the power cut", lastBeat.Sub(off))
	var lostAt time.Time
	for _, r := range l.w.machineHistory("node-5", requested) {
		if r.obj.Status.Phase == likenv1.MachineLost {
			lostAt = r.at
			break
		}
	}
	silent := lostAt.Sub(lastBeat)
	// The operator judges on its own clock when it saw the last renewal;
	// allow a second for the resolution of what the watcher saw.
	assert.Assert(t, silent >= 39*time.Second, "node-5 read Lost %s after its last heartbeat", silent)
	assert.Assert(t, silent <= 90*time.Second, "node-5 read Lost only %s after its last heartbeat", silent)
	assert.Assert(t, !l.nodeReady("node-5"))
	assert.Equal(t, len(l.w.grants(requested)), 0, "turns granted while node-5 was down: %v", grantNames(l.w.grants(requested)))
	t.Logf("node-5 read Lost %s after its last heartbeat (%s after the power cut)", silent.Round(100*time.Millisecond), lostAt.Sub(off).Round(100*time.Millisecond))
	out, _, err = l.kubectl("get", "machines")
	assert.NilError(t, err)
	assert.Equal(t, row(out, "node-5")["STATUS"], "Lost", "kubectl get machines:\n%s", out)

	// Power on: node-5 comes back, writes its own phase again, and the
	// budget frees up for node-4.
	on, onAt := l.w.settle(t), time.Now()
	l.mustLiken("lab", "power", "on", "node-5", "--name", l.name)
	l.waitFor("node-5 to be Ready again", 2*time.Minute, func() (bool, string) {
		m := l.machine("node-5")
		return l.nodeReady("node-5") && m.Status.Phase == likenv1.MachineReady, string(m.Status.Phase)
	})
	l.waitFor("node-4 to take its turn and reboot", 2*time.Minute, func() (bool, string) {
		m, c := l.machine("node-4"), l.cluster()
		return m.Status.Phase == likenv1.MachineReady && m.Status.ObservedRebootRequest != "" && c.Status.Turns == "",
			fmt.Sprintf("node-4 %s, turns %q", m.Status.Phase, c.Status.Turns)
	})
	l.w.settle(t)
	assert.Assert(t, len(l.w.grants(requested)) == 1 && l.w.grants(requested)[0].machine == "node-4", "grants: %v", grantNames(l.w.grants(requested)))
	g := l.w.grants(requested)[0]
	assert.Assert(t, g.rv > on, "node-4 got its turn before node-5 was powered on")
	assert.Equal(t, g.reason, likenv1.TurnReboot)
	t.Logf("node-4's turn came %s after node-5 was powered on", g.at.Sub(onAt).Round(100*time.Millisecond))
	l.checkBootedAndStaged()
}
