package daemon_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/daemon"
)

// k3sApplier is the machine's Recorder, with a RestartK3s that fails
// while fail is set, or hangs until its context ends (a daemon stopped in
// the middle of the restart) while hang is set.
type k3sApplier struct {
	*changes.Recorder
	mu   sync.Mutex
	fail error
	hang chan struct{}
}

func (a *k3sApplier) RestartK3s(ctx context.Context, cfg changes.Config, changed []changes.Change) error {
	a.mu.Lock()
	fail, hang := a.fail, a.hang
	a.mu.Unlock()
	if hang != nil {
		close(hang)
		<-ctx.Done()
		return ctx.Err()
	}
	if fail != nil {
		return fail
	}
	return a.Recorder.RestartK3s(ctx, cfg, changed)
}

func (a *k3sApplier) set(fail error, hang chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail, a.hang = fail, hang
}

// newLeader is a Ready leader (rebootPolicy Manual) and its daemon.
func newLeader(t *testing.T, o daemon.Options) (*env, func() daemon.Options) {
	e := newEnv(t, likenv1.RebootManual)
	e.editMachine(func(m *likenv1.Machine) { m.Spec.Role = likenv1.RoleLeader })
	opts := func() daemon.Options {
		out := e.options()
		out.Applier = o.Applier
		return out
	}
	return e, opts
}

// grantInPlace plays cluster-operator: it records a turn of reason (Live or RestartK3s) for the
// change the machine reports, and returns the change.
func (e *env) grantInPlace(reason likenv1.TurnReason) string {
	e.t.Helper()
	m := e.machine()
	assert.Assert(e.t, m.Status.Change != "", "the machine asks for no turn")
	c := e.cluster()
	c.Status.RebootTurns = []likenv1.RebootTurn{{Machine: "m1", Reason: reason, Change: m.Status.Change, Leader: m.Spec.Role == likenv1.RoleLeader,
		BootID: m.Status.Observed.BootID, GrantedAt: metav1.Now()}}
	_, err := e.lk.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
	return m.Status.Change
}

// kubeletBack posts the Node's Ready as the kubelet that k3s started
// again does: this boot's ID, a heartbeat a second after now.
func (e *env) kubeletBack() { e.kubeletBackAt(time.Now()) }

// kubeletBackAt posts the Node's Ready with a heartbeat a second after
// now (the daemon's clock).
func (e *env) kubeletBackAt(now time.Time) {
	e.t.Helper()
	e.mu.Lock()
	id := e.bootID
	e.mu.Unlock()
	n := e.node()
	n.Status.NodeInfo.BootID = id
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(now.Add(time.Second))}}
	_, err := e.kube.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

func (e *env) restarts() int { return e.m.Recorder.Count(changes.OpRestartK3s) }

var newArgs = []string{"--max-pods=200"}

// waitingForTurn waits until the machine lists the k3sArgs change and
// asks for a turn to restart k3s, and checks that k3s was not restarted.
func (e *env) waitingForTurn() *likenv1.Machine {
	e.t.Helper()
	m := e.waitFor("the machine asks for a turn to restart k3s", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != "" &&
			cond(m, likenv1.ConditionRebootPending).Reason == likenv1.ReasonAwaitingTurn
	})
	assert.DeepEqual(e.t, m.Status.Pending, []likenv1.PendingChange{{Field: changes.FieldK3sArgs, Class: likenv1.ClassRestartK3s, Since: m.Status.Pending[0].Since}})
	assert.Assert(e.t, is.Contains(cond(m, likenv1.ConditionRebootPending).Message, "waits for a turn from cluster-operator to restart k3s in place"))
	assert.Equal(e.t, e.restarts(), 0, "a machine restarts k3s only in its turn")
	return m
}

