package daemon_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/daemon"
)

// fakeControlPlane is a leader's control-plane check whose answer the test
// sets.
type fakeControlPlane struct {
	mu     sync.Mutex
	err    error
	unsafe error // SafeToStop's answer
	asked  int   // SafeToStop's calls
}

func (f *fakeControlPlane) Check(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *fakeControlPlane) SafeToStop(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.unsafe
}

func (f *fakeControlPlane) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeControlPlane) setUnsafe(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unsafe = err
}

func (f *fakeControlPlane) safeAsked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

// errPeerDown is SafeToStop's answer while another leader's member is down.
var errPeerDown = errors.New("the leader at https://10.0.0.12:2379 does not answer (connection refused): with this leader down too, the datastore could lose its majority; it goes down once every other leader is back")

var errLearner = errors.New("this leader's etcd member is a learner: liken-control-plane-init promotes it once it has caught up")

// TestLeaderTrialWaitsForItsControlPlane: a leader's Node reads Ready
// from its trial boot (its kubelet reaches the API through the endpoint),
// but its own etcd member is still a learner: the trial does not commit,
// and the Machine says why, until its control plane is healthy.
func TestLeaderTrialWaitsForItsControlPlane(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	cp := &fakeControlPlane{}
	opts := func() daemon.Options {
		o := e.options()
		o.ControlPlane = cp
		return o
	}
	r := e.m.Start(t, opts())
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	cp.set(errLearner)
	r = e.m.Start(t, opts())
	assert.Assert(t, r.Boot.Trial)
	e.waitFor("the trial waiting for the leader's own control plane", func(m *likenv1.Machine) bool {
		for _, c := range m.Status.Conditions {
			if strings.Contains(c.Message, "trial boot of slot B: not committed yet, because "+errLearner.Error()) {
				return true
			}
		}
		return false
	})
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st.Proven, boot.SlotA, "the trial committed while the leader's control plane was not healthy")
	cpr := cond(e.machine(), likenv1.ConditionControlPlaneReady)
	assert.Equal(t, cpr.Status, metav1.ConditionFalse)
	assert.Equal(t, cpr.Reason, daemon.ReasonControlPlaneNotReady)
	assert.Assert(t, strings.HasPrefix(cpr.Message, errLearner.Error()+"; cluster-operator counts this leader as down"), cpr.Message)

	cp.set(nil)
	m := e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, m.Status.Version, v2)
	st, err = boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotB})
	e.waitEvent(daemon.ReasonTrialSucceeded, v2)
	e.waitFor("ControlPlaneReady", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionControlPlaneReady).Status == metav1.ConditionTrue
	})
}

// TestControlPlaneReadyFollowsTheLeader: a leader reports its own control
// plane in ControlPlaneReady, at rest too, and a machine that runs none
// reports no such condition.
func TestControlPlaneReadyFollowsTheLeader(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	r := e.start()
	m := e.waitPhase(likenv1.MachineReady)
	assert.Assert(t, meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionControlPlaneReady) == nil, "a machine without a control plane reports one")
	_ = r.Stop()

	// liken-node starts again in the same boot, as a leader.
	cp := &fakeControlPlane{}
	o := e.options()
	o.ControlPlane = cp
	e.m.StartIn(t, o, r.Boot)
	e.waitFor("ControlPlaneReady True", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionControlPlaneReady).Status == metav1.ConditionTrue
	})
	down := errors.New("this leader's etcd member does not answer: connection refused")
	cp.set(down)
	m = e.waitFor("ControlPlaneReady False", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionControlPlaneReady).Status == metav1.ConditionFalse
	})
	assert.Assert(t, strings.HasPrefix(cond(m, likenv1.ConditionControlPlaneReady).Message, down.Error()))
	assert.Equal(t, m.Status.Phase, likenv1.MachineReady, "the machine itself is fine: only its control plane is reported")
	cp.set(nil)
	e.waitFor("ControlPlaneReady True again", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionControlPlaneReady).Status == metav1.ConditionTrue
	})
}

// restartK3sCase is the change of class RestartK3s of classCases.
func restartK3sCase() classCase {
	for _, c := range classCases {
		if c.class == likenv1.ClassRestartK3s {
			return c
		}
	}
	panic("classCases has no RestartK3s change")
}

