package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// A release whose image panics at boot, then one that boots but never
// rejoins: each time the first machine to try returns to its proven slot
// on its own, reports TrialFailed, the rollout halts, and no other
// machine takes the bad release. A new spec.version lifts a halt, and a
// return to the panicking release halts again. liken rollout resume lets
// the fleet try the release once more: that trial fails too and holds the
// release back again, so nothing reboots into it a second time.
func TestFailedTrialsHaltTheRollout(t *testing.T) {
	l, good, panicking, from := startWithBadTarget(t, "e2e-faults", "panic")
	failed, took := l.waitTrialFailed(panicking.Version, time.Time{}, 3*time.Minute)
	l.checkTrialFailed(from, failed, good, panicking.Version)
	assert.Assert(t, len(l.firmwareLines(failed, "kernel panic")) > 0, "%s's firmware did not log the panic", failed)
	t.Logf("panic release: halted %s after spec.version changed", took.Round(100*time.Millisecond))

	// liken rollout status reports the halt and fails.
	out, err := l.liken("rollout", "status", l.name)
	assert.Assert(t, err != nil, "liken rollout status succeeded on a halted rollout:\n%s", out)
	assert.Assert(t, is.Contains(out, "halted (TrialFailed on "+failed+")"))

	// A new spec.version lifts the halt; the next bad release fails the
	// same way, after the trial timeout (15 s here: the trial reads it when
	// it is armed).
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", `{"spec":{"disruption":{"trialTimeout":"15s"}}}`)
	noRejoin := l.publish("no-rejoin")
	from = l.setVersion(noRejoin.Version, noRejoin)
	failed, took = l.waitTrialFailed(noRejoin.Version, time.Time{}, 4*time.Minute)
	l.checkTrialFailed(from, failed, good, noRejoin.Version)
	assert.Assert(t, len(l.firmwareLines(failed, "cannot reach the cluster API")) > 0, "%s's firmware did not log the unreachable API", failed)
	tf := condition(l.machine(failed).Status.Conditions, likenv1.ConditionTrialFailed)
	assert.Assert(t, is.Contains(tf.Message, noRejoin.Version))
	assert.Assert(t, is.Contains(tf.Message, "did not rejoin"))
	t.Logf("no-rejoin release: halted %s after spec.version changed (trial timeout %s)", took.Round(100*time.Millisecond), l.cluster().Spec.Disruption.TrialTimeoutOrDefault())

	// Back to the panicking release (a quick failure): it halts again.
	back := time.Now()
	from = l.setVersion(panicking.Version)
	failed, took = l.waitTrialFailed(panicking.Version, back, 3*time.Minute)
	l.checkTrialFailed(from, failed, good, panicking.Version)
	t.Logf("panic release again: %s tried it, halted %s after spec.version changed", failed, took.Round(100*time.Millisecond))

	// liken rollout resume: the fleet may try the release again. One
	// machine does, fails the same way, and the release is held back
	// again: the rollout halts on it, it asks for no turn, the others wait
	// behind the halt, and nothing reboots into the release again.
	resumed, resumeAt := l.w.settle(t), time.Now()
	out = l.mustLiken("rollout", "resume", l.name)
	t.Logf("liken rollout resume %s:\n%s", l.name, out)
	assert.Assert(t, is.Contains(out, fmt.Sprintf("resume the rollout of cluster %s (halted: TrialFailed on %s)", l.name, failed)))
	retried, took := l.waitTrialFailed(panicking.Version, resumeAt, 3*time.Minute)
	l.waitFor("the release to be held back after the resumed trial failed", 2*time.Minute, func() (bool, string) {
		c := l.cluster()
		if h := c.Status.Halt; h == nil || h.Machine != retried || h.Reason != likenv1.ReasonTrialFailed || c.Status.Turns != "" {
			return false, fmt.Sprintf("halt %+v, turns %q", h, c.Status.Turns)
		}
		var not []string
		for _, m := range l.machines() {
			tf := condition(m.Status.Conditions, likenv1.ConditionTrialFailed)
			switch {
			case m.Name == retried && (tf.Status != metav1.ConditionTrue || m.Status.Change != ""):
				not = append(not, fmt.Sprintf("%s %s TrialFailed=%s change %q", m.Name, m.Status.Phase, tf.Status, m.Status.Change))
			case m.Name != retried && (m.Status.Phase != likenv1.MachineUpdatePending || m.Status.Staged != panicking.Version):
				not = append(not, fmt.Sprintf("%s %s staged %q", m.Name, m.Status.Phase, m.Status.Staged))
			}
		}
		return len(not) == 0, strings.Join(not, ", ")
	})
	out, err = l.liken("rollout", "status", l.name)
	assert.Assert(t, err != nil, "liken rollout status succeeded on a halted rollout:\n%s", out)
	assert.Assert(t, is.Contains(out, "halted (TrialFailed on "+retried+")"))
	l.checkTrialFailed(resumed, retried, good, panicking.Version)
	trials := map[string]int{}
	for _, n := range machineNames(l) {
		if k := len(l.firmwareLinesSince(n, "(one-time trial)", resumeAt)); k > 0 {
			trials[n] = k
		}
	}
	assert.DeepEqual(t, trials, map[string]int{retried: 1})
	t.Logf("resumed: %s tried %s again, halted %s after the resume; trial boots since: %v", retried, panicking.Version, took.Round(100*time.Millisecond), trials)
	l.checkBootedAndStaged()
}

