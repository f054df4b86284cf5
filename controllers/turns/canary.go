package turns

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/internal/clip"
	"liken.sh/liken/internal/rules"
)

// canary is where the canary of the rollout of spec.version stands after
// this decision's endings.
type canary struct {
	// hold: no other machine gets a Release turn to spec.version yet.
	hold bool
	// failed is the halt a canary that turned unhealthy brings.
	failed *likenv1.RolloutHalt
	// passed: the canary passed in this decision.
	passed bool
	// message says what the rollout waits for while hold is set.
	message string
	// until is when the canary's time ends (zero while its turn lasts).
	until time.Time
}

// canaryStep brings st.Canary up to date with spec.disruption.canary, the
// turns that ended and what the canary machine shows now, and says whether
// it holds back the rollout. A halt the canary caused that a person lifted
// (resumedCanary) passes it: the person examined it and lets the rollout
// go on.
func canaryStep(in Input, st *likenv1.ClusterStatus, ended []Ended, resumedCanary bool) canary {
	c := in.Cluster
	spec := c.Spec.Disruption.Canary
	if spec == nil {
		st.Canary = nil
		return canary{}
	}
	v := c.Spec.Version
	cs := st.Canary
	if cs != nil && cs.Version != v {
		cs = nil // a new rollout gets a new canary
	}
	if cs == nil {
		// A Release turn to v granted before the canary was recorded (the
		// field was just set) makes its machine the canary: the first one.
		var first *likenv1.RebootTurn
		for i, t := range st.RebootTurns {
			if t.Reason == likenv1.TurnRelease && t.Version == v && (first == nil || t.GrantedAt.Before(&first.GrantedAt)) {
				first = &st.RebootTurns[i]
			}
		}
		if first != nil {
			cs = &likenv1.CanaryStatus{Machine: first.Machine, Version: v}
		}
	}
	st.Canary = cs
	if cs == nil || cs.PassedAt != nil {
		return canary{}
	}
	if resumedCanary {
		cs.PassedAt = ptrTime(in.Now)
		return canary{passed: true}
	}
	for _, e := range ended {
		if e.Turn.Machine != cs.Machine || e.Turn.Reason != likenv1.TurnRelease {
			continue
		}
		if e.Result == ResultFinished && e.Proved == v {
			cs.ReturnedAt = ptrTime(in.Now)
			continue
		}
		// Its trial failed (that halt holds the release back), or its turn
		// was taken back or released: the next Release turn picks a new
		// canary.
		st.Canary = nil
		return canary{}
	}
	m := findMachine(in.Machines, cs.Machine)
	if m == nil {
		st.Canary = nil // deleted: the next Release turn picks a new canary
		return canary{}
	}
	if cs.ReturnedAt == nil {
		if fleet.FindTurn(st.RebootTurns, cs.Machine) == nil {
			st.Canary = nil // its turn is gone without a return
			return canary{}
		}
		return canary{hold: true, message: canaryTurnMessage(cs, spec)}
	}
	if why := canaryUnhealthy(in, m, v); why != "" {
		return canary{hold: true, failed: &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonCanaryFailed,
			Machine: cs.Machine,
			Version: v,
			Message: fmt.Sprintf("The canary %s of release %s %s, %s after it came back on it. No machine gets a turn to %s until spec.version changes or a person resumes the rollout "+
				"(liken rollout resume %s, which lets the rollout go on without a new canary).",
				cs.Machine, v, why, in.Now.Sub(cs.ReturnedAt.Time).Round(time.Second), v, c.Name),
			Since: metav1.NewTime(in.Now),
		}}
	}
	until := cs.ReturnedAt.Add(spec.Duration.Duration)
	settled := !slices.ContainsFunc(st.Settling, func(s likenv1.SettlingMachine) bool { return s.Machine == cs.Machine })
	if !in.Now.Before(until) && settled {
		cs.PassedAt = ptrTime(in.Now)
		return canary{passed: true}
	}
	msg := fmt.Sprintf("The canary %s runs %s; no other machine gets a turn to it before %s (spec.disruption.canary %s), and only if the canary stays healthy",
		cs.Machine, v, ceilSecond(until).UTC().Format(time.RFC3339), spec.Duration.Duration)
	if !settled {
		msg += " and settles"
	}
	return canary{hold: true, message: msg + ".", until: until}
}

// canaryUnhealthy says how the canary m no longer runs v well; empty when
// it does.
func canaryUnhealthy(in Input, m *likenv1.Machine, v string) string {
	switch {
	case m.Status.Phase == likenv1.MachineLost || in.Silent[m.Name]:
		return "went silent (Lost)"
	case m.Status.Version != v:
		return fmt.Sprintf("no longer runs it (it runs %s)", m.Status.Version)
	case m.Status.Phase == likenv1.MachineDegraded:
		msg := ""
		if c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionReady); c != nil {
			msg = ": " + clip.To(c.Message, maxMachineMessage)
		}
		return "turned Degraded" + msg
	case rules.Unavailable(m, false, in.Nodes[m.Name].forBudget()):
		return "is not Ready (its Node, or a leader's control plane)"
	}
	return ""
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}

// canaryTurnMessage says that the canary cs takes its turn and the others
// wait for it.
func canaryTurnMessage(cs *likenv1.CanaryStatus, spec *likenv1.CanarySpec) string {
	return fmt.Sprintf("The canary %s takes its turn to %s; no other machine gets a turn to it until the canary is back and ran it for %s (spec.disruption.canary).",
		cs.Machine, cs.Version, spec.Duration.Duration)
}
