package cli

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
)

// TestWithClusterOperator runs the commands against a real cluster-operator
// process and machines simulated from the test (status and heartbeat
// written as each machine's own identity, following docs/design/protocol.md):
// a Manual fleet moves only when liken approve-reboot approves, both
// commands say why a machine waits as cluster-operator says it, liken
// rollout status follows it to the end, liken request-reboot takes one
// reboot through a turn, and liken rollout resume lifts a stall.
func TestWithClusterOperator(t *testing.T) {
	names := []string{"o-1", "o-2", "o-3", "t-1"}
	cp := controlplanetest.Start(t, controlplane.Options{Machines: names})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fleetsim.Install(ctx, t, cp)
	admin, err := versioned.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	e := &env{cp: cp, admin: admin}

	omega := clitest.Cluster("omega", "1")
	tau := clitest.Cluster("tau", "1")
	tau.Spec.Disruption.StallTimeout = &metav1.Duration{Duration: 3 * time.Second}
	// The simulated machines run no workloads: no settle time between turns.
	omega.Spec.Disruption.Settle = &metav1.Duration{}
	for _, cl := range []*v1alpha1.Cluster{omega, tau} {
		_, err := admin.LikenV1alpha1().Clusters().Create(ctx, cl, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
	sims := map[string]*fleetsim.Machine{}
	for _, m := range []*v1alpha1.Machine{
		clitest.Machine("o-1", "omega", v1alpha1.RoleLeader, v1alpha1.RebootManual),
		clitest.Machine("o-2", "omega", v1alpha1.RoleWorker, v1alpha1.RebootManual),
		clitest.Machine("o-3", "omega", v1alpha1.RoleWorker, v1alpha1.RebootManual),
		clitest.Machine("t-1", "tau", v1alpha1.RoleLeader, v1alpha1.RebootAuto),
	} {
		assert.NilError(t, cp.AddNode(ctx, m.Name, nil))
		_, err := admin.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
		assert.NilError(t, err)
		sims[m.Name] = fleetsim.StartMachine(ctx, t, cp, m.Name, fleetsim.MachineOptions{
			Cluster: m.Spec.Cluster, Version: clitest.Version1, Tick: 100 * time.Millisecond, RenewEvery: time.Second,
		})
	}
	sims["t-1"].StayDownInTurns(true) // t-1 never comes back from its turn
	fleetsim.StartOperator(t, cp, "e2e-cli", "--startup-grace=2s")

	// omega: nothing moves before approval.
	status := e.start(ctx, "rollout", "status", "omega")
	status.waitOutput(t, "o-1  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines 0/3]  awaiting approval: liken approve-reboot omega o-1")
	waitCluster(t, admin, "omega", "granting to begin", func(cl *v1alpha1.Cluster) bool {
		p := meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ConditionProgressing)
		return p != nil && p.Reason != v1alpha1.ReasonStartupGrace
	})
	cl, err := admin.LikenV1alpha1().Clusters().Get(ctx, "omega", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(cl.Status.RebootTurns), 0, "a turn was granted without approval")

	// A person approves the worker o-3 before the leader: both commands
	// say, as cluster-operator does, that o-3 waits for o-1 (the leader) to
	// run the release, and that o-1 waits for its own approval.
	status.waitOutput(t, "awaiting approval: liken approve-reboot omega o-3")
	code, out, stderr := e.liken(ctx, "approve-reboot", "omega", "o-3")
	assert.Equal(t, code, 0, stderr)
	const leaderFirst = "Waiting for a turn: o-3. Workers update to 2026.10.12-001 after every leader runs it; " +
		"leaders not on it yet: o-1 (UpdatePending, waits for `liken approve-reboot omega o-1`)."
	assert.Assert(t, is.Contains(out, "Next: o-3 waits for a reboot turn under the disruption budget of cluster omega.\n"+
		"  Turns held:      none (maxUnavailable 1)\n"+
		"  Operator says:   "+leaderFirst+"\n"), out)
	status.waitOutput(t, "o-3  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines 0/3]  waiting for a turn: see what cluster-operator says\n")
	status.waitOutput(t, "cluster-operator on cluster omega (Granting): "+leaderFirst+"\n")
	cl, err = admin.LikenV1alpha1().Clusters().Get(ctx, "omega", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(cl.Status.RebootTurns), 0, "a worker got a turn before the leader")

	// The leader first: approve o-1, it takes its turn and comes back on
	// the new release; o-3 follows by itself; then o-2.
	for _, n := range []string{"o-1", "o-2"} {
		status.waitOutput(t, "awaiting approval: liken approve-reboot omega "+n)
		code, out, stderr := e.liken(ctx, "approve-reboot", "omega", n)
		assert.Equal(t, code, 0, stderr)
		assert.Assert(t, is.Contains(out, "Approved the change staged on "+n))
		status.waitOutput(t, n+"  Updating")
		status.waitOutput(t, n+"  Ready          2026.10.12-001")
	}
	assert.Equal(t, status.waitExit(t), 0, status.errOut.String())
	assert.Assert(t, is.Contains(status.out.String(), "Rollout of cluster omega to 2026.10.12-001 complete: 3/3 machines ready."))

	// request-reboot: o-2 stages a reboot, waits for approval, takes a turn
	// and comes back from a new boot.
	boot := sims["o-2"].BootID()
	code, _, stderr = e.liken(ctx, "request-reboot", "omega", "o-2")
	assert.Equal(t, code, 0, stderr)
	waitMachine(t, admin, "o-2", "the reboot request to be staged", func(m *v1alpha1.Machine) bool {
		return m.Status.Phase == v1alpha1.MachineRebootPending && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.ConditionRebootPending)
	})
	code, out, stderr = e.liken(ctx, "approve-reboot", "omega", "o-2")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "a requested reboot"))
	waitMachine(t, admin, "o-2", "o-2 to reboot", func(m *v1alpha1.Machine) bool {
		return m.Status.Phase == v1alpha1.MachineReady && m.Status.Observed.BootID != boot && m.Status.ObservedRebootRequest != ""
	})

	// tau: t-1 takes its turn and never returns; the rollout stalls, liken
	// rollout status exits 1, and liken rollout resume releases the turn.
	code, _, stderr = e.liken(ctx, "rollout", "status", "tau", "--timeout", "60s")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "is halted (RolloutStalled on t-1)"), stderr)
	code, out, stderr = e.liken(ctx, "rollout", "resume", "tau")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "The turn t-1 held is released"))
	waitCluster(t, admin, "tau", "the halt to be lifted and the turn released", func(cl *v1alpha1.Cluster) bool {
		return cl.Status.Halt == nil && cl.Status.ObservedResume == cl.Annotations[v1alpha1.AnnotationResumeRollout]
	})
}

func waitCluster(t *testing.T, c versioned.Interface, name, what string, ok func(*v1alpha1.Cluster) bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		cl, err := c.LikenV1alpha1().Clusters().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if ok(cl) {
			return poll.Success()
		}
		return poll.Continue("waiting for %s: status %+v", what, cl.Status)
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(100*time.Millisecond))
}

func waitMachine(t *testing.T, c versioned.Interface, name, what string, ok func(*v1alpha1.Machine) bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		m, err := c.LikenV1alpha1().Machines().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if ok(m) {
			return poll.Success()
		}
		return poll.Continue("waiting for %s: status %+v", what, m.Status)
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(100*time.Millisecond))
}