// firmwareLinesSince are the firmware's lines of a machine's log that
// contain s, logged at or after since (the log has whole seconds).
func (l *lab) firmwareLinesSince(name, s string, since time.Time) []string {
	l.t.Helper()
	var out []string
	for _, line := range l.firmwareLines(name, s) {
		stamp, _, _ := strings.Cut(line, " ")
		at, err := time.Parse(time.RFC3339, stamp)
		assert.NilError(l.t, err, "machine %s's log line %q has no time", name, line)
		if !at.Before(since.Truncate(time.Second)) {
			out = append(out, line)
		}
	}
	return out
}

// A release whose served image does not match its release document is
// never staged anywhere: every machine refuses it, says which artifact
// failed and why, and keeps running its release. No turn is granted.
func TestCorruptReleaseIsNeverStaged(t *testing.T) {
	l, good, bad, from := startWithBadTarget(t, "e2e-corrupt", "corrupt")

	l.waitFor("every machine to refuse "+bad.Version, 2*time.Minute, func() (bool, string) {
		var not []string
		for _, m := range l.machines() {
			c := condition(m.Status.Conditions, likenv1.ConditionReleaseVerified)
			if c.Status != metav1.ConditionFalse || c.Reason != "ChecksumMismatch" {
				not = append(not, fmt.Sprintf("%s ReleaseVerified=%s/%s", m.Name, c.Status, c.Reason))
			}
		}
		return len(not) == 0, strings.Join(not, ", ")
	})
	for _, m := range l.machines() {
		c := condition(m.Status.Conditions, likenv1.ConditionReleaseVerified)
		assert.Assert(t, is.Contains(c.Message, "rootfs.squashfs"), "machine %s", m.Name)
		assert.Assert(t, is.Contains(c.Message, bad.Version), "machine %s", m.Name)
		assert.Assert(t, is.Contains(c.Message, "nothing staged"), "machine %s", m.Name)
		assert.Equal(t, m.Status.Version, good, "machine %s", m.Name)
		assert.Equal(t, m.Status.Staged, "", "machine %s", m.Name)
		assert.Equal(t, m.Status.Phase, likenv1.MachineDownloading, "machine %s keeps trying", m.Name)
	}
	t.Logf("node-1 ReleaseVerified: %s", condition(l.machine("node-1").Status.Conditions, likenv1.ConditionReleaseVerified).Message)

	// Each machine also said so in an event.
	evs, err := l.kube.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	assert.NilError(t, err)
	warned := map[string]string{}
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "Machine" && ev.Type == "Warning" && strings.Contains(ev.Note, bad.Version) && strings.Contains(ev.Note, "rootfs.squashfs") {
			warned[ev.Regarding.Name] = ev.Reason + ": " + ev.Note
		}
	}
	for _, n := range machineNames(l) {
		assert.Assert(t, warned[n] != "", "no Warning event on Machine %s names %s and rootfs.squashfs", n, bad.Version)
	}
	t.Logf("node-1 event: %s", warned["node-1"])

	l.w.settle(t)
	assert.Equal(t, len(l.w.grants(from)), 0, "turns granted for a corrupt release: %v", grantNames(l.w.grants(from)))
	for _, n := range machineNames(l) {
		for _, p := range l.w.phases(n, from) {
			assert.Equal(t, p, string(likenv1.MachineDownloading), "machine %s", n)
		}
	}
	l.checkBootedAndStaged()
}

