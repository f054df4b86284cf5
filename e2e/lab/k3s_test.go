package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// A Cluster-wide k3sArgs change reaches every machine without a reboot,
// each in a RestartK3s turn that ends only once its Node is Ready again:
// the leaders one at a time, so the datastore never loses two members at
// once, the workers under the disruption budget. (The lab's liken-node
// posts the Node's Ready in the second after each simulated restart of
// k3s, as the restarted kubelet does.)
func TestEveryMachineRestartsK3sInATurn(t *testing.T) {
	l := startLab(t, "e2e-k3s", labOptions{})
	args := []string{"--kubelet-arg=max-pods=120"}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"settings": map[string]any{"k3sArgs": args}}})
	assert.NilError(t, err)
	from := l.w.settle(t)
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", string(patch))

	restarts := map[string][]changes.Record{}
	l.waitFor("every machine to restart k3s with the new arguments and every turn to end", 3*time.Minute, func() (bool, string) {
		var waiting []string
		for _, m := range l.machines() {
			restarts[m.Name] = k3sRestarts(t, filepath.Join(l.machineDir(m.Name), "disk", "applier.log"))
			if len(restarts[m.Name]) == 0 || m.Status.Phase != likenv1.MachineReady || m.Status.Change != "" {
				waiting = append(waiting, fmt.Sprintf("%s %s %q (%d restarts)", m.Name, m.Status.Phase, m.Status.Change, len(restarts[m.Name])))
			}
		}
		c := l.cluster()
		if c.Status.Turns != "" {
			waiting = append(waiting, "turns held: "+c.Status.Turns)
		}
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
	l.w.settle(t)

	type restart struct {
		machine string
		at      time.Time
	}
	var leaders []string
	var order []restart
	for _, m := range l.machines() {
		assert.Equal(t, len(restarts[m.Name]), 1, "machine %s restarted k3s %d times", m.Name, len(restarts[m.Name]))
		assert.DeepEqual(t, restarts[m.Name][0].Config.Settings.K3sArgs, args)
		assert.Equal(t, len(l.firmwareLines(m.Name, "up (boot ID")), 1, "machine %s rebooted", m.Name)
		if m.Spec.Role == likenv1.RoleLeader {
			leaders = append(leaders, m.Name)
			order = append(order, restart{m.Name, restarts[m.Name][0].Time})
		}
	}
	sort.Strings(leaders)
	assert.Assert(t, len(leaders) >= 2, "the lab has %d leaders", len(leaders))

	// No leader restarted k3s before the last one's Node was Ready again:
	// the lab's kubelet posts that Ready in the second after the restart,
	// and the next turn waits for it.
	slices.SortFunc(order, func(a, b restart) int { return a.at.Compare(b.at) })
	for i := 1; i < len(order); i++ {
		back := order[i-1].at.Truncate(time.Second).Add(time.Second)
		assert.Assert(t, !order[i].at.Before(back), "leader %s restarted k3s at %s, before leader %s (restarted at %s) was Ready again",
			order[i].machine, order[i].at.Format(time.RFC3339Nano), order[i-1].machine, order[i-1].at.Format(time.RFC3339Nano))
	}

	// Every machine took one RestartK3s turn.
	var granted, all []string
	for _, g := range l.w.grants(from) {
		assert.Equal(t, g.reason, likenv1.TurnRestartK3s, "turn of %s", g.machine)
		granted = append(granted, g.machine)
	}
	for _, m := range l.machines() {
		all = append(all, m.Name)
	}
	sort.Strings(granted)
	sort.Strings(all)
	assert.DeepEqual(t, granted, all)
	t.Logf("leaders restarted k3s at %v", order)
}

// k3sRestarts are the restarts of k3s a machine's applier log records.
func k3sRestarts(t *testing.T, path string) []changes.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	assert.NilError(t, err)
	var out []changes.Record
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var r changes.Record
		assert.NilError(t, json.Unmarshal([]byte(line), &r), "%s: %q", path, line)
		if r.Op == changes.OpRestartK3s {
			out = append(out, r)
		}
	}
	return out
}

