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
	mu  sync.Mutex
	err error
}

func (f *fakeControlPlane) Check(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *fakeControlPlane) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

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

// TestLeaderK3sTurnWaitsForItsControlPlane: after a RestartK3s change the
// leader's Node is Ready again, but its API server is not: the turn is
// held (no second leader may go down) until it is.
func TestLeaderK3sTurnWaitsForItsControlPlane(t *testing.T) {
	var tc classCase
	for _, c := range classCases {
		if c.class == likenv1.ClassRestartK3s {
			tc = c
		}
	}
	e, leaderOpts := newLeader(t, daemon.Options{})
	cp := &fakeControlPlane{}
	o := leaderOpts()
	o.ControlPlane = cp
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	e.change(tc)
	e.waitFor("the leader asks for a leader turn", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
	})
	notReady := errors.New("this leader's API server is not ready: https://127.0.0.1:6443/readyz answered 500 Internal Server Error: etcd failed: reason withheld")
	cp.set(notReady)
	change := e.grantK3s()
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