// waitTrialFailed waits until the rollout to version halts with
// TrialFailed (a halt no older than since), and returns the machine the
// halt names.
func (l *lab) waitTrialFailed(version string, since time.Time, timeout time.Duration) (string, time.Duration) {
	l.t.Helper()
	var machine string
	took := l.waitFor(fmt.Sprintf("the rollout to %s to halt with TrialFailed", version), timeout, func() (bool, string) {
		c := l.cluster()
		p := condition(c.Status.Conditions, likenv1.ConditionProgressing)
		h := c.Status.Halt
		if p.Status != metav1.ConditionFalse || p.Reason != likenv1.ReasonTrialFailed || h == nil || h.Version != version || c.Status.Turns != "" ||
			h.Since.Time.Before(since.Truncate(time.Second)) {
			return false, fmt.Sprintf("Progressing %s/%s, halt %+v, turns %q", p.Status, p.Reason, h, c.Status.Turns)
		}
		m := l.machine(h.Machine)
		tf := condition(m.Status.Conditions, likenv1.ConditionTrialFailed)
		machine = h.Machine
		return tf.Status == metav1.ConditionTrue, fmt.Sprintf("halted on %s, which reports %s TrialFailed=%s", h.Machine, m.Status.Phase, tf.Status)
	})
	return machine, took
}

// checkTrialFailed proves what a failed trial of version on machine must
// leave behind, from revision from on: the machine back on its proven slot
// A running proven, the trial slot marked Failed, the halt naming it, and
// no other machine ever granted a turn for the release or running it.
func (l *lab) checkTrialFailed(from int64, machine, proven, version string) {
	t := l.t
	t.Helper()
	l.w.settle(t)
	if h := l.w.clusterHistory(from); len(h) > 0 {
		t.Logf("%s after spec.version changed: %s", machine, phaseTimes(l.w.machineHistory(machine, from), h[0].at))
		for _, g := range l.w.grants(from) {
			t.Logf("turn granted to %s %+.1fs after spec.version changed", g.machine, g.at.Sub(h[0].at).Seconds())
		}
	}
	m := l.machine(machine)
	assert.Equal(t, m.Status.Version, proven, "%s returned to its proven release", machine)
	assert.Equal(t, m.Status.Slot, "A", "%s returned to its proven slot", machine)
	for _, s := range m.Status.Slots {
		if s.Name == "B" {
			assert.Equal(t, s.State, likenv1.SlotFailed, "%s's trial slot", machine)
			assert.Equal(t, s.Version, version)
		}
	}
	tf := condition(m.Status.Conditions, likenv1.ConditionTrialFailed)
	assert.Equal(t, tf.Reason, likenv1.ReasonTrialFailed)
	t.Logf("%s TrialFailed: %s", machine, tf.Message)
	p := condition(l.cluster().Status.Conditions, likenv1.ConditionProgressing)
	assert.Assert(t, is.Contains(p.Message, machine))
	t.Logf("Cluster Progressing=%s %s: %s", p.Status, p.Reason, p.Message)

	// The firmware booted the trial slot once, then the proven slot, with
	// no one's help.
	boots := l.firmwareLines(machine, ": boot ")
	trial := -1
	for i, b := range boots {
		if strings.Contains(b, "slot B (one-time trial)") {
			trial = i
		}
	}
	assert.Assert(t, trial >= 0 && trial+1 < len(boots) && strings.Contains(boots[trial+1], "slot A (proven)"),
		"%s's boots: %s", machine, strings.Join(boots, "\n"))

	// The machine got one turn; no other machine took one (a machine may
	// be granted a turn for the release it staged before spec.version
	// changed, which is taken back as it withdraws that release); nobody
	// else ran the bad release.
	tried := 0
	for _, g := range l.w.grants(from) {
		if g.machine == machine {
			tried++
		}
	}
	assert.Equal(t, tried, 1, "grants: %v", grantNames(l.w.grants(from)))
	for _, n := range machineNames(l) {
		for _, r := range l.w.machineHistory(n, from) {
			assert.Assert(t, r.obj.Status.Version != version, "machine %s reported running bad release %s (revision %d)", n, version, r.rv)
			if n != machine {
				assert.Assert(t, r.obj.Status.Phase != likenv1.MachineUpdating, "machine %s took a turn for bad release %s (revision %d)", n, version, r.rv)
			}
		}
	}
	// The (last) halt on this machine came with the end of its turn, and
	// nothing was granted after it.
	halted := int64(0)
	var prev *likenv1.RolloutHalt
	for _, r := range l.w.clusterHistory(from) {
		h := r.obj.Status.Halt
		if h != nil && h.Version == version && h.Machine == machine && (prev == nil || !prev.Since.Equal(&h.Since)) {
			halted = r.rv
			assert.Equal(t, r.obj.Status.Turns, "", "the halt at revision %d", r.rv)
		}
		prev = h
	}
	assert.Assert(t, halted > 0)
	assert.Equal(t, len(l.w.grants(halted)), 0, "turns granted after the halt: %v", grantNames(l.w.grants(halted)))
}
