// Package operator tests cluster-operator as real processes against a
// real control plane, with machines simulated from the test as their own
// identities: failover under SIGSTOP, restart mid-rollout with the real
// 40 s startup grace, and heartbeat loss.
package operator

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// A leader stopped with SIGSTOP mid-rollout: the other copy takes over
// and, in its 40 s startup grace, ends the turns that finished meanwhile;
// the first wakes up with a stale view (turns to end, or free budget and
// waiting machines), tries to write the ledger, is stopped by its fence
// and exits. Every version of the
// Cluster stays within the budget.
func TestFailoverUnderSIGSTOP(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 3, workers: 4, maxUnavailable: "2", rebootFor: 5 * time.Second, renewEvery: 2 * time.Second})
	rec := e.record()
	a := e.startOperator("op-a", "--startup-grace=3s")
	e.waitFor("op-a to lead", time.Minute, func() bool { return e.holder() == "op-a" })
	b := e.startOperator("op-b") // the real defaults: 40 s grace
	e.waitFor("the Cluster to read Ready 7/7", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "7/7"
	})

	e.setVersion(version2)
	// Stop op-a once workers take turns.
	e.waitFor("a worker's turn", 2*time.Minute, func() bool {
		for _, tr := range e.cluster().Status.RebootTurns {
			if !tr.Leader {
				return true
			}
		}
		return false
	})
	a.Signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	t.Logf("SIGSTOP op-a with turns %q", e.cluster().Status.Turns)

	e.waitFor("op-b to take the lease", time.Minute, func() bool { return e.holder() == "op-b" })
	tookOver := time.Since(stoppedAt)
	e.waitFor("op-b to end the finished turns during its grace", time.Minute, func() bool {
		c := e.cluster()
		return len(c.Status.RebootTurns) == 0 && progressing(c).Reason == likenv1.ReasonStartupGrace
	})
	logBefore := len(a.Log(t))
	a.Signal(t, syscall.SIGCONT)
	resumedAt := time.Now()
	e.waitFor("op-a to exit", time.Minute, a.Exited)
	assert.Equal(t, a.Code, 3, "a copy that lost the lease exits with code 3")
	after := a.Log(t)[logBefore:]
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, "lost the lease") || strings.Contains(line, "has been modified") {
			t.Logf("op-a after SIGCONT: %s", line)
		}
	}
	assert.Assert(t, is.Contains(after, "lost the lease"))
	// Its stale view made it write the ledger (grant, or end turns that
	// had ended meanwhile): the fence stopped the write, which the copy's
	// own fresh renewal could no longer vouch for after the pause.
	assert.Assert(t, is.Contains(after, "the fence found the lease held by another copy before"), "op-a did not try to write the ledger after SIGCONT")
	// (Its log may still say "Granted a turn" after SIGCONT for a grant it
	// wrote before the SIGSTOP: what counts is the ledger, checked below.)
	assert.Equal(t, e.cluster().Status.Turns, "", "nothing op-a tried reached the ledger")
	t.Logf("op-b took over %s after SIGSTOP; op-a was stopped %s; it exited %s after SIGCONT",
		tookOver.Round(100*time.Millisecond), resumedAt.Sub(stoppedAt).Round(100*time.Millisecond), time.Since(resumedAt).Round(100*time.Millisecond))

	e.waitRolledOut(version2, 3*time.Minute)
	assert.Assert(t, !b.Exited())
	n := rec.check(t)
	grants := rec.grants()
	var order []string
	for _, g := range grants {
		order = append(order, g.machine)
	}
	t.Logf("%d versions of the Cluster checked; grants in order: %v", n, order)
	// Each machine got exactly one turn, leaders first.
	assert.Equal(t, len(grants), 7, "grants: %v", order)
	assert.DeepEqual(t, order[:3], []string{"node-1", "node-2", "node-3"})
	for _, g := range grants[3:] {
		assert.Assert(t, !g.leader)
	}
}