// TestRestartK3sOnlyInTheTurn: a leader or a worker does not restart k3s
// for a RestartK3s change until cluster-operator grants it a turn (no
// approval needed, even when Manual); it then restarts k3s once, without
// cordon, drain or reboot, and holds the turn until its Node is Ready with
// a heartbeat later than the restart: the Ready from before does not end
// it. Then the change is in effect.
func TestRestartK3sOnlyInTheTurn(t *testing.T) {
	for _, tc := range classCases {
		if tc.class != likenv1.ClassRestartK3s {
			continue
		}
		for _, role := range []likenv1.MachineRole{likenv1.RoleWorker, likenv1.RoleLeader} {
			t.Run(string(role)+"/"+tc.field, func(t *testing.T) {
				e, opts := newLeader(t, daemon.Options{})
				e.editMachine(func(m *likenv1.Machine) { m.Spec.Role = role })
				e.addPod("web", false)
				r := e.m.Start(t, opts())
				e.waitPhase(likenv1.MachineReady)
				e.change(tc)
				m := e.waitFor("the machine asks for a turn", func(m *likenv1.Machine) bool {
					return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
				})
				assert.Equal(t, m.Status.Pending[0].Field, tc.field)
				assert.Equal(t, m.Status.Pending[0].Class, likenv1.ClassRestartK3s)
				assert.Equal(t, cond(m, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingTurn, "no approval for a k3s restart")
				assert.Equal(t, e.restarts(), 0)

				change := e.grantInPlace(likenv1.TurnRestartK3s)
				rec := e.recorded(changes.OpRestartK3s, tc.field)
				assert.DeepEqual(t, rec.Fields, []string{tc.field})
				// The Node's Ready from before the restart does not end the turn.
				m = e.waitFor("holding the turn until the node is Ready again", func(m *likenv1.Machine) bool {
					return m.Status.Phase == likenv1.MachineRebooting &&
						strings.Contains(cond(m, likenv1.ConditionReady).Message, "is from before the restart of k3s")
				})
				assert.Equal(t, m.Status.Change, change, "the change is reported while the turn is held")
				e.waitEvent(daemon.ReasonK3sRestarted, change)

				e.kubeletBack()
				m = e.waitFor("Ready once the node is back", func(m *likenv1.Machine) bool {
					return m.Status.Phase == likenv1.MachineReady
				})
				assert.Equal(t, m.Status.Change, "")
				assert.Assert(t, is.Len(m.Status.Pending, 0))
				e.waitEvent(daemon.ReasonK3sBack, change)
				assert.Equal(t, e.restarts(), 1)
				assert.Equal(t, e.m.Boots(), 1, "no reboot")
				assert.Assert(t, is.Len(e.evictions(), 0), "no drain")
				assert.Assert(t, !e.node().Spec.Unschedulable, "no cordon")
				exited, _ := r.Exited()
				assert.Assert(t, !exited)
			})
		}
	}
}

// TestLeaderK3sChangeWaitsBehindAReboot: a leader with a Reboot change
// and a RestartK3s change asks for the reboot turn first (the k3s change
// is listed, and asks for its own turn after the reboot).
func TestLeaderK3sChangeWaitsBehindAReboot(t *testing.T) {
	e, opts := newLeader(t, daemon.Options{})
	e.editMachine(func(m *likenv1.Machine) { m.Spec.RebootPolicy = likenv1.RebootAuto })
	r := e.m.Start(t, opts())
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) {
		c.Spec.Settings.K3sArgs = newArgs
		c.Spec.Settings.KernelArgs = []string{"quiet"}
	})
	m := e.waitFor("both listed", func(m *likenv1.Machine) bool { return len(m.Status.Pending) == 2 })
	assert.Equal(t, m.Status.Phase, likenv1.MachineRebootPending)
	e.grant()
	waitExit(t, r)
	assert.Equal(t, e.restarts(), 0)

	r = e.m.Start(t, opts())
	e.waitingForTurn()
	e.revoke() // cluster-operator ends the reboot turn
	e.grantInPlace(likenv1.TurnRestartK3s)
	e.recorded(changes.OpRestartK3s, changes.FieldK3sArgs)
	e.kubeletBack()
	e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, e.m.Boots(), 2)
}

