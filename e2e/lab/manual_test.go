package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Manual machines (the default policy) stage the release and stop at
// UpdatePending, asking for approval with the exact command; no turn is
// granted. liken approve-reboot lets exactly the approved machine take
// its turn, and the others keep waiting.
func TestManualApproval(t *testing.T) {
	l := startLab(t, "e2e-manual", labOptions{})
	names := machineNames(l)
	for _, m := range l.machines() {
		assert.Equal(t, m.Spec.RebootPolicy, likenv1.RebootManual, "machine %s: Manual is the default", m.Name)
	}
	next := l.publish("")
	set := l.setVersion(next.Version, next)

	l.waitFor("every machine to stage "+next.Version+" and ask for approval", 2*time.Minute, func() (bool, string) {
		var waiting []string
		for _, m := range l.machines() {
			c := condition(m.Status.Conditions, likenv1.ConditionRebootPending)
			if m.Status.Phase != likenv1.MachineUpdatePending || m.Status.Staged != next.Version || c.Status != metav1.ConditionTrue || c.Reason != likenv1.ReasonAwaitingApproval {
				waiting = append(waiting, fmt.Sprintf("%s %s %s/%s", m.Name, m.Status.Phase, c.Status, c.Reason))
			}
		}
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
	for _, m := range l.machines() {
		c := condition(m.Status.Conditions, likenv1.ConditionRebootPending)
		assert.Assert(t, is.Contains(c.Message, "liken approve-reboot "+l.name+" "+m.Name), "machine %s", m.Name)
	}
	t.Logf("node-2 RebootPending message: %s", condition(l.machine("node-2").Status.Conditions, likenv1.ConditionRebootPending).Message)
	out := l.mustKubectl("get", "machines", "-o", "wide")
	for _, n := range names {
		r := row(out, n)
		assert.Equal(t, r["STATUS"], "UpdatePending", "kubectl get machines -o wide:\n%s", out)
		assert.Equal(t, r["STAGED"], next.Version, "kubectl get machines -o wide:\n%s", out)
		assert.Equal(t, r["POLICY"], "Manual", "kubectl get machines -o wide:\n%s", out)
	}

	// After its startup grace cluster-operator has decided, and grants
	// nothing: no machine asks for a turn until approved.
	l.waitFor("cluster-operator to decide after its startup grace", 2*time.Minute, func() (bool, string) {
		p := condition(l.cluster().Status.Conditions, likenv1.ConditionProgressing)
		return p.Reason == likenv1.ReasonIdle, p.Reason + ": " + p.Message
	})
	l.w.settle(t)
	assert.Equal(t, len(l.w.grants(0)), 0, "turns granted before any approval: %v", grantNames(l.w.grants(0)))

	// Approve node-2 only: it takes its turn although node-1 comes first
	// in the order, because node-1 does not ask.
	approved := l.w.settle(t)
	out = l.mustLiken("approve-reboot", l.name, "node-2")
	t.Logf("liken approve-reboot %s node-2:\n%s", l.name, out)
	l.waitFor("node-2 to run "+next.Version+" and its turn to end", 2*time.Minute, func() (bool, string) {
		m, c := l.machine("node-2"), l.cluster()
		return m.Status.Phase == likenv1.MachineReady && m.Status.Version == next.Version && c.Status.Turns == "",
			fmt.Sprintf("node-2 %s on %s, turns %q", m.Status.Phase, m.Status.Version, c.Status.Turns)
	})
	l.w.settle(t)
	assert.DeepEqual(t, grantNames(l.w.grants(set)), []string{"node-2"})
	// node-2 may first report that it now waits for its turn.
	assert.DeepEqual(t, strings.TrimPrefix(strings.Join(l.w.phases("node-2", approved), " "), "UpdatePending "), "Updating Ready")
	for _, m := range l.machines() {
		if m.Name == "node-2" {
			continue
		}
		c := condition(m.Status.Conditions, likenv1.ConditionRebootPending)
		assert.Equal(t, m.Status.Phase, likenv1.MachineUpdatePending, "machine %s", m.Name)
		assert.Equal(t, c.Reason, likenv1.ReasonAwaitingApproval, "machine %s", m.Name)
		assert.Equal(t, m.Status.Version, l.w.firstVersion(m.Name), "machine %s", m.Name)
		for _, p := range l.w.phases(m.Name, approved) {
			assert.Equal(t, p, string(likenv1.MachineUpdatePending), "machine %s moved after node-2's approval", m.Name)
		}
	}
	l.checkBootedAndStaged()
}