// A k3sArgs value that keeps the kubelet from coming back takes down one
// machine, not the fleet: the first machine's restart is rolled back after
// the trial timeout, and no other machine restarts k3s with the value
// (Progressing=False, K3sRestartFailed, naming the machine) until it is
// corrected; then every machine restarts k3s with the new value. The
// watcher holds the budget all along. (The lab's kubelet refuses
// changes.LabRefusedArg, as a real kubelet refuses a flag it does not
// know.)
func TestBadK3sArgsIsRolledBackOnOneMachine(t *testing.T) {
	l := startLab(t, "e2e-k3s-bad", labOptions{})
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{
		"settings":   map[string]any{"k3sArgs": []string{changes.LabRefusedArg}},
		"disruption": map[string]any{"trialTimeout": "15s"},
	}})
	assert.NilError(t, err)
	l.w.settle(t)
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", string(patch))

	var failed string
	took := l.waitFor("the rollout of the value to halt", 3*time.Minute, func() (bool, string) {
		c := l.cluster()
		if c.Status.Halt == nil || c.Status.Halt.Reason != likenv1.ReasonK3sRestartFailed {
			return false, fmt.Sprintf("halt %v, turns %q", c.Status.Halt, c.Status.Turns)
		}
		failed = c.Status.Halt.Machine
		return true, ""
	})
	t.Logf("the rollout halted %s after the change", took.Round(time.Second))
	c := l.cluster()
	p := meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing)
	assert.Assert(t, p != nil)
	assert.Equal(t, p.Reason, likenv1.ReasonK3sRestartFailed)
	assert.Check(t, is.Contains(p.Message, "Machine "+failed+"'s restart of k3s failed"))
	m := l.machine(failed)
	assert.Equal(t, m.Status.Phase, likenv1.MachineDegraded)
	applied := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied)
	assert.Assert(t, applied != nil)
	assert.Equal(t, applied.Reason, likenv1.ReasonK3sRestartFailed)
	n, err := l.kube.CoreV1().Nodes().Get(context.Background(), failed, metav1.GetOptions{})
	assert.NilError(t, err)
	ready := false
	for _, c := range n.Status.Conditions {
		ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
	}
	assert.Assert(t, ready, "the node of %s is Ready again on the arguments it ran before", failed)

	// One machine tried the value, and restarted k3s back; the others never
	// restarted k3s.
	for _, m := range l.machines() {
		rs := k3sRestarts(t, filepath.Join(l.machineDir(m.Name), "disk", "applier.log"))
		if m.Name != failed {
			assert.Equal(t, len(rs), 0, "machine %s restarted k3s", m.Name)
			continue
		}
		assert.Equal(t, len(rs), 2, "machine %s restarted k3s %d times", m.Name, len(rs))
		assert.DeepEqual(t, rs[0].Config.Settings.K3sArgs, []string{changes.LabRefusedArg})
		assert.Assert(t, is.Len(rs[1].Config.Settings.K3sArgs, 0), "restarted with the arguments it ran before")
	}

	// The value is corrected: every machine restarts k3s with it.
	args := []string{"--kubelet-arg=max-pods=120"}
	patch, err = json.Marshal(map[string]any{"spec": map[string]any{"settings": map[string]any{"k3sArgs": args}}})
	assert.NilError(t, err)
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", string(patch))
	l.waitFor("every machine to restart k3s with the corrected value", 3*time.Minute, func() (bool, string) {
		var waiting []string
		for _, m := range l.machines() {
			rs := k3sRestarts(t, filepath.Join(l.machineDir(m.Name), "disk", "applier.log"))
			if len(rs) == 0 || !slices.Equal(rs[len(rs)-1].Config.Settings.K3sArgs, args) || m.Status.Phase != likenv1.MachineReady {
				waiting = append(waiting, fmt.Sprintf("%s %s", m.Name, m.Status.Phase))
			}
		}
		if c := l.cluster(); c.Status.Halt != nil || c.Status.Turns != "" {
			waiting = append(waiting, fmt.Sprintf("halt %v, turns %q", c.Status.Halt, c.Status.Turns))
		}
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
}
