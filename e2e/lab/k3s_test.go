package lab

import (
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

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// A Cluster-wide k3sArgs change reaches every machine without a reboot;
// the leaders restart k3s one at a time, each in a RestartK3s turn that
// ends only once its Node is Ready again, so the datastore never loses
// two members at once. The workers restart k3s at once, with no turn.
// (The lab's liken-node posts the Node's Ready in the second after each
// simulated restart of k3s, as the restarted kubelet does.)
func TestLeadersRestartK3sOneAtATime(t *testing.T) {
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

	// Only leaders took turns, each one RestartK3s turn (in the order
	// they asked).
	var granted []string
	for _, g := range l.w.grants(from) {
		assert.Equal(t, g.reason, likenv1.TurnRestartK3s, "turn of %s", g.machine)
		granted = append(granted, g.machine)
	}
	sort.Strings(granted)
	assert.DeepEqual(t, granted, leaders)
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
