package turns

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/clip"
)

// maxTurnBudgets is how many PodDisruptionBudgets a turn records (the
// first by name): the ones whose pods must be healthy again before the
// machine is settled. The schema holds no more.
const maxTurnBudgets = 32

// Settled is a machine that stopped settling in this decision.
type Settled struct {
	Machine string
	// After is how long after its return it settled.
	After time.Duration
	// Released: a person resumed the rollout while the machine was not
	// settled past the stall timeout; it was not waited for any more.
	Released bool
}

// returns tells whether a turn that ended with r brought its machine back
// into service: it then settles before its place goes to another machine.
func returns(r Result) bool {
	return r == ResultFinished || r == ResultTrialFailed || r == ResultK3sRestartFailed
}

// turnBudgets are the budgets (sorted, at most maxTurnBudgets) a turn's
// drain takes disruptions from.
func turnBudgets(drain Drain) []string {
	if len(drain.Needs) == 0 {
		return nil
	}
	out := make([]string, 0, len(drain.Needs))
	for b := range drain.Needs {
		out = append(out, b)
	}
	slices.Sort(out)
	if len(out) > maxTurnBudgets {
		out = out[:maxTurnBudgets]
	}
	return out
}

// settleStep adds the machines back from the turns that ended to the
// settling ones, and drops those that settled, are gone, or that a resume
// released. It returns the machines still settling and those that
// stopped.
func settleStep(in Input, settling []likenv1.SettlingMachine, ended []Ended, resumed bool) (kept []likenv1.SettlingMachine, done []Settled) {
	settleTime := in.Cluster.Spec.Disruption.SettleOrDefault()
	stallTimeout := in.Cluster.Spec.Disruption.StallTimeoutOrDefault()
	all := slices.Clone(settling)
	for _, e := range ended {
		if !returns(e.Result) || findMachine(in.Machines, e.Turn.Machine) == nil {
			continue
		}
		all = slices.DeleteFunc(all, func(s likenv1.SettlingMachine) bool { return s.Machine == e.Turn.Machine })
		all = append(all, likenv1.SettlingMachine{
			Machine:    e.Turn.Machine,
			Reason:     e.Turn.Reason,
			Leader:     e.Turn.Leader,
			Budgets:    e.Turn.Budgets,
			GrantedAt:  e.Turn.GrantedAt,
			ReturnedAt: metav1.NewTime(in.Now),
		})
	}
	for _, s := range all {
		if findMachine(in.Machines, s.Machine) == nil {
			continue // deleted: nothing to wait for
		}
		since := in.Now.Sub(s.ReturnedAt.Time)
		if len(in.Unsettled[s.Machine]) == 0 && since >= settleTime {
			if since > 0 {
				// A machine settled on its return never waited: its turn's
				// end says all.
				done = append(done, Settled{Machine: s.Machine, After: since})
			}
			continue
		}
		if resumed && since >= stallTimeout {
			done = append(done, Settled{Machine: s.Machine, After: since, Released: true})
			continue
		}
		kept = append(kept, s)
	}
	slices.SortFunc(kept, func(a, b likenv1.SettlingMachine) int { return strings.Compare(a.Machine, b.Machine) })
	return kept, done
}

// settleWaits says what machine s still waits for: what its workloads
// lack (unsettled), then the end of the settle time. It names a time, not
// a time left, so that the message, and the condition that carries it,
// stays the same from one decision to the next.
func settleWaits(s likenv1.SettlingMachine, unsettled []string, now time.Time, settleTime time.Duration) string {
	waits := slices.Clone(unsettled)
	if end := s.ReturnedAt.Add(settleTime); end.After(now) {
		waits = append(waits, fmt.Sprintf("spec.disruption.settle (%s) to pass at %s", settleTime, ceilSecond(end).UTC().Format(time.RFC3339)))
	}
	if len(waits) > maxListed {
		waits = append(waits[:maxListed], fmt.Sprintf("and %d more", len(waits)-maxListed))
	}
	return clip.To(strings.Join(waits, "; "), maxMachineMessage)
}

// settlingMessage names the machines that settle and what each waits for.
func settlingMessage(settling []likenv1.SettlingMachine, in Input, settleTime time.Duration) string {
	var b strings.Builder
	b.WriteString(" Settling after their turn (each keeps its place under maxUnavailable until its workloads are healthy again):")
	for i, s := range settling {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more machines.", len(settling)-maxListed)
			break
		}
		fmt.Fprintf(&b, " %s waits for %s.", s.Machine, settleWaits(s, in.Unsettled[s.Machine], in.Now, settleTime))
	}
	return b.String()
}

// stall is a machine that stops every grant: it held its turn, or has not
// settled since it came back, for longer than the stall timeout.
type stall struct {
	machine string
	message string
}

// findStall is the oldest turn held past the stall timeout, or else the
// machine settling for longest past it; nil when none is.
func findStall(in Input, turns []likenv1.RebootTurn, settling []likenv1.SettlingMachine) *stall {
	c := in.Cluster
	stallTimeout := c.Spec.Disruption.StallTimeoutOrDefault()
	if t := oldestStalled(turns, in.Now, stallTimeout); t != nil {
		return &stall{machine: t.Machine, message: stallMessage(c.Name, t, findMachine(in.Machines, t.Machine), stallTimeout)}
	}
	var out *likenv1.SettlingMachine
	for i := range settling {
		s := &settling[i]
		if in.Now.Sub(s.ReturnedAt.Time) < stallTimeout {
			continue
		}
		if out == nil || s.ReturnedAt.Before(&out.ReturnedAt) {
			out = s
		}
	}
	if out == nil {
		return nil
	}
	return &stall{machine: out.Machine, message: fmt.Sprintf(
		"Machine %s came back from its %s turn at %s but its workloads have not settled within the stall timeout (%s): it waits for %s. "+
			"No machine gets a turn until a person examines it: granting resumes by itself when it settles or its Machine is deleted; "+
			"to stop waiting for it and resume now, run `liken rollout resume %s` (or set annotation %s on the Cluster to a new value).",
		out.Machine, out.Reason, out.ReturnedAt.UTC().Format(time.RFC3339), stallTimeout,
		settleWaits(*out, in.Unsettled[out.Machine], in.Now, c.Spec.Disruption.SettleOrDefault()),
		c.Name, likenv1.AnnotationResumeRollout)}
}