// TestLeaderK3sTurnWaitsForItsControlPlane: after a RestartK3s change the
// leader's Node is Ready again, but its API server is not: the turn is
// held (no second leader may go down) until it is.
func TestLeaderK3sTurnWaitsForItsControlPlane(t *testing.T) {
	tc := restartK3sCase()
	e, leaderOpts := newLeader(t, daemon.Options{})
	cp := &fakeControlPlane{}
	o := leaderOpts()
	o.ControlPlane = cp
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	e.change(tc)
	e.waitFor("the leader asks for a turn", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
	})
	notReady := errors.New("this leader's API server is not ready: https://127.0.0.1:6443/readyz answered 500 Internal Server Error: etcd failed: reason withheld")
	cp.set(notReady)
	change := e.grantInPlace(likenv1.TurnRestartK3s)
	e.waitEvent(daemon.ReasonK3sRestarted, change)
	e.kubeletBack()
	m := e.waitFor("holding the turn until the control plane is back", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebooting && strings.Contains(cond(m, likenv1.ConditionReady).Message, notReady.Error())
	})
	assert.Equal(t, m.Status.Change, change, "the turn ended with the leader's API server down")

	cp.set(nil)
	m = e.waitFor("Ready once the control plane is back", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady
	})
	assert.Equal(t, m.Status.Change, "")
	e.waitEvent(daemon.ReasonK3sBack, change)
}

// TestLeaderRebootWaitsForTheDatastore: a leader granted its turn drains,
// then asks the datastore itself whether it may go down. While another
// member is down it keeps its turn, does not arm its trial or reboot, and
// says why on the Machine and in an event; once the other member is back
// it reboots into its trial.
func TestLeaderRebootWaitsForTheDatastore(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	cp := &fakeControlPlane{}
	o := e.options()
	o.ControlPlane = cp
	r := e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, cp.safeAsked(), 0, "asked at rest")

	cp.setUnsafe(errPeerDown)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitPhase(likenv1.MachineUpdatePending)
	change := e.grant()
	m := e.waitFor("the reboot waiting for the datastore", func(m *likenv1.Machine) bool {
		return strings.Contains(cond(m, likenv1.ConditionReady).Message, "drained; the reboot into the new release waits, because "+errPeerDown.Error())
	})
	assert.Equal(t, m.Status.Phase, likenv1.MachineUpdating)
	assert.Equal(t, m.Status.Change, change, "the leader gave its turn back")
	e.waitEvent(daemon.ReasonWaitingForDatastore, "the reboot for change "+change+" waits: "+errPeerDown.Error())
	// It keeps asking, and stays up meanwhile.
	asked := cp.safeAsked()
	e.waitFor("asked again", func(*likenv1.Machine) bool { return cp.safeAsked() > asked+1 })
	exited, _ := r.Exited()
	assert.Assert(t, !exited, "the leader rebooted while the datastore would lose its majority")
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA}, "a trial armed while waiting")

	cp.setUnsafe(nil)
	waitExit(t, r)
	st, err = boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st.Trial, boot.SlotB, "rebooted without arming the trial")
}

// TestLeaderK3sRestartWaitsForTheDatastore: the restart of a leader's
// control plane in its RestartK3s turn waits, holding the turn, while the
// datastore would lose its majority without its member.
func TestLeaderK3sRestartWaitsForTheDatastore(t *testing.T) {
	tc := restartK3sCase()
	e, leaderOpts := newLeader(t, daemon.Options{})
	cp := &fakeControlPlane{}
	o := leaderOpts()
	o.ControlPlane = cp
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	cp.setUnsafe(errPeerDown)
	e.change(tc)
	e.waitFor("the leader asks for a turn", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
	})
	change := e.grantInPlace(likenv1.TurnRestartK3s)
	m := e.waitFor("the restart waiting for the datastore", func(m *likenv1.Machine) bool {
		return strings.Contains(cond(m, likenv1.ConditionReady).Message, "the restart of k3s in its turn waits, because "+errPeerDown.Error())
	})
	assert.Equal(t, m.Status.Change, change)
	e.waitEvent(daemon.ReasonWaitingForDatastore, "the restart of k3s for change "+change+" waits: "+errPeerDown.Error())
	assert.Equal(t, e.restarts(), 0, "k3s restarted while the datastore would lose its majority")

	cp.setUnsafe(nil)
	e.waitEvent(daemon.ReasonK3sRestarted, change)
	assert.Equal(t, e.restarts(), 1)
}