// TestK3sTurnSurvivesRestartsAndPowerCuts cuts the leader's turn at each
// write: the daemon restarts (same boot) or the power fails (new boot)
// between the grant, the restart of k3s and the report. The change is
// never lost, k3s restarts with it, and the turn ends. A new boot starts
// k3s with the configuration in effect before the turn: the new one was
// on trial.
func TestK3sTurnSurvivesRestartsAndPowerCuts(t *testing.T) {
	cases := []struct {
		name string
		// during stops the daemon while k3s restarts; otherwise it stops
		// once the restart is reported.
		during bool
		// powerCut makes the next start a new boot.
		powerCut bool
		// restarts is how many restarts of k3s with the change are
		// recorded in the end.
		restarts int
	}{
		{name: "daemon stopped during the restart restarts k3s again", during: true, restarts: 1},
		{name: "daemon stopped after the restart waits for the node, no second restart", restarts: 1},
		{name: "power cut during the restart: the boot runs the old arguments and the turn is taken again", during: true, powerCut: true, restarts: 1},
		{name: "power cut after the restart: the boot runs the old arguments and the turn is taken again", powerCut: true, restarts: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := &k3sApplier{}
			e, opts := newLeader(t, daemon.Options{Applier: a})
			a.Recorder = e.m.Recorder
			r := e.m.Start(t, opts())
			e.waitPhase(likenv1.MachineReady)
			e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = newArgs })
			change := e.waitingForTurn().Status.Change
			if tc.during {
				hang := make(chan struct{})
				a.set(nil, hang)
				e.grantInPlace(likenv1.TurnRestartK3s)
				<-hang
				assert.NilError(t, r.Stop())
				a.set(nil, nil)
			} else {
				e.grantInPlace(likenv1.TurnRestartK3s)
				e.waitEvent(daemon.ReasonK3sRestarted, "")
				assert.NilError(t, r.Stop())
			}
			if tc.powerCut {
				r = e.m.Start(t, opts())
				e.waitFor("the new boot reported", func(m *likenv1.Machine) bool { return m.Status.Observed.BootID == r.Boot.BootID })
				var boots []changes.Record
				for _, rec := range e.m.Recorder.Records() {
					if rec.Op == changes.OpBoot {
						boots = append(boots, rec)
					}
				}
				assert.Equal(t, len(boots), 2)
				assert.Assert(t, is.Len(boots[1].Config.Settings.K3sArgs, 0), "the boot starts k3s with the arguments in effect before the turn")
			} else {
				r = e.m.StartIn(t, opts(), r.Boot)
			}
			m := e.waitFor("the turn held again and k3s restarted", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineRebooting && e.restarts() == tc.restarts
			})
			assert.Equal(t, m.Status.Change, change)
			e.kubeletBack()
			m = e.waitFor("Ready with the change applied", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
			})
			assert.Equal(t, m.Status.Change, "")
			assert.Assert(t, is.Len(m.Status.Pending, 0))
			assert.Equal(t, e.restarts(), tc.restarts)
		})
	}
}

