package daemon_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// bootFails is the machine's applier with a Boot that fails while fail is
// set (a disk that does not mount, a port that does not come up).
type bootFails struct {
	*changes.Recorder
	fail  atomic.Bool
	boots atomic.Int32
}

func (b *bootFails) Boot(ctx context.Context, cfg changes.Config) error {
	b.boots.Add(1)
	if b.fail.Load() {
		return errors.New("mounting disk data on /var/lib/data: no such device")
	}
	return b.Recorder.Boot(ctx, cfg)
}

// TestBootApplyFailureKeepsTheMachineDegraded: what a boot must apply and
// could not stays visible (Degraded, ConfigApplied=False) across syncs
// until a retry succeeds; it is not wiped by the next reconcile.
func TestBootApplyFailureKeepsTheMachineDegraded(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	assert.NilError(t, r.Stop())

	// The next boot cannot apply its configuration.
	a := &bootFails{Recorder: e.m.Recorder}
	a.fail.Store(true)
	o := e.options()
	o.Applier = a
	e.m.Start(t, o)
	m := e.waitPhase(likenv1.MachineDegraded)
	c := cond(m, likenv1.ConditionConfigApplied)
	assert.Equal(t, c.Status, metav1.ConditionFalse)
	assert.Assert(t, is.Contains(c.Message, "no such device"))

	// Other syncs (a change of the Cluster) do not clear it while the
	// retries keep failing.
	e.editCluster(func(c *likenv1.Cluster) {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations["example.com/touched"] = "1"
	})
	tries := a.boots.Load()
	e.waitFor("a retry of the boot configuration", func(*likenv1.Machine) bool { return a.boots.Load() > tries })
	m = e.machine()
	assert.Equal(t, m.Status.Phase, likenv1.MachineDegraded, conds(m))
	assert.Equal(t, cond(m, likenv1.ConditionConfigApplied).Status, metav1.ConditionFalse)

	// Once the device is there, a retry applies it and the machine is Ready.
	a.fail.Store(false)
	m = e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, cond(m, likenv1.ConditionConfigApplied).Status, metav1.ConditionTrue, conds(m))
}