// cluster-operator killed mid-rollout and restarted with its defaults:
// it grants nothing for 40 s, says so, reads a machine that stopped
// heartbeating before it started Lost after 40 s, and that machine holds
// the budget until it comes back.
func TestRestartMidRolloutRealDefaults(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 1, workers: 3, maxUnavailable: "1", rebootFor: 10 * time.Second, renewEvery: 2 * time.Second})
	rec := e.record()
	first := e.startOperator("op-a", "--startup-grace=2s")
	e.waitFor("the Cluster to read Ready 4/4", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "4/4"
	})
	e.setVersion(version2)
	e.waitFor("node-2 to take its turn", 2*time.Minute, func() bool {
		return e.cluster().Status.Turns == "node-2" && e.machine("node-2").Status.Phase == likenv1.MachineUpdating
	})

	// Kill the operator mid-rollout; node-4 hangs (no heartbeat, no
	// status) before the new copy starts; its Node stays Ready.
	first.Signal(t, syscall.SIGKILL)
	e.waitFor("op-a to die", 30*time.Second, first.Exited)
	e.machines["node-4"].Hang(t)
	restarted := e.startOperator("op-a") // the real defaults: 40 s and 40 s
	restartAt := restarted.Started

	e.waitFor("Progressing to say StartupGrace", time.Minute, func() bool {
		return progressing(e.cluster()).Reason == likenv1.ReasonStartupGrace
	})
	msg := progressing(e.cluster()).Message
	t.Logf("Progressing during the grace: %s", msg)
	resumes := restartAt.Add(40 * time.Second).UTC()
	assert.Assert(t, strings.Contains(msg, resumes.Format(time.RFC3339)) || strings.Contains(msg, resumes.Add(time.Second).Format(time.RFC3339)) ||
		strings.Contains(msg, resumes.Add(2*time.Second).Format(time.RFC3339)), "message %q does not name %s", msg, resumes)

	e.waitFor("node-4 to read Lost", 2*time.Minute, func() bool { return e.machine("node-4").Status.Phase == likenv1.MachineLost })
	lostAfter := time.Since(restartAt)
	assert.Assert(t, lostAfter >= 40*time.Second, "node-4 read Lost %s after the restart", lostAfter)

	// node-2 finished; node-3 waits: Lost node-4 fills the budget of 1.
	e.waitFor("node-3 to wait behind Lost node-4", time.Minute, func() bool {
		c := e.cluster()
		p := progressing(c)
		return len(c.Status.RebootTurns) == 0 && p.Reason == likenv1.ReasonGranting && strings.Contains(p.Message, "Waiting for a turn: node-3")
	})
	for _, g := range rec.grants() {
		assert.Assert(t, g.machine != "node-3", "node-3 got a turn while node-4 was Lost")
	}

	e.machines["node-4"].Wake()
	backAt := time.Now()
	e.waitFor("node-3 to get its turn", time.Minute, func() bool { return e.cluster().Status.Turns == "node-3" })
	var firstGrant grant
	for _, g := range rec.grants() {
		if g.machine == "node-3" {
			firstGrant = g
		}
	}
	// grantedAt has whole seconds; the recorder saw the write after it
	// happened.
	assert.Assert(t, !firstGrant.at.Before(restartAt.Truncate(time.Second).Add(40*time.Second)), "node-3 granted at %s", firstGrant.at)
	grace := firstGrant.seen.Sub(restartAt)
	assert.Assert(t, grace >= 40*time.Second, "first grant seen %s after the restart", grace)
	assert.Assert(t, !firstGrant.at.Before(backAt.Truncate(time.Second)), "node-3 was granted before node-4 came back")
	t.Logf("restart at %s: node-4 Lost %s later; node-4 back %s later; first grant seen %s after the restart",
		restartAt.UTC().Format(time.RFC3339), lostAfter.Round(100*time.Millisecond), backAt.Sub(restartAt).Round(100*time.Millisecond),
		grace.Round(100*time.Millisecond))

	e.waitRolledOut(version2, 3*time.Minute)
	n := rec.check(t)
	t.Logf("%d versions of the Cluster checked", n)
}

