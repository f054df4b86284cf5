package turns

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	tu "liken.sh/liken/controllers/internal/testutil"
)

// withCanary sets spec.disruption.canary to d.
func withCanary(d time.Duration) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) {
		c.Spec.Disruption.Canary = &likenv1.CanarySpec{Duration: metav1.Duration{Duration: d}}
	}
}

func TestCanary(t *testing.T) {
	grantedAt := after.Add(-5 * time.Minute)
	returned := after.Add(-10 * time.Minute)
	degraded := func(m *likenv1.Machine) {
		m.Status.Phase = likenv1.MachineDegraded
		m.Status.Conditions = []metav1.Condition{{Type: likenv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "SlotCorrupt", Message: "slot B does not match its release"}}
	}
	canaryOf := func(machine string, returnedAt *time.Time) *likenv1.CanaryStatus {
		cs := &likenv1.CanaryStatus{Machine: machine, Version: tu.Version2}
		if returnedAt != nil {
			cs.ReturnedAt = ptrTime(*returnedAt)
		}
		return cs
	}
	canaryIs := func(want *likenv1.CanaryStatus) check {
		return func(t *testing.T, d Decision) { assert.DeepEqual(t, d.Status.Canary, want) }
	}
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		nodes    map[string]Node
		checks   []check
	}{
		{
			name:     "the first Release turn of a rollout makes its machine the canary, alone even with room in the budget",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3"), withCanary(30*time.Minute)),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsReboot)},
			checks: []check{grants("a", "c"), canaryIs(canaryOf("a", nil)),
				says(likenv1.ReasonCanary, "The canary a takes its turn to "+tu.Version2+"; no other machine gets a turn to it until the canary is back and ran it for 30m0s")},
		},
		{
			name: "once back, the canary holds the others for its duration",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) {
				c.Status.Canary = canaryOf("a", nil)
				c.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, grantedAt)}
			}),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants(), canaryIs(canaryOf("a", &after)),
				says(likenv1.ReasonCanary, "The canary a runs "+tu.Version2+"; no other machine gets a turn to it before "+after.Add(30*time.Minute).UTC().Format(time.RFC3339)),
				func(t *testing.T, d Decision) { assert.Check(t, is.Equal(d.RequeueAfter, 30*time.Minute)) }},
		},
		{
			name:     "a canary healthy for its duration passes, and the others follow",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(10*time.Minute), func(c *likenv1.Cluster) { c.Status.Canary = canaryOf("a", &returned) }),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants("b"), func(t *testing.T, d Decision) {
				assert.Assert(t, d.CanaryPassed != nil && d.Status.Canary.PassedAt != nil)
				assert.Check(t, is.Equal(d.Status.Canary.PassedAt.Time, after))
			}},
		},
		{
			name:     "a canary that turns Degraded halts the rollout",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) { c.Status.Canary = canaryOf("a", &returned) }),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2), degraded), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants(), says(likenv1.ReasonCanaryFailed, "The canary a of release "+tu.Version2+" turned Degraded: slot B does not match its release, 10m0s after it came back on it", "liken rollout resume lab"),
				func(t *testing.T, d Decision) {
					assert.Assert(t, d.Halted != nil)
					assert.Check(t, is.Equal(d.Halted.Reason, likenv1.ReasonCanaryFailed))
					assert.Check(t, is.Equal(d.Halted.Version, tu.Version2))
				}},
		},
		{
			name:     "a canary whose Node is NotReady halts the rollout",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) { c.Status.Canary = canaryOf("a", &returned) }),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			nodes:    notReady("a"),
			checks:   []check{grants(), says(likenv1.ReasonCanaryFailed, "is not Ready")},
		},
		{
			name: "a resume after the canary failed lets the others follow without a new canary",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) {
				c.Status.Canary = canaryOf("a", &returned)
				c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonCanaryFailed, Machine: "a", Version: tu.Version2, Since: metav1.NewTime(returned)}
				c.Annotations[likenv1.AnnotationResumeRollout] = "now"
			}),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2), degraded), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants("b"), func(t *testing.T, d Decision) {
				assert.Check(t, d.Status.Halt == nil && d.Lifted != nil)
				assert.Check(t, d.Status.Canary.PassedAt != nil)
			}},
		},
		{
			name: "a new spec.version lifts the canary's halt and gets a new canary",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) {
				c.Status.Canary = &likenv1.CanaryStatus{Machine: "a", Version: "2026.11.10-001", ReturnedAt: ptrTime(returned)}
				c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonCanaryFailed, Machine: "a", Version: "2026.11.10-001", Since: metav1.NewTime(returned)}
			}),
			machines: []*likenv1.Machine{tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease)},
			checks:   []check{grants("b"), canaryIs(canaryOf("b", nil))},
		},
		{
			name: "a canary whose trial fails is replaced at the next rollout turn",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) {
				c.Status.Canary = canaryOf("a", nil)
				c.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, grantedAt)}
			}),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version1)), tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants(), canaryIs(nil), says(likenv1.ReasonTrialFailed)},
		},
		{
			name:     "other turns go on while the canary runs",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), withCanary(30*time.Minute), func(c *likenv1.Cluster) { c.Status.Canary = canaryOf("a", &returned) }),
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsReboot)},
			checks:   []check{grants("b")},
		},
		{
			name:     "without spec.disruption.canary there is none",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), func(c *likenv1.Cluster) { c.Status.Canary = canaryOf("a", &returned) }),
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants("a", "b"), canaryIs(nil)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(input(tc.cluster, tc.machines, tc.nodes))
			for _, check := range tc.checks {
				check(t, d)
			}
		})
	}
}
