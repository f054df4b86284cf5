package operator

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/window"
)

// A Cluster whose only maintenance window opens in the future: the
// machines download and stage the release at once, the real
// cluster-operator grants nothing before the window opens and says when it
// will, and the rollout runs once it opens. The window is in Asia/Kolkata
// (UTC+05:30), so the operator binary must carry its own time zone data.
// The window opens at the first whole minute at least 10 s away: the test
// waits 10 to 70 s for it, about 90 s in all at worst.
func TestWindowOpensInTheFuture(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 1, workers: 2, maxUnavailable: "3", rebootFor: time.Second, renewEvery: time.Second})
	rec := e.record()
	e.startOperator("op-a", "--startup-grace=2s")
	e.waitFor("the Cluster to read Ready 3/3", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "3/3"
	})

	loc, err := window.Location("Asia/Kolkata")
	assert.NilError(t, err)
	now := time.Now()
	opens := now.Truncate(time.Minute).Add(time.Minute)
	if opens.Sub(now) < 10*time.Second {
		opens = opens.Add(time.Minute)
	}
	local := opens.In(loc)
	w := likenv1.MaintenanceWindow{Days: []string{local.Format("Mon")}, Start: local.Format("15:04"),
		Duration: metav1.Duration{Duration: 30 * time.Minute}, TimeZone: "Asia/Kolkata"}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{
		"version":    version2,
		"disruption": map[string]any{"windows": []likenv1.MaintenanceWindow{w}},
	}})
	assert.NilError(t, err)
	_, err = e.liken.LikenV1alpha1().Clusters().Patch(e.ctx, clusterName, types.MergePatchType, patch, metav1.PatchOptions{})
	assert.NilError(t, err)
	t.Logf("window %s %s for 30m Asia/Kolkata: opens at %s, in %s", w.Days[0], w.Start, opens.UTC().Format(time.RFC3339), time.Until(opens).Round(time.Second))

	// Before the window: every machine stages the release, no turn.
	e.waitFor("every machine to stage the release and Progressing to say when the window opens", time.Until(opens), func() bool {
		for _, n := range e.names {
			if e.machine(n).Status.Phase != likenv1.MachineUpdatePending {
				return false
			}
		}
		p := progressing(e.cluster())
		return p.Reason == likenv1.ReasonOutsideWindow
	})
	c := e.cluster()
	p := progressing(c)
	t.Logf("Progressing before the window: %s", p.Message)
	assert.Equal(t, p.Status, metav1.ConditionFalse)
	assert.Assert(t, strings.Contains(p.Message, "the next opens "+window.Format(opens, loc)), "message %q does not name %s", p.Message, window.Format(opens, loc))
	assert.Assert(t, strings.Contains(p.Message, "Waiting for a turn: node-1,node-2,node-3."), p.Message)
	assert.Equal(t, c.Status.Phase, likenv1.ClusterUpdating, "the STATUS column reads as in any rollout")
	assert.Equal(t, c.Status.Turns, "")

	// After: the leader first, then the workers, all after the opening.
	e.waitFor("node-1 to get its turn when the window opens", time.Until(opens)+20*time.Second, func() bool {
		return len(rec.grants()) > 0
	})
	e.waitRolledOut(version2, time.Minute)
	grants := rec.grants()
	assert.Equal(t, len(grants), 3, "%v", grants)
	assert.Equal(t, grants[0].machine, "node-1")
	for _, g := range grants {
		assert.Assert(t, !g.at.Before(opens), "%s granted at %s, before the window opened at %s", g.machine, g.at.UTC(), opens.UTC())
	}
	first := grants[0].seen.Sub(opens)
	t.Logf("first grant seen %s after the window opened", first.Round(10*time.Millisecond))
	assert.Assert(t, first < 5*time.Second, "the first grant came %s after the window opened", first)
	n := rec.check(t)
	t.Logf("%d versions of the Cluster checked", n)
}