// A machine renews its Node Lease in kube-node-lease as system:node:<name>,
// under NodeRestriction, as its kubelet would; when the renewals stop it
// reads Lost after --machine-lost-after and counts against the budget;
// events and metrics show it.
func TestLostMachineCountsAgainstBudget(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 1, workers: 3, maxUnavailable: "2", rebootFor: 3 * time.Second, renewEvery: time.Second})
	rec := e.record()
	op := e.startOperator("op-a", "--startup-grace=2s", "--machine-lost-after=5s")
	e.waitFor("the Cluster to read Ready 4/4", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "4/4"
	})
	e.waitFor("the release channel to be read", time.Minute, func() bool {
		return e.cluster().Status.Releases.Available == version2
	})

	e.machines["node-4"].Hang(t)
	// Hang returns once the machine stopped, some time after its last
	// renewal: Lost is measured from that renewal.
	l, err := e.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(e.ctx, "node-4", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, *l.Spec.HolderIdentity, "node-4", "the heartbeat is the Node Lease the machine renewed itself")
	e.waitFor("node-4 to read Lost", time.Minute, func() bool { return e.machine("node-4").Status.Phase == likenv1.MachineLost })
	lost := time.Since(l.Spec.RenewTime.Time)
	assert.Assert(t, lost >= 5*time.Second, "Lost %s after its last renewal, with --machine-lost-after=5s", lost)
	t.Logf("node-4 read Lost %s after its last renewal (flag 5s, renewals every 1s)", lost.Round(100*time.Millisecond))
	for _, name := range []string{"node-1", "node-2", "node-3"} {
		assert.Assert(t, e.machine(name).Status.Phase != likenv1.MachineLost, "%s renews its Node Lease and reads %s", name, e.machine(name).Status.Phase)
	}

	// Two reboots requested with a budget of 2: Lost node-4 takes one
	// slot. Pause turns while both machines stage, so one decision sees
	// both.
	e.setMaxUnavailable("0")
	e.waitFor("Progressing to say Paused", time.Minute, func() bool {
		return progressing(e.cluster()).Reason == likenv1.ReasonPaused
	})
	e.machines["node-2"].RequestReboot()
	e.machines["node-3"].RequestReboot()
	e.waitFor("node-2 and node-3 to ask for a turn", time.Minute, func() bool {
		return e.machine("node-2").Status.Phase == likenv1.MachineRebootPending && e.machine("node-3").Status.Phase == likenv1.MachineRebootPending
	})
	assert.Equal(t, e.cluster().Status.Turns, "")
	e.setMaxUnavailable("2")
	e.waitFor("node-2 to hold a turn and node-3 to wait", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Turns == "node-2" && strings.Contains(progressing(c).Message, "Waiting for a turn: node-3")
	})
	e.waitFor("node-3 to get its turn after node-2", time.Minute, func() bool { return e.cluster().Status.Turns == "node-3" })
	e.waitFor("node-3 to finish", time.Minute, func() bool { return e.cluster().Status.Turns == "" })

	// node-4 comes back and writes its own phase again.
	e.machines["node-4"].Wake()
	e.waitFor("node-4 to report Ready again", time.Minute, func() bool {
		return e.machine("node-4").Status.Phase == likenv1.MachineReady
	})

	// Events and metrics.
	evs, err := e.kube.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	reasons := map[string]int{}
	for _, ev := range evs.Items {
		if ev.ReportingController == "cluster-operator" {
			reasons[ev.Reason]++
		}
	}
	for _, r := range []string{"TurnGranted", "TurnFinished", "MachineLost", "NewReleaseAvailable"} {
		assert.Assert(t, reasons[r] > 0, "no %s event; events: %v", r, reasons)
	}
	// /metrics answers only an identity the API server authorizes.
	code, body := op.Fetch(t, "/metrics", "")
	assert.Equal(t, code, http.StatusUnauthorized, body)
	code, body = op.Fetch(t, "/metrics", e.serviceAccountToken("app", false))
	assert.Equal(t, code, http.StatusForbidden, body)
	assert.Assert(t, is.Contains(body, "system:serviceaccount:liken-system:app may not get /metrics: bind it to the ClusterRole liken:metrics-reader"))
	code, body = op.Fetch(t, "/metrics", e.serviceAccountToken("prometheus", true))
	assert.Equal(t, code, http.StatusOK, body)
	for _, want := range []string{
		`liken_operator_turns_granted_total{cluster="lab",reason="Reboot"} 2`,
		`liken_operator_machines_lost_total{cluster="lab"} 1`,
		`liken_operator_machines{cluster="lab",phase="Ready"} 4`,
		`liken_operator_grant_latency_seconds_count{cluster="lab"} 2`,
		`liken_operator_leading 1`,
	} {
		assert.Assert(t, is.Contains(body, want))
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := op.Fetch(t, path, "")
		assert.Equal(t, code, 200, fmt.Sprintf("%s: %s", path, body))
	}
	n := rec.check(t)
	t.Logf("%d versions of the Cluster checked", n)
}

// cluster-operator killed mid-rollout and replaced by a copy with another
// identity (a new pod) and a short grace: the new copy waits for the old
// lease to expire, then grants nothing for its grace.
func TestKilledAndReplacedShortGrace(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 1, workers: 2, maxUnavailable: "1", rebootFor: 8 * time.Second, renewEvery: time.Second})
	rec := e.record()
	flags := []string{"--startup-grace=6s", "--machine-lost-after=6s"}
	old := e.startOperator("op-old", flags...)
	e.waitFor("the Cluster to read Ready 3/3", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "3/3"
	})
	e.setVersion(version2)
	e.waitFor("node-2 to take its turn", 2*time.Minute, func() bool {
		return e.cluster().Status.Turns == "node-2" && e.machine("node-2").Status.Phase == likenv1.MachineUpdating
	})
	old.Signal(t, syscall.SIGKILL)
	e.waitFor("op-old to die", 30*time.Second, old.Exited)
	killedAt := time.Now()
	e.startOperator("op-new", flags...)
	e.waitFor("op-new to lead", time.Minute, func() bool { return e.holder() == "op-new" })
	l, err := e.kube.CoordinationV1().Leases(likenv1.SystemNamespace).Get(e.ctx, likenv1.OperatorLeaseName, metav1.GetOptions{})
	assert.NilError(t, err)
	leadingAt := l.Spec.AcquireTime.Time
	e.waitFor("node-3 to get its turn", 2*time.Minute, func() bool { return e.cluster().Status.Turns == "node-3" })
	var g grant
	for _, x := range rec.grants() {
		if x.machine == "node-3" {
			g = x
		}
	}
	assert.Assert(t, g.seen.Sub(leadingAt) >= 6*time.Second, "node-3 granted %s after op-new started leading", g.seen.Sub(leadingAt))
	t.Logf("op-new led %s after the kill (the old lease had to expire); first grant seen %s after it started leading",
		leadingAt.Sub(killedAt).Round(100*time.Millisecond), g.seen.Sub(leadingAt).Round(100*time.Millisecond))
	e.waitRolledOut(version2, 2*time.Minute)
	t.Logf("%d versions of the Cluster checked", rec.check(t))
}
