package daemon

import (
	"testing"

	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// TestReport holds what a simulated machine reports (daemon.Report, which
// e2e's simulated fleet writes) against the daemon's own plan: the same
// phase, the same change identifier the daemon asks a turn for, and the
// same RebootPending reason.
func TestReport(t *testing.T) {
	cases := []struct {
		name    string
		sim     func(s *Simulated)
		phase   likenv1.MachinePhase
		pending string // RebootPending's reason
		// daemon is the daemon's own machine in the same state; nil: no
		// change to compare.
		daemon func(f *facts)
	}{
		{name: "at rest", sim: func(*Simulated) {}, phase: likenv1.MachineReady, pending: "NothingPending"},
		{name: "a release staged", sim: func(s *Simulated) { s.Cluster.Spec.Version, s.Staged = planV2.Version, planV2.Version },
			phase: likenv1.MachineUpdatePending, pending: likenv1.ReasonAwaitingTurn, daemon: staged},
		{name: "a release staged, in its turn", sim: func(s *Simulated) {
			s.Cluster.Spec.Version, s.Staged, s.InTurn = planV2.Version, planV2.Version, true
		}, phase: likenv1.MachineUpdating, pending: "TurnTaken", daemon: func(f *facts) { running(f) }},
		{name: "a reboot requested", sim: func(s *Simulated) { s.RebootRequest = "r1" },
			phase: likenv1.MachineRebootPending, pending: likenv1.ReasonAwaitingTurn,
			daemon: func(f *facts) { f.M.Annotations[likenv1.AnnotationRequestReboot] = "r1"; since(f) }},
		{name: "a reboot requested, in its turn", sim: func(s *Simulated) { s.RebootRequest, s.InTurn = "r1", true },
			phase: likenv1.MachineRebooting, pending: "TurnTaken"},
		{name: "a reboot requested under the Manual policy", sim: func(s *Simulated) {
			s.Machine.Spec.RebootPolicy, s.RebootRequest = likenv1.RebootManual, "r1"
		}, phase: likenv1.MachineRebootPending, pending: likenv1.ReasonAwaitingApproval},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := planFacts()
			s := Simulated{Machine: f.M.DeepCopy(), Cluster: f.C.DeepCopy(), Slot: "A", BootID: planBoot, Version: planV1.Version}
			tc.sim(&s)
			st := Report(s, planNow)
			assert.Equal(t, st.Phase, tc.phase)
			assert.Equal(t, cond(st, likenv1.ConditionRebootPending).Reason, tc.pending)
			assert.Equal(t, cond(st, likenv1.ConditionReady).Status == metav1.ConditionTrue, tc.phase == likenv1.MachineReady)
			assert.Equal(t, st.Change != "", tc.phase != likenv1.MachineReady, "change %q", st.Change)
			if tc.daemon != nil {
				settle(f, "")
				tc.daemon(f)
				p := settle(f, "")
				want := machineStatus(f, p.v)
				assert.Equal(t, st.Change, want.Change)
				assert.Equal(t, st.Phase, want.Phase)
			}
		})
	}
}
