package lab

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// The upgrade guide, step by step, on an Auto lab: find the release with
// the check-releases annotation, have an edit to an uncatalogued version
// refused, catalog the release and set the target with kubectl edit, and
// watch the rollout: every machine downloads, stages, takes its turn and
// runs the new release; one machine at a time under the default budget,
// leaders first; the Cluster goes Updating, then Ready; the wide listing
// names the turn holder.
func TestUpgradeGuide(t *testing.T) {
	// The user's path: cluster-operator keeps its 40 s startup grace.
	l := startLab(t, "e2e-guide", labOptions{policy: "Auto", userDefaults: true})
	from := l.cluster().Spec.Version
	names := machineNames(l)
	// liken lab status names each machine's own identity.
	for _, m := range l.st.Machines {
		who := l.mustKubectl("--kubeconfig", m.Kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		assert.Equal(t, who, "system:node:"+m.Name)
	}

	// 1. Find the release.
	next := l.publish("")
	request := time.Now().UTC().Format(time.RFC3339Nano)
	l.mustKubectl("annotate", "cluster", "--all", "--overwrite", likenv1.AnnotationCheckReleases+"="+request)
	l.waitFor("kubectl get clusters to show AVAILABLE "+next.Version, time.Minute, func() (bool, string) {
		out, _, err := l.kubectl("get", "clusters")
		if err != nil {
			return false, err.Error()
		}
		r := row(out, l.name)
		// cluster-operator acted on this request (not only on its own
		// poll every 30 s).
		acted := l.cluster().Status.Releases.ObservedCheckRequest == request
		return r != nil && r["AVAILABLE"] == next.Version && acted, fmt.Sprintf("acted on the request: %v\n%s", acted, out)
	})

	// 2. An edit to a version the catalog does not name is refused while
	// the edit is open, and changes nothing.
	refused := l.edit(editPlan{Version: next.Version})
	assert.Assert(t, refused.err != nil, "kubectl edit to an uncatalogued version succeeded:\n%s", refused.stdout)
	msg := "spec.version " + next.Version + " is not in spec.releases.catalog"
	assert.Assert(t, len(refused.buffers) == 2, "kubectl did not reopen the edit after the refusal (%d openings); stderr:\n%s", len(refused.buffers), refused.stderr)
	assert.Assert(t, refused.shown(msg), "the reopened edit does not say %q:\n%s", msg, refused.buffers[len(refused.buffers)-1])
	assert.Assert(t, is.Contains(refused.stderr, "is invalid"))
	assert.Equal(t, l.cluster().Spec.Version, from)
	t.Logf("kubectl edit refused, reopened with: %s", firstLineWith(refused.buffers[1], msg))

	// Catalog the release and set the target in one edit; drop the lab's
	// maxUnavailable so the default budget (one machine, which the API
	// server fills in) applies.
	ok := l.edit(editPlan{Version: next.Version, Add: []likenv1.CatalogEntry{next}, DropMaxUnavailable: true})
	assert.NilError(t, ok.err, "kubectl edit: %s", ok.stderr)
	assert.Equal(t, len(ok.buffers), 1)
	c := l.cluster()
	assert.Equal(t, c.Spec.Version, next.Version)
	budget, err := c.Spec.Disruption.MaxUnavailableFor(len(names))
	assert.NilError(t, err)
	assert.Equal(t, budget, 1, "the default budget (maxUnavailable %v)", c.Spec.Disruption.MaxUnavailable)
	start := time.Now()
	l.w.settle(t)
	edited := l.w.clusterRV(func(c *likenv1.Cluster) bool { return c.Spec.Version == next.Version })
	assert.Assert(t, edited > 0)

	// 3 and 4. Watch the rollout: the wide listing names the turn holder.
	var turnsRow string
	l.waitFor("kubectl get clusters -o wide to name a turn holder in TURNS", 3*time.Minute, func() (bool, string) {
		out, _, err := l.kubectl("get", "clusters", "-o", "wide")
		if err != nil {
			return false, err.Error()
		}
		r := row(out, l.name)
		if r == nil || !slices.Contains(names, r["TURNS"]) {
			return false, out
		}
		turnsRow = out
		return true, ""
	})
	t.Logf("kubectl get clusters -o wide during the rollout:\n%s", turnsRow)
	header := strings.Fields(strings.SplitN(turnsRow, "\n", 2)[0])
	assert.DeepEqual(t, header, []string{"NAME", "STATUS", "MACHINES", "VERSION", "NEWEST", "AVAILABLE", "LEADERS", "ENDPOINT", "AGE", "TURNS"})
	r := row(turnsRow, l.name)
	assert.Equal(t, r["STATUS"], "Updating")
	assert.Equal(t, r["VERSION"], next.Version)
	assert.Equal(t, r["NEWEST"], next.Version)
	assert.Equal(t, r["LEADERS"], `["node-1","node-2","node-3"]`)

	l.waitFor("every machine to run "+next.Version+" and the Cluster to read Ready", 4*time.Minute, func() (bool, string) {
		c := l.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == fmt.Sprintf("%d/%d", len(names), len(names)), fmt.Sprintf("%s %s", c.Status.Phase, c.Status.Machines)
	})
	rollout := time.Since(start)
	for _, m := range l.machines() {
		assert.Equal(t, m.Status.Version, next.Version, "machine %s", m.Name)
		assert.Equal(t, m.Status.Slot, "B", "machine %s", m.Name)
		assert.Equal(t, m.Status.Phase, likenv1.MachineReady, "machine %s", m.Name)
	}
	out := l.mustKubectl("get", "clusters", "-o", "wide")
	r = row(out, l.name)
	assert.Equal(t, r["STATUS"], "Ready")
	assert.Equal(t, r["TURNS"], "")
	l.w.settle(t)

	// Every machine went Downloading, UpdatePending, Updating, then Ready
	// on the new version.
	for _, n := range names {
		p := l.w.phases(n, edited)
		t.Logf("%s: %s", n, phaseTimes(l.w.machineHistory(n, edited), start))
		assert.DeepEqual(t, p, []string{"Downloading", "UpdatePending", "Updating", "Ready"})
	}
	// The Cluster went Updating, then Ready.
	cp := l.w.clusterPhases(edited)
	t.Logf("Cluster phases after the edit: %v", cp)
	assert.Assert(t, len(cp) >= 2 && cp[len(cp)-2] == "Updating" && cp[len(cp)-1] == "Ready", "Cluster phases %v", cp)

	// One machine at a time, leaders first: one turn and one machine
	// Updating at most at any revision, and LIKEN changed machine by
	// machine, each after the previous one finished.
	turns, updating := l.w.most(edited)
	assert.Equal(t, turns, 1, "most turns held at once")
	assert.Equal(t, updating, 1, "most machines Updating at once")
	g := l.w.grants(edited)
	assert.DeepEqual(t, grantNames(g), []string{"node-1", "node-2", "node-3", "node-4", "node-5"})
	for _, gr := range g {
		assert.Equal(t, gr.reason, likenv1.TurnRelease)
	}
	order := versionOrder(l.w, names, edited, next.Version)
	assert.DeepEqual(t, namesOf(order), []string{"node-1", "node-2", "node-3", "node-4", "node-5"})
	for i := 1; i < len(order); i++ {
		assert.Assert(t, order[i].updatingRV > order[i-1].readyRV,
			"%s started Updating (revision %d) before %s was Ready on %s (revision %d)", order[i].name, order[i].updatingRV, order[i-1].name, next.Version, order[i-1].readyRV)
	}
	l.checkBootedAndStaged()
	t.Logf("rollout of %d machines: %s from the edit (first turn granted %s after lab up returned)",
		len(names), rollout.Round(100*time.Millisecond), graceEnd(l).Round(time.Second))
}

func machineNames(l *lab) []string {
	var out []string
	for _, m := range l.machines() {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

func firstLineWith(s, sub string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// phaseTimes prints a machine's phases with when each began, relative to
// start.
func phaseTimes(h []record[*likenv1.Machine], start time.Time) string {
	var parts []string
	last := ""
	for _, r := range h {
		p := fmt.Sprintf("%s(%s)", r.obj.Status.Phase, r.obj.Status.Version)
		if p != last {
			parts = append(parts, fmt.Sprintf("%s@%+.1fs", p, r.at.Sub(start).Seconds()))
			last = p
		}
	}
	return strings.Join(parts, " → ")
}

// turnTimes is when a machine started its turn and when it finished.
type turnTimes struct {
	name                string
	updatingRV, readyRV int64
}

// versionOrder lists machines in the order they became Ready on version,
// with the revision each first reported Updating.
func versionOrder(w *watcher, names []string, from int64, version string) []turnTimes {
	var out []turnTimes
	for _, n := range names {
		tt := turnTimes{name: n}
		for _, r := range w.machineHistory(n, from) {
			if tt.updatingRV == 0 && r.obj.Status.Phase == likenv1.MachineUpdating {
				tt.updatingRV = r.rv
			}
			if tt.readyRV == 0 && r.obj.Status.Phase == likenv1.MachineReady && r.obj.Status.Version == version {
				tt.readyRV = r.rv
			}
		}
		out = append(out, tt)
	}
	slices.SortFunc(out, func(a, b turnTimes) int { return int(a.readyRV - b.readyRV) })
	return out
}

func namesOf(ts []turnTimes) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.name)
	}
	return out
}

// graceEnd is how long after lab up returned the first turn was granted
// (cluster-operator grants nothing during its startup grace).
func graceEnd(l *lab) time.Duration {
	g := l.w.grants(0)
	if len(g) == 0 {
		return 0
	}
	return g[0].at.Sub(l.up)
}