// TestK3sRestartFailsInTheTurn: a restart that fails keeps the turn (the
// leader's k3s may be down: no other leader may go) and reads Degraded; it
// is retried; if the turn leaves the ledger before a restart succeeded,
// the leader asks for another turn even when the declared value went
// back to what Applied holds, since what k3s runs is not known.
func TestK3sRestartFailsInTheTurn(t *testing.T) {
	a := &k3sApplier{}
	e, opts := newLeader(t, daemon.Options{Applier: a})
	a.Recorder = e.m.Recorder
	e.m.Start(t, opts())
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = newArgs })
	e.waitingForTurn()
	a.set(errors.New("k3s.service failed to start"), nil)
	change := e.grantInPlace(likenv1.TurnRestartK3s)
	m := e.waitFor("Degraded, holding the turn", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineDegraded && strings.Contains(cond(m, likenv1.ConditionReady).Message, "k3s.service failed to start")
	})
	assert.Equal(t, m.Status.Change, change, "the turn is held: the operator must not give the next leader a turn")

	// A person puts the old value back and releases the turn.
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = nil })
	e.revoke()
	e.waitEvent(daemon.ReasonTurnTakenBack, change)
	a.set(nil, nil)
	m = e.waitFor("asking again to restart k3s", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != "" && m.Status.Change != change
	})
	assert.Equal(t, m.Status.Pending[0].Class, likenv1.ClassRestartK3s)
	e.grantInPlace(likenv1.TurnRestartK3s)
	rec := e.recorded(changes.OpRestartK3s, "")
	assert.Assert(t, is.Len(rec.Config.Settings.K3sArgs, 0), "k3s restarts with the declared arguments")
	e.kubeletBack()
	m = e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, m.Status.Change, "")
}

// TestAliveSaysWhenAReconcileIsStuck: a reconcile that does not return
// (here a k3s restart that hangs) makes Alive say liken-node is stuck once
// it ran longer than Timing.Stuck, so liken-node stops answering systemd's
// watchdog and is restarted; a reconcile that ended leaves it alive.
func TestAliveSaysWhenAReconcileIsStuck(t *testing.T) {
	a := &k3sApplier{}
	e, opts := newLeader(t, daemon.Options{Applier: a})
	a.Recorder = e.m.Recorder
	o := opts()
	o.Timing.Stuck = 300 * time.Millisecond
	r := e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	assert.NilError(t, r.Daemon.Alive())
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = newArgs })
	e.waitingForTurn()
	hang := make(chan struct{})
	a.set(nil, hang)
	e.grantInPlace(likenv1.TurnRestartK3s)
	<-hang
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := r.Daemon.Alive(); err != nil {
			assert.Check(t, is.Contains(err.Error(), "a reconcile has run for"))
			return poll.Success()
		}
		return poll.Continue("Alive says nothing while the restart of k3s hangs")
	}, poll.WithTimeout(10*time.Second))
	assert.NilError(t, r.Stop())
	assert.NilError(t, r.Daemon.Alive(), "the stuck reconcile ended with the daemon")
}

// TestFirstBootRestartsTheAgentForItsSettings: on a machine's first boot
// the node agent started before liken-node, with none of the Cluster's
// RestartK3s settings; the machine, worker or leader, asks for its turn
// and restarts it for them in the turn.
func TestFirstBootRestartsTheAgentForItsSettings(t *testing.T) {
	for _, role := range []likenv1.MachineRole{likenv1.RoleWorker, likenv1.RoleLeader} {
		t.Run(string(role), func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			e.editMachine(func(m *likenv1.Machine) { m.Spec.Role = role })
			e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = newArgs })
			e.m.Start(t, e.options())
			e.waitingForTurn()
			e.grantInPlace(likenv1.TurnRestartK3s)
			rec := e.recorded(changes.OpRestartK3s, changes.FieldK3sArgs)
			assert.DeepEqual(t, rec.Fields, []string{changes.FieldK3sArgs})
			e.kubeletBack()
			m := e.waitPhase(likenv1.MachineReady)
			assert.Assert(t, is.Len(m.Status.Pending, 0))
			assert.Equal(t, e.restarts(), 1)
		})
	}
}

// TestK3sRestartRolledBack: a restart of k3s whose Node is not Ready again
// within the Cluster's trial timeout (the default, 10 minutes, on the
// daemon's clock) is rolled back: k3s restarts with the configuration it
// ran before, the machine holds its turn until the Node is Ready on it,
// then reads Degraded (ConfigApplied=False, K3sRestartFailed) and asks for
// no turn for that value again until it changes or a person resumes the
// rollout.
func TestK3sRestartRolledBack(t *testing.T) {
	cases := []struct {
		name string
		fix  func(c *likenv1.Cluster)
		// same: the machine asks again for the same change.
		same bool
	}{
		{name: "a new value asks again", fix: func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = []string{"--max-pods=150"} }},
		{name: "a resume tries the same value again", fix: func(c *likenv1.Cluster) { c.Annotations[likenv1.AnnotationResumeRollout] = "try-again" }, same: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			e.editCluster(func(c *likenv1.Cluster) { c.Spec.Disruption.TrialTimeout = nil }) // the default
			o := e.options()
			clk := clocktesting.NewFakeClock(time.Now())
			o.Clock = clk
			e.m.Start(t, o)
			e.waitPhase(likenv1.MachineReady)
			e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = newArgs })
			e.waitingForTurn()
			change := e.grantInPlace(likenv1.TurnRestartK3s)
			e.recorded(changes.OpRestartK3s, changes.FieldK3sArgs)
			e.setNodeReady(false) // the kubelet refuses the new arguments
			e.waitFor("holding the turn while the node is not Ready", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineRebooting &&
					strings.Contains(cond(m, likenv1.ConditionReady).Message, "k3s restarts with the configuration it ran before at")
			})
			// The clock moves on in steps; k3s restarts again only once the
			// timeout is over.
			restartedAt := clk.Now()
			clk.Step(likenv1.DefaultTrialTimeout - 5*time.Second)
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if e.restarts() == 2 {
					return poll.Success()
				}
				clk.Step(250 * time.Millisecond)
				return poll.Continue("k3s restarted %d times", e.restarts())
			}, poll.WithTimeout(20*time.Second), poll.WithDelay(10*time.Millisecond))
			m := e.waitFor("rolled back, holding the turn until the node is Ready", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineDegraded
			})
			failedAt := cond(m, likenv1.ConditionConfigApplied).LastTransitionTime.Time
			assert.Assert(t, !failedAt.Before(restartedAt.Add(likenv1.DefaultTrialTimeout).Truncate(time.Second)),
				"rolled back at %s, before the timeout was over (restarted at %s)", failedAt, restartedAt)
			assert.Equal(t, m.Status.Change, change, "the turn is held until the node is back")
			var restarts []changes.Record
			for _, r := range e.m.Recorder.Records() {
				if r.Op == changes.OpRestartK3s {
					restarts = append(restarts, r)
				}
			}
			assert.DeepEqual(t, restarts[0].Config.Settings.K3sArgs, newArgs)
			assert.Assert(t, is.Len(restarts[1].Config.Settings.K3sArgs, 0), "k3s restarts with the arguments it ran before")
			applied := cond(m, likenv1.ConditionConfigApplied)
			assert.Equal(t, applied.Status, metav1.ConditionFalse)
			assert.Equal(t, applied.Reason, likenv1.ReasonK3sRestartFailed)
			assert.Check(t, is.Contains(applied.Message, "the restart of k3s for "+changes.FieldK3sArgs+" (change "+change+") did not bring the node back Ready within 10m0s"))
			e.waitEvent(likenv1.ReasonK3sRestartFailed, change)

			e.kubeletBackAt(clk.Now())
			m = e.waitFor("the turn over, Degraded, asking for nothing", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineDegraded && m.Status.Change == ""
			})
			e.waitEvent(daemon.ReasonK3sBack, "configuration k3s ran before")
			e.revoke() // cluster-operator ends the turn
			assert.Equal(t, cond(m, likenv1.ConditionRebootPending).Reason, "NotAsking")
			assert.Equal(t, m.Status.Pending[0].Field, changes.FieldK3sArgs, "the value is still not in effect")
			assert.Equal(t, e.restarts(), 2)

			e.editCluster(tc.fix)
			m = e.waitFor("asking for a turn again", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
			})
			assert.Equal(t, m.Status.Change == change, tc.same)
			assert.Equal(t, cond(m, likenv1.ConditionConfigApplied).Reason, daemon.ReasonWaitingForTurn)
		})
	}
}
