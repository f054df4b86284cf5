package turns

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/promgate"
	"liken.sh/liken/internal/clip"
	"liken.sh/liken/internal/rules"
	"liken.sh/liken/internal/window"
)

// Node is what the turn decision needs to know of a machine's Node.
type Node struct {
	// State is Ready, NotReady or Missing.
	State fleet.NodeState
	// CordonedByLiken: the Node is cordoned and carries the annotation
	// liken.sh/cordoned, so liken cordoned it for a turn and the machine
	// uncordons it before the turn ends. A cordon a person set is not
	// liken's: the machine leaves it in place and it does not hold a turn.
	CordonedByLiken bool
	// Heartbeat is the lastHeartbeatTime of the Node's Ready condition:
	// when the kubelet last posted it. After a reboot Kubernetes keeps a
	// silent Node Ready for a while; only a heartbeat after a turn's grant
	// shows the kubelet back.
	Heartbeat time.Time
	// BootID is the Node's status.nodeInfo.bootID, the boot its kubelet
	// last reported; empty when the kubelet reports none (simulated
	// Nodes).
	BootID string
}

// Input is everything one decision reads. Nothing in it is changed.
type Input struct {
	// Cluster as read, with the resourceVersion the write will carry.
	Cluster *likenv1.Cluster
	// Machines of the cluster, sorted by name (byte order); Decide sorts a
	// copy when they are not.
	Machines []*likenv1.Machine
	// Nodes by machine name; a machine without an entry has no Node.
	Nodes map[string]Node
	// Silent names the machines whose heartbeat stopped for the lost-after
	// duration but that may not read Lost yet: they count as Lost.
	Silent map[string]bool
	// Now on the operator's clock.
	Now time.Time
	// GrantFrom is the end of the startup grace: nothing is granted before.
	GrantFrom time.Time
	// Identity of this copy, for messages.
	Identity string
	// Drains are, by machine name, what the drain of each machine's node
	// would take from the PodDisruptionBudgets now; a machine without an
	// entry takes nothing from any budget.
	Drains map[string]Drain
	// DisruptionsAllowed is, by PodDisruptionBudget (namespace/name), its
	// status.disruptionsAllowed; a budget named in Drains but not here
	// allows none.
	DisruptionsAllowed map[string]int32
	// Unsettled are, by machine name, what the workloads of a machine that
	// holds a turn or settles after one still lack before it is settled,
	// each a phrase such as "PodDisruptionBudget shop/web to have all of
	// its pods healthy (2 of 3)"; no entry: nothing.
	Unsettled map[string][]string
	// Blocked are, by machine name, the pods on it a blockingPods gate
	// matches (the first such gate of spec.disruption.gates); computed for
	// the machines that may ask for a turn.
	Blocked map[string]Blocked
	// GateErr says why a gate cannot be read; nothing is granted then.
	GateErr error
	// Shut are the prometheus gates that hold every turn now.
	Shut []promgate.Closed
}

// Blocked is what keeps a machine from a turn under a blockingPods gate.
type Blocked struct {
	// Gate is the gate's index in spec.disruption.gates.
	Gate int
	// Pods are the pods (namespace/name, sorted) on the machine the gate
	// matches.
	Pods []string
}

// Drain is what the drain of a machine's node would take from the
// PodDisruptionBudgets now.
type Drain struct {
	// Needs are, by PodDisruptionBudget (namespace/name), the pods
	// (namespace/name, sorted) whose eviction takes one of its
	// disruptions (eviction.Evicts).
	Needs map[string][]string
}

// Skip is a machine that would have had a turn, but whose drain would be
// blocked by PodDisruptionBudgets now: the next machine in order takes
// the turn.
type Skip struct {
	Machine string
	Leader  bool
	// Budgets names the blocking budgets and their pods:
	// "PodDisruptionBudget shop/web (0 disruptions allowed) covering pods
	// shop/web-1".
	Budgets string
}

// Message says why the machine waits, and what to do.
func (s Skip) Message() string {
	return fmt.Sprintf("%s waits: its drain would be blocked by %s; the next machine in order takes the turn. "+
		"It gets its turn by itself once the budgets allow the evictions: let the workload run its pods elsewhere (more replicas), or relax the budget.",
		s.Machine, s.Budgets)
}

// Result says how a ledger entry ended.
type Result string

// Results of a turn.
const (
	// ResultFinished: the machine came back Ready from a new boot, and
	// its Node is Ready from that boot.
	ResultFinished Result = "Finished"
	// ResultTrialFailed: the machine came back from a new boot and reports
	// TrialFailed, or its Release turn ended on a new boot that does not
	// run the turn's release.
	ResultTrialFailed Result = "TrialFailed"
	// ResultTakenBack: the need vanished before the machine started, it
	// turned Degraded before it started, its approval was withdrawn, or
	// the machine was deleted.
	ResultTakenBack Result = "TakenBack"
	// ResultReleased: a person resumed a stalled rollout.
	ResultReleased Result = "Released"
	// ResultK3sRestartFailed: the machine's restart of k3s in its
	// RestartK3s turn did not bring its Node back Ready in time; it
	// restarted k3s with the configuration it ran before, and its Node is
	// Ready again.
	ResultK3sRestartFailed Result = "K3sRestartFailed"
)

// Ended is a ledger entry that this decision removes.
type Ended struct {
	Turn    likenv1.RebootTurn
	Result  Result
	Message string
	// Failed is, for a failed trial, the release that failed (the turn's
	// release, or spec.version for a turn granted before turns recorded
	// it).
	Failed string
	// Proved is, for a Release turn that finished, the release its trial
	// proved: the one the machine runs, which is the turn's.
	Proved string
}

// Decision is the new status and what changed, for events and metrics.
type Decision struct {
	// Status is the Cluster status to write (a copy; the input is intact).
	Status likenv1.ClusterStatus
	// Granted are the turns added to the ledger.
	Granted []likenv1.RebootTurn
	// Ended are the turns removed from the ledger.
	Ended []Ended
	// Halted is set when this decision halts the rollout (new halt or a
	// different machine).
	Halted *likenv1.RolloutHalt
	// Lifted is the halt this decision lifts, with LiftedBecause saying why.
	Lifted        *likenv1.RolloutHalt
	LiftedBecause string
	// Waiting are the machines that wait for a turn they may have
	// (approved when Manual), granted or not.
	Waiting []*likenv1.Machine
	// Skipped are the machines that would have had a turn but whose drain
	// would be blocked by PodDisruptionBudgets, in grant order.
	Skipped []Skip
	// Settled are the machines that stopped settling after their turn.
	Settled []Settled
	// Gated are the machines that would have had a turn but that a gate
	// passed over, in grant order.
	Gated []Gated
	// Shut are the prometheus gates that held every turn (the input's).
	Shut []promgate.Closed
	// CanaryPassed is the canary that passed in this decision.
	CanaryPassed *likenv1.CanaryStatus
	// RequeueAfter is when the decision must be taken again even if nothing
	// changes: the end of the startup grace or the next stall deadline.
	RequeueAfter time.Duration
}

// Decide computes the ledger, halt and Progressing condition from in: it
// ends turns, halts, then grants by the rules of docs/design/protocol.md.
func Decide(in Input) Decision {
	c := in.Cluster
	st := c.Status.DeepCopy()
	d := Decision{}
	if !slices.IsSortedFunc(in.Machines, byName) {
		in.Machines = slices.Clone(in.Machines)
		slices.SortFunc(in.Machines, byName)
	}
	stallTimeout := c.Spec.Disruption.StallTimeoutOrDefault()

	// A new value of liken.sh/resume-rollout is a request to resume.
	resumed := false
	if v := c.Annotations[likenv1.AnnotationResumeRollout]; v != "" && v != st.ObservedResume {
		st.ObservedResume = v
		resumed = true
	}
	resumedCanary := resumed && st.Halt != nil && st.Halt.Reason == likenv1.ReasonCanaryFailed

	// End the turns that are over.
	var failed, k3sFailed *Ended
	kept := st.RebootTurns[:0:0]
	for _, t := range st.RebootTurns {
		m := findMachine(in.Machines, t.Machine)
		if e, over := turnOver(t, m, in.Nodes[t.Machine], c.Spec.Version); over {
			d.Ended = append(d.Ended, e)
			if e.Result == ResultTrialFailed && failed == nil {
				failed = &d.Ended[len(d.Ended)-1]
			}
			if e.Result == ResultK3sRestartFailed && k3sFailed == nil {
				k3sFailed = &d.Ended[len(d.Ended)-1]
			}
			continue
		}
		if resumed && in.Now.Sub(t.GrantedAt.Time) >= stallTimeout {
			d.Ended = append(d.Ended, Ended{Turn: t, Result: ResultReleased, Message: fmt.Sprintf(
				"Released the turn machine %s held since %s: a person resumed the stalled rollout (annotation %s)",
				t.Machine, t.GrantedAt.UTC().Format(time.RFC3339), likenv1.AnnotationResumeRollout)})
			continue
		}
		kept = append(kept, t)
	}
	st.RebootTurns = kept
	st.Settling, d.Settled = settleStep(in, st.Settling, d.Ended, resumed)
	cn := canaryStep(in, st, d.Ended, resumedCanary)
	if cn.passed {
		d.CanaryPassed = st.Canary
	}

	// Lift halts whose cause is gone.
	lift := func(why string) {
		if st.Halt != nil {
			d.Lifted, d.LiftedBecause = st.Halt, why
			st.Halt = nil
		}
	}
	if resumed {
		lift(fmt.Sprintf("a person resumed the rollout (annotation %s=%s)", likenv1.AnnotationResumeRollout, st.ObservedResume))
	}
	if st.Halt != nil && (st.Halt.Reason == likenv1.ReasonTrialFailed || st.Halt.Reason == likenv1.ReasonCanaryFailed) && st.Halt.Version != c.Spec.Version {
		lift(fmt.Sprintf("spec.version changed from %s to %s", st.Halt.Version, c.Spec.Version))
	}
	if h := st.Halt; h != nil && h.Reason == likenv1.ReasonK3sRestartFailed {
		if m := findMachine(in.Machines, h.Machine); m == nil {
			lift(fmt.Sprintf("machine %s is gone", h.Machine))
		} else if !reportsK3sFailure(m) {
			lift(fmt.Sprintf("machine %s no longer reports a failed restart of k3s (the value changed)", h.Machine))
		}
	}
	// A failed trial halts the rollout of the release that failed. A
	// release that is no longer spec.version (the Cluster was retargeted
	// while the trial ran) cannot spread any more: the failure is reported,
	// and the rollout of the new target goes on.
	if failed != nil && failed.Failed == c.Spec.Version {
		st.Halt = &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonTrialFailed,
			Machine: failed.Turn.Machine,
			Version: failed.Failed,
			Message: failed.Message,
			Since:   metav1.NewTime(in.Now),
		}
		d.Halted = st.Halt
	}

	// A canary that turned unhealthy on the new release halts its rollout
	// as a failed trial does; neither replaces the other.
	if cn.failed != nil && (st.Halt == nil || st.Halt.Reason != likenv1.ReasonTrialFailed && st.Halt.Reason != likenv1.ReasonCanaryFailed) {
		st.Halt = cn.failed
		d.Halted = st.Halt
	}

	// A restart of k3s that failed halts the RestartK3s turns: the same
	// value would take the next machines' nodes down too. A failed trial's
	// halt, which holds the release back, stays in place.
	if k3sFailed != nil && (st.Halt == nil || st.Halt.Reason != likenv1.ReasonTrialFailed) {
		st.Halt = &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonK3sRestartFailed,
			Machine: k3sFailed.Turn.Machine,
			Version: c.Spec.Version,
			Message: k3sFailed.Message,
			Since:   metav1.NewTime(in.Now),
		}
		d.Halted = st.Halt
	}

	// A turn held, or a machine settling, longer than the stall timeout
	// stops every grant.
	stalled := findStall(in, st.RebootTurns, st.Settling)
	switch {
	case stalled != nil && (st.Halt == nil || st.Halt.Reason == likenv1.ReasonRolloutStalled && st.Halt.Machine != stalled.machine):
		st.Halt = &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonRolloutStalled,
			Machine: stalled.machine,
			Version: c.Spec.Version,
			Message: stalled.message,
			Since:   metav1.NewTime(in.Now),
		}
		d.Halted = st.Halt
	case stalled == nil && st.Halt != nil && st.Halt.Reason == likenv1.ReasonRolloutStalled:
		lift(fmt.Sprintf("machine %s no longer holds a stalled turn nor waits to settle", st.Halt.Machine))
	}

	// Grant.
	maxUnavailable, budgetErr := c.Spec.Disruption.MaxUnavailableFor(len(in.Machines))
	inLedger := func(name string) bool { return fleet.FindTurn(st.RebootTurns, name) != nil }
	inTrial := func(name string) bool {
		t := fleet.FindTurn(st.RebootTurns, name)
		return t != nil && t.Reason == likenv1.TurnRelease
	}
	unavailable := func(m *likenv1.Machine) bool {
		return rules.Unavailable(m, in.Silent[m.Name], in.Nodes[m.Name].forBudget())
	}
	// A machine back from its turn keeps its place until it settles.
	settling := func(name string) bool {
		return slices.ContainsFunc(st.Settling, func(s likenv1.SettlingMachine) bool { return s.Machine == name })
	}
	d.Waiting = waiting(in.Machines, func(name string) bool { return inLedger(name) || in.Silent[name] })
	schedule, windowErrs := window.Parse(c.Spec.Disruption.Windows)
	var blocked *metav1.Condition
	switch {
	case budgetErr != nil:
		blocked = &metav1.Condition{Reason: likenv1.ReasonPaused, Message: fmt.Sprintf(
			"No turn is granted: %v. Fix spec.disruption.maxUnavailable (a whole number or a percentage such as 20%%).", budgetErr)}
	case maxUnavailable == 0:
		blocked = &metav1.Condition{Reason: likenv1.ReasonPaused, Message: "No turn is granted: spec.disruption.maxUnavailable is 0. " +
			"Set it to 1 or more (or a percentage above 0%) to let machines reboot."}
	case len(windowErrs) > 0:
		blocked = &metav1.Condition{Reason: likenv1.ReasonInvalidWindow, Message: invalidWindowMessage(c.Name, windowErrs)}
	case in.GateErr != nil:
		blocked = &metav1.Condition{Reason: likenv1.ReasonInvalidGate, Message: fmt.Sprintf(
			"No turn is granted: cluster-operator cannot read a gate, and grants nothing rather than pass it: %s. Fix it (kubectl edit cluster %s); granting resumes by itself.",
			clip.To(in.GateErr.Error(), maxMachineMessage), c.Name)}
	case in.Now.Before(in.GrantFrom):
		blocked = &metav1.Condition{Reason: likenv1.ReasonStartupGrace, Message: fmt.Sprintf(
			"cluster-operator %s started leading; it grants no turn until %s, so that machines that went down before it started read Lost first. Granting resumes then by itself.",
			in.Identity, ceilSecond(in.GrantFrom).UTC().Format(time.RFC3339))}
	case stalled != nil:
		blocked = &metav1.Condition{Reason: likenv1.ReasonRolloutStalled, Message: stalled.message}
	}
	trialHalt := st.Halt != nil && (st.Halt.Reason == likenv1.ReasonTrialFailed || st.Halt.Reason == likenv1.ReasonCanaryFailed)
	k3sHalt := st.Halt != nil && st.Halt.Reason == likenv1.ReasonK3sRestartFailed
	held := c.Annotations[likenv1.AnnotationHold] != ""
	shut := len(in.Shut) > 0
	// Outside every maintenance window nothing is granted; the turns held
	// go on to their end.
	var win window.State
	if blocked == nil {
		win = schedule.At(in.Now)
	}
	if blocked == nil && !held && !shut && win.Open {
		free := maxUnavailable - len(st.RebootTurns)
		for _, m := range in.Machines {
			if !inLedger(m.Name) && (unavailable(m) || settling(m.Name)) {
				free--
			}
		}
		// The kubelet is never newer than the API server: an upgrade goes
		// leaders first, a downgrade workers first. A machine in a trial
		// (or holding its Release turn) is not on any release yet: its
		// trial may still fail.
		leadersBehind, workersAhead := false, false
		for _, m := range in.Machines {
			switch {
			case rules.IsLeader(m) && behind(m, c.Spec.Version, inTrial):
				leadersBehind = true
			case !rules.IsLeader(m) && ahead(m, c.Spec.Version, inTrial):
				workersAhead = true
			}
		}
		leaderDownOtherThan := func(name string) bool {
			for _, m := range in.Machines {
				if m.Name != name && rules.IsLeader(m) && (inLedger(m.Name) || unavailable(m) || settling(m.Name)) {
					return true
				}
			}
			return false
		}
		// Evictions the drains of the turns held still need, by budget.
		taken := map[string]int{}
		for _, t := range st.RebootTurns {
			if t.Reason.InPlace() {
				continue // no drain
			}
			for b, pods := range in.Drains[t.Machine].Needs {
				taken[b] += len(pods)
			}
		}
		for _, m := range d.Waiting {
			if settling(m.Name) {
				continue // its next turn comes once it settled
			}
			if b, ok := in.Blocked[m.Name]; ok {
				d.Gated = append(d.Gated, Gated{Machine: m.Name, Leader: rules.IsLeader(m), Blocked: b})
				continue
			}
			reason := reasonFor(m)
			// A Release turn is for spec.version only: a machine that still
			// reports an earlier target staged (spec.version just changed,
			// and it has not staged the new one yet) would reboot into the
			// wrong release, or be taken back as soon as it restages.
			if reason == likenv1.TurnRelease && (trialHalt || m.Status.Staged != c.Spec.Version) {
				continue
			}
			if reason == likenv1.TurnRestartK3s && k3sHalt {
				continue
			}
			if reason == likenv1.TurnRelease && cn.hold {
				continue // the canary first
			}
			if reason == likenv1.TurnRelease && rules.IsLeader(m) && workersAhead && c.Spec.Version < m.Status.Version {
				continue // a downgrade: the workers first
			}
			if reason == likenv1.TurnRelease && !rules.IsLeader(m) && leadersBehind && c.Spec.Version > m.Status.Version {
				continue // an upgrade: the leaders first
			}
			if rules.IsLeader(m) && leaderDownOtherThan(m.Name) {
				continue
			}
			drain := in.Drains[m.Name]
			if reason.InPlace() {
				drain = Drain{} // changed in place: no cordon, no drain
			}
			if blocks := drainBlocks(drain, in.DisruptionsAllowed, taken); len(blocks) > 0 {
				d.Skipped = append(d.Skipped, Skip{Machine: m.Name, Leader: rules.IsLeader(m), Budgets: drainNote(blocks)})
				continue
			}
			cost := 1
			if unavailable(m) {
				cost = 0 // already counted: the turn replaces its unavailability
			}
			if cost > free {
				continue
			}
			free -= cost
			for b, pods := range drain.Needs {
				taken[b] += len(pods)
			}
			t := likenv1.RebootTurn{
				Machine:   m.Name,
				Reason:    reason,
				Change:    m.Status.Change,
				Leader:    rules.IsLeader(m),
				BootID:    m.Status.Observed.BootID,
				GrantedAt: metav1.NewTime(in.Now),
			}
			if reason == likenv1.TurnRelease {
				t.Version = m.Status.Staged
				if c.Spec.Disruption.Canary != nil && st.Canary == nil {
					// The first Release turn of the rollout: its machine is
					// the canary, and the others wait for it.
					st.Canary = &likenv1.CanaryStatus{Machine: m.Name, Version: t.Version}
					cn = canary{hold: true, message: canaryTurnMessage(st.Canary, c.Spec.Disruption.Canary)}
				}
			}
			t.Budgets = turnBudgets(drain)
			st.RebootTurns = append(st.RebootTurns, t)
			d.Granted = append(d.Granted, t)
		}
	}
	st.Turns = fleet.TurnsString(st.RebootTurns)

	// Progressing says whether turns can be granted, and if not, why and
	// what to do.
	cond := metav1.Condition{Type: likenv1.ConditionProgressing, ObservedGeneration: c.Generation}
	switch {
	case blocked != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, blocked.Reason, blocked.Message
	case trialHalt:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, st.Halt.Reason, st.Halt.Message
	case k3sHalt:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, likenv1.ReasonK3sRestartFailed, st.Halt.Message
	case held:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, likenv1.ReasonHeld, heldMessage(c, st.RebootTurns)
	case shut:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, likenv1.ReasonGateClosed, shutMessage(in.Shut, st.RebootTurns)
		d.Shut = in.Shut
	case !win.Open && len(d.Waiting) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, likenv1.ReasonOutsideWindow
		cond.Message = outsideWindowMessage(win, st.RebootTurns, d.Waiting)
	case len(st.RebootTurns) > 0 || len(d.Waiting) > 0 || len(st.Settling) > 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonGranting
		if len(st.RebootTurns) == 0 && len(d.Skipped) > 0 {
			// Nothing moves, and a drain that would be blocked is why.
			cond.Status, cond.Reason = metav1.ConditionFalse, likenv1.ReasonDrainBlocked
		}
		if len(st.RebootTurns) == 0 && len(d.Skipped) == 0 && len(d.Gated) > 0 {
			// Nothing moves, and a gate is why.
			cond.Status, cond.Reason = metav1.ConditionFalse, likenv1.ReasonGateClosed
		}
		if cn.hold && slices.ContainsFunc(d.Waiting, func(m *likenv1.Machine) bool { return !inLedger(m.Name) && reasonFor(m) == likenv1.TurnRelease }) {
			// Machines wait for the canary.
			cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonCanary
		}
		if len(st.Settling) > 0 && slices.ContainsFunc(d.Waiting, func(m *likenv1.Machine) bool { return !inLedger(m.Name) }) {
			// Machines wait, and places that settling machines keep may
			// be why.
			cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonSettling
		}
		var down nameList
		for _, m := range in.Machines {
			if !inLedger(m.Name) && unavailable(m) {
				down.add(m.Name)
			}
		}
		cond.Message = grantingMessage(st.RebootTurns, down, d.Waiting, inLedger, maxUnavailable)
		cond.Message += orderMessage(in.Machines, d.Waiting, inLedger, inTrial, c.Spec.Version, d.Skipped)
		cond.Message += skippedMessage(d.Skipped)
		cond.Message += gatedMessage(d.Gated)
		if len(st.Settling) > 0 {
			cond.Message = strings.TrimPrefix(cond.Message+settlingMessage(st.Settling, in, c.Spec.Disruption.SettleOrDefault()), " ")
		}
		if cn.hold {
			cond.Message = strings.TrimPrefix(cond.Message+" "+cn.message, " ")
		}
		if !win.Always && len(d.Waiting) > 0 {
			cond.Message += openWindowMessage(win)
		}
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonIdle
		cond.Message = "No machine holds or waits for a reboot turn."
	}
	fleet.SetCondition(&st.Conditions, cond, in.Now)

	d.Status = *st
	d.RequeueAfter = nextDeadline(st.RebootTurns, st.Settling, in.Now, in.GrantFrom, stallTimeout, c.Spec.Disruption.SettleOrDefault())
	if w := cn.until.Sub(in.Now); w > 0 && (d.RequeueAfter == 0 || w < d.RequeueAfter) {
		d.RequeueAfter = w
	}
	if len(d.Waiting) > 0 {
		// Decide again when the window opens, to grant on time, or when
		// it closes, so that Progressing says the machines wait for the
		// next one.
		for _, at := range []time.Time{win.Opens, win.Closes} {
			if w := at.Sub(in.Now); w > 0 && (d.RequeueAfter == 0 || w < d.RequeueAfter) {
				d.RequeueAfter = w
			}
		}
	}
	return d
}

// invalidWindowMessage says which maintenance windows of cluster cannot be
// read, and what to do. It names at most maxListed problems, each clipped,
// so that the message always fits in a condition.
func invalidWindowMessage(cluster string, errs field.ErrorList) string {
	msgs := make([]string, 0, min(len(errs), maxListed)+1)
	for i, e := range errs {
		if i == maxListed {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(errs)-maxListed))
			break
		}
		msgs = append(msgs, clip.To(e.Error(), maxMachineMessage))
	}
	return fmt.Sprintf("No turn is granted: cluster-operator cannot tell when the maintenance windows are open, and grants nothing rather than guess. %s. "+
		"Fix spec.disruption.windows (kubectl edit cluster %s); granting resumes by itself once every window reads.",
		strings.Join(msgs, "; "), cluster)
}

// outsideWindowMessage says that no maintenance window is open, when the
// next one opens, and who waits for it.
func outsideWindowMessage(win window.State, turns []likenv1.RebootTurn, waiting []*likenv1.Machine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Turns wait for the maintenance window: the next opens %s (%s: %s).",
		window.Format(win.Opens, win.Window.Location), window.Path.Index(win.Window.Index), win.Window.Describe())
	var names nameList
	for _, m := range waiting {
		names.add(m.Name)
	}
	fmt.Fprintf(&b, " Waiting for a turn: %s.", names)
	if len(turns) > 0 {
		fmt.Fprintf(&b, " Turns granted before the window closed go on to their end: %s.", holders(turns))
	}
	b.WriteString(" Machines go on downloading and staging meanwhile. To let turns start now, add or widen a window in spec.disruption.windows.")
	return b.String()
}

// openWindowMessage says until when the maintenance windows open now stay
// open.
func openWindowMessage(win window.State) string {
	if win.Closes.IsZero() {
		return " A maintenance window is open for the next 7 days or more."
	}
	return fmt.Sprintf(" The maintenance window is open until %s; turns not granted by then wait for the next one.", window.Format(win.Closes, win.Window.Location))
}

// turnOver says whether the ledger entry t ends, and how. target is
// spec.version, the release a turn granted before turns recorded theirs
// was for.
func turnOver(t likenv1.RebootTurn, m *likenv1.Machine, node Node, target string) (Ended, bool) {
	if m == nil {
		return endDeleted(t, node)
	}
	switch t.Reason {
	case likenv1.TurnRestartK3s:
		return endRestartK3s(t, m, node)
	case likenv1.TurnLive:
		return endLive(t, m, node)
	}
	boot := m.Status.Observed.BootID
	if boot != "" && boot != t.BootID {
		return endAfterBoot(t, m, node, target)
	}
	return endBeforeStart(t, m, node)
}

// endDeleted says whether the turn t of a machine whose Machine was
// deleted ends. Deleting the Machine does not stop the machine: while its
// Node is down, or cordoned by liken for the turn and not yet back from a
// new boot, it may still be draining or rebooting, so the turn keeps its
// place in the budget until the Node is Ready or gone
// (docs/design/protocol.md#cluster-operator-ends-a-turn).
func endDeleted(t likenv1.RebootTurn, node Node) (Ended, bool) {
	switch {
	case node.State == fleet.NodeMissing:
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s: the Machine was deleted, and it has no Node", t.Machine)}, true
	case node.State != fleet.NodeReady:
		return Ended{}, false
	case node.CordonedByLiken && (node.BootID == "" || node.BootID == t.BootID):
		return Ended{}, false
	}
	return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
		"Took back the turn of machine %s: the Machine was deleted, and its Node is Ready", t.Machine)}, true
}

// endAfterBoot says whether the turn t of machine m, back from a new boot,
// ends, and how.
func endAfterBoot(t likenv1.RebootTurn, m *likenv1.Machine, node Node, target string) (Ended, bool) {
	release := t.Version
	if release == "" {
		release = target
	}
	failed := func(what string) (Ended, bool) {
		msg := fmt.Sprintf("The trial boot of release %s on machine %s failed (%s); it returned to its proven slot. ", release, m.Name, what)
		if release == target {
			msg += fmt.Sprintf("No machine gets a Release turn to %s until spec.version changes or a person resumes the rollout (liken rollout resume, or a new value of annotation %s on the Cluster).",
				release, likenv1.AnnotationResumeRollout)
		} else {
			msg += fmt.Sprintf("spec.version is now %s, so the rollout goes on without halting.", target)
		}
		return Ended{Turn: t, Result: ResultTrialFailed, Failed: release, Message: msg}, true
	}
	if tf := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionTrialFailed); tf != nil && tf.Status == metav1.ConditionTrue {
		return failed(clip.To(tf.Reason, maxMachineReason) + ": " + clip.To(tf.Message, maxMachineMessage))
	}
	var done string
	switch m.Status.Phase {
	case likenv1.MachineReady:
		done = "Ready on " + m.Status.Version + " from a new boot"
	case likenv1.MachineDownloading, likenv1.MachineUpdatePending, likenv1.MachineRebootPending:
		// Back from the reboot and already asking for something else (a
		// change that arrived during the turn): this turn is over, and the
		// new change asks for a turn of its own. The same change still
		// asking means the reboot came before the turn's own (a power
		// cut): the machine takes the turn again.
		if m.Status.Change == t.Change {
			return Ended{}, false
		}
		done = "back from a new boot on " + m.Status.Version + " and now has another change staged"
		if m.Status.Change == "" {
			done = "back from a new boot on " + m.Status.Version + " and downloading another release, nothing staged"
		}
	default:
		return Ended{}, false
	}
	// Whatever the machine reports, a Release turn is proven only by a
	// boot that runs its release; a turn that recorded none (granted by
	// an older cluster-operator) by one that runs spec.version, never by
	// whatever the machine runs.
	if t.Reason == likenv1.TurnRelease && m.Status.Version != release {
		what := fmt.Sprintf("it is back from a new boot on release %s, not on %s, and reports %s", m.Status.Version, release, m.Status.Phase)
		if t.Version == "" {
			what += "; the turn, granted by an older cluster-operator, recorded no release, so it is judged by spec.version"
		}
		return failed(what)
	}
	if node.CordonedByLiken || !nodeBack(t, node) {
		return Ended{}, false
	}
	e := Ended{Turn: t, Result: ResultFinished, Message: fmt.Sprintf("Machine %s finished its %s turn: %s", m.Name, t.Reason, done)}
	if t.Reason == likenv1.TurnRelease {
		e.Proved = release
	}
	return e, true
}

// nodeBack is true when the machine's Node shows its kubelet back from the
// turn's reboot: Ready alone may be the last boot's word
// (docs/design/protocol.md#cluster-operator-ends-a-turn).
func nodeBack(t likenv1.RebootTurn, node Node) bool {
	switch {
	case node.State == fleet.NodeMissing:
		return true
	case node.State != fleet.NodeReady:
		return false
	case node.BootID != "":
		return node.BootID != t.BootID && !node.Heartbeat.Before(t.GrantedAt.Time)
	}
	return node.Heartbeat.After(t.GrantedAt.Time)
}

// forBudget is what the disruption budget reads of the Node.
func (n Node) forBudget() rules.Node {
	return rules.Node{Joined: n.State != fleet.NodeMissing, Ready: n.State == fleet.NodeReady, BootID: n.BootID}
}

// endBeforeStart says whether the turn t of machine m, still in the boot
// it was granted in, ends, and how.
func endBeforeStart(t likenv1.RebootTurn, m *likenv1.Machine, node Node) (Ended, bool) {
	if node.CordonedByLiken {
		// It cordoned for the turn, so it started: its status may be
		// stale, or it gave the turn back and has not lifted its cordon
		// yet. The turn keeps its place until the machine acknowledges by
		// lifting it.
		return Ended{}, false
	}
	switch m.Status.Phase {
	case likenv1.MachineUpdating, likenv1.MachineRebooting, likenv1.MachineLost:
		return Ended{}, false // started (or cannot tell): the turn stays
	case likenv1.MachineDegraded:
		why := "see its conditions"
		if r := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionReady); r != nil && r.Message != "" {
			why = clip.To(r.Message, maxMachineMessage)
		}
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s before it started: it is Degraded (%s); it asks again once a person fixed it", m.Name, why)}, true
	}
	if m.Status.Change != t.Change {
		why := fmt.Sprintf("its staged change is now %q, not %q", m.Status.Change, t.Change)
		if m.Status.Change == "" {
			why = "it no longer has anything staged"
		}
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s before it started: %s", m.Name, why)}, true
	}
	if needsApproval(m) && !rules.Cleared(m, t.Change) {
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s before it started: its approval (annotation %s) no longer matches change %q",
			m.Name, likenv1.AnnotationApprovedChange, t.Change)}, true
	}
	return Ended{}, false
}

// unproven is true for a machine whose new release is not proven yet: it
// is Updating (in its trial boot, or on its way there), or holds a
// Release turn (inTrial). Its trial may still fail and bring it back to
// the release it ran before.
func unproven(m *likenv1.Machine, inTrial func(string) bool) bool {
	return m.Status.Phase == likenv1.MachineUpdating || inTrial(m.Name)
}

// behind is true for a machine that does not run version or a later
// release yet, or runs one unproven. Versions (YYYY.MM.DD-NNN) order as
// text.
func behind(m *likenv1.Machine, version string, inTrial func(string) bool) bool {
	return m.Status.Version < version || unproven(m, inTrial)
}

// ahead is true for a machine that runs a release later than version, or
// runs one unproven.
func ahead(m *likenv1.Machine, version string, inTrial func(string) bool) bool {
	return m.Status.Version > version || unproven(m, inTrial)
}

// Machine-written text that a decision copies into the Cluster's status
// and events is clipped to these many bytes: a condition message holds at
// most 32768 bytes and an event's note 1024, and one machine's long
// message must not make every ledger write fail.
const (
	maxMachineReason  = 128
	maxMachineMessage = 512
)

// waiting are the machines that ask for a turn they may have, leaders
// first, then workers, each in the order of machines (by name: the grant
// order). skip leaves out the machines that hold a turn already, and the
// silent ones: what they show is their last word, and they could not act
// on a turn.
func waiting(machines []*likenv1.Machine, skip func(string) bool) []*likenv1.Machine {
	var out []*likenv1.Machine
	for _, m := range machines {
		if skip(m.Name) || m.Status.Change == "" {
			continue
		}
		if m.Status.Phase != likenv1.MachineUpdatePending && m.Status.Phase != likenv1.MachineRebootPending {
			continue
		}
		if needsApproval(m) && !rules.Cleared(m, m.Status.Change) {
			continue
		}
		out = append(out, m)
	}
	return rules.GrantOrder(out)
}

// byName orders machines by name (byte order).
func byName(a, b *likenv1.Machine) int { return strings.Compare(a.Name, b.Name) }

// findMachine is the machine named name in machines sorted by name, or
// nil.
func findMachine(machines []*likenv1.Machine, name string) *likenv1.Machine {
	if i, ok := slices.BinarySearchFunc(machines, name, func(m *likenv1.Machine, n string) int {
		return strings.Compare(m.Name, n)
	}); ok {
		return machines[i]
	}
	return nil
}

// reasonFor is the turn machine m asks for, in the node daemon's order:
// Live when it waits (RebootPending) with a change of class Live pending,
// whatever else waits; Release when a release is staged; Reboot when any
// pending change is of class Reboot; else RestartK3s.
func reasonFor(m *likenv1.Machine) likenv1.TurnReason {
	has := func(class likenv1.DisruptionClass) bool {
		return slices.ContainsFunc(m.Status.Pending, func(p likenv1.PendingChange) bool { return p.Class == class })
	}
	switch {
	case m.Status.Phase == likenv1.MachineRebootPending && has(likenv1.ClassLive):
		return likenv1.TurnLive
	case m.Status.Phase == likenv1.MachineUpdatePending:
		return likenv1.TurnRelease
	case len(m.Status.Pending) > 0 && !slices.ContainsFunc(m.Status.Pending, func(p likenv1.PendingChange) bool { return p.Class != likenv1.ClassRestartK3s }):
		return likenv1.TurnRestartK3s
	}
	return likenv1.TurnReboot
}

// needsApproval is true when machine m waits for liken approve-reboot
// before its turn: rebootPolicy Manual governs reboots, and a Live or
// RestartK3s turn reboots nothing.
func needsApproval(m *likenv1.Machine) bool {
	return rules.IsManual(m) && !reasonFor(m).InPlace()
}

// endRestartK3s says whether the RestartK3s turn t of machine m ends, and
// how: only once its Node is Ready again after the grant, so the next
// leader never goes down while this one's datastore member is not back
// (docs/design/protocol.md#cluster-operator-ends-a-turn).
func endRestartK3s(t likenv1.RebootTurn, m *likenv1.Machine, node Node) (Ended, bool) {
	holding := m.Status.Change == t.Change
	switch m.Status.Phase {
	case likenv1.MachineRebooting, likenv1.MachineUpdating, likenv1.MachineLost:
		return Ended{}, false
	case likenv1.MachineDegraded:
		if holding {
			return Ended{}, false // its restart failed: k3s may be down
		}
		if !reportsK3sFailure(m) {
			return endBeforeStart(t, m, node)
		}
		// Rolled back: the machine restarted k3s with what it ran before
		// and reported the failure once its Node was Ready on it.
		if node.State == fleet.NodeNotReady {
			return Ended{}, false
		}
		why := "see its ConfigApplied condition"
		if f := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied); f != nil && f.Message != "" {
			why = clip.To(f.Message, maxMachineMessage)
		}
		return Ended{Turn: t, Result: ResultK3sRestartFailed, Message: fmt.Sprintf(
			"Machine %s's restart of k3s failed: %s. No other machine restarts k3s until the value changes or a person resumes the rollout (liken rollout resume %s)", m.Name, why, m.Spec.Cluster)}, true
	}
	if holding {
		// Not started yet, or back from a power cut before its restart:
		// the machine takes the turn.
		return Ended{}, false
	}
	// Done by the machine's word: its Node must show k3s back. A Ready
	// from before the grant (Kubernetes keeps a silent Node Ready for
	// about 40 s) or from an earlier boot proves nothing.
	switch {
	case node.State == fleet.NodeNotReady:
		return Ended{}, false
	case node.State == fleet.NodeMissing:
	case node.BootID != "" && m.Status.Observed.BootID != "" && node.BootID != m.Status.Observed.BootID:
		return Ended{}, false
	case !node.Heartbeat.After(t.GrantedAt.Time):
		return Ended{}, false
	}
	return Ended{Turn: t, Result: ResultFinished, Message: fmt.Sprintf(
		"Machine %s finished its RestartK3s turn: k3s restarted in place and the node is Ready again (%s)", m.Name, m.Status.Phase)}, true
}

// endLive says whether the Live turn t of machine m ends: once the
// machine reports the change applied (it no longer asks for it, lists no
// Live change, and its ConfigApplied condition is not False) and its Node
// is not NotReady; taken back when it asks for other values. A
// machine whose apply failed keeps its turn, so the value goes no
// further than the machines that hold turns; the stall timeout then
// halts the rollout and names it.
func endLive(t likenv1.RebootTurn, m *likenv1.Machine, node Node) (Ended, bool) {
	switch m.Status.Phase {
	case likenv1.MachineRebooting, likenv1.MachineUpdating, likenv1.MachineLost:
		return Ended{}, false
	}
	if m.Status.Change == t.Change {
		return Ended{}, false // not applied yet
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied); c != nil && c.Status == metav1.ConditionFalse {
		return Ended{}, false // its apply failed: retried in this turn
	}
	if node.State == fleet.NodeNotReady {
		return Ended{}, false
	}
	if slices.ContainsFunc(m.Status.Pending, func(p likenv1.PendingChange) bool { return p.Class == likenv1.ClassLive }) {
		why := "it asks for no turn now"
		if m.Status.Change != "" {
			why = fmt.Sprintf("it asks for change %s now", m.Status.Change)
		}
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the Live turn of machine %s before it applied the changes: the values it was for are no longer declared, or it is %s; %s", m.Name, m.Status.Phase, why)}, true
	}
	return Ended{Turn: t, Result: ResultFinished, Message: fmt.Sprintf(
		"Machine %s finished its Live turn: the changes are applied in place and the node is Ready (%s)", m.Name, m.Status.Phase)}, true
}

// reportsK3sFailure is true when machine m reports a restart of k3s that
// did not bring its Node back and was rolled back.
func reportsK3sFailure(m *likenv1.Machine) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == likenv1.ReasonK3sRestartFailed
}

// oldestStalled is the turn held longest past the stall timeout (by
// grant time, then name), or nil.
func oldestStalled(turns []likenv1.RebootTurn, now time.Time, timeout time.Duration) *likenv1.RebootTurn {
	var out *likenv1.RebootTurn
	for i := range turns {
		t := &turns[i]
		if now.Sub(t.GrantedAt.Time) < timeout {
			continue
		}
		if out == nil || t.GrantedAt.Before(&out.GrantedAt) || t.GrantedAt.Equal(&out.GrantedAt) && t.Machine < out.Machine {
			out = t
		}
	}
	return out
}

// stallMessage says that machine m (nil: deleted) held its turn t past
// the stall timeout; a machine that reports a change it could not apply
// is named with its error, which is what to fix.
func stallMessage(cluster string, t *likenv1.RebootTurn, m *likenv1.Machine, timeout time.Duration) string {
	what := "has not come back"
	if m != nil {
		if c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied); c != nil && c.Status == metav1.ConditionFalse {
			what = fmt.Sprintf("could not apply its change: %s. Correct the value in the Cluster or Machine", clip.To(c.Message, maxMachineMessage))
		}
		if !t.Reason.InPlace() && slices.ContainsFunc(m.Status.Pending, func(p likenv1.PendingChange) bool { return p.Field == likenv1.PendingKernelArgs }) {
			what += ". Its reboot passes new kernel arguments (settings.kernelArgs): if it does not start with them, correct settings.kernelArgs, " +
				"then start the machine from a rescue medium and delete liken-args.cfg from its boot partition's grub folder (it then boots with none)"
		}
	}
	return fmt.Sprintf("Machine %s has held its %s turn since %s, longer than the stall timeout (%s), and %s. "+
		"No machine gets a turn until a person examines it: granting resumes by itself when it comes back or its Machine is deleted; "+
		"to release its turn and resume now, run `liken rollout resume %s` (or set annotation %s on the Cluster to a new value).",
		t.Machine, t.Reason, t.GrantedAt.UTC().Format(time.RFC3339), timeout, what, cluster, likenv1.AnnotationResumeRollout)
}

// orderMessage names, for machines that wait for a Release turn only
// because of the order (leaders first in an upgrade, workers first in a
// downgrade), the machines of the other group not yet proven on version.
func orderMessage(machines, waiting []*likenv1.Machine, inLedger, inTrial func(string) bool, version string, skipped []Skip) string {
	upgrade, downgrade := false, false
	for _, m := range waiting {
		if inLedger(m.Name) || reasonFor(m) != likenv1.TurnRelease {
			continue
		}
		switch {
		case !rules.IsLeader(m) && version > m.Status.Version:
			upgrade = true
		case rules.IsLeader(m) && version < m.Status.Version:
			downgrade = true
		}
	}
	var b strings.Builder
	if upgrade {
		if l := blocking(machines, true, func(m *likenv1.Machine) bool { return behind(m, version, inTrial) }, inLedger, skipped); l.n > 0 {
			fmt.Fprintf(&b, " Workers update to %s after every leader runs it; leaders not on it yet: %s.", version, l)
		}
	}
	if downgrade {
		if l := blocking(machines, false, func(m *likenv1.Machine) bool { return ahead(m, version, inTrial) }, inLedger, skipped); l.n > 0 {
			fmt.Fprintf(&b, " Leaders go back to %s after every worker runs it (a downgrade goes workers first); workers not on it yet: %s.", version, l)
		}
	}
	return b.String()
}

// blocking lists the leaders (or the workers) for which pending is true,
// each with its phase and what it waits for: an approval, or budgets that
// would block its drain (skipped).
func blocking(machines []*likenv1.Machine, leaders bool, pending func(*likenv1.Machine) bool, inLedger func(string) bool, skipped []Skip) nameList {
	var out nameList
	for _, m := range machines {
		if rules.IsLeader(m) != leaders || !pending(m) {
			continue
		}
		note := string(m.Status.Phase)
		if note == "" {
			note = "no status yet"
		}
		if needsApproval(m) && m.Status.Change != "" && !rules.Cleared(m, m.Status.Change) && !inLedger(m.Name) {
			note += ", waits for `liken approve-reboot " + m.Spec.Cluster + " " + m.Name + "`"
		}
		if i := slices.IndexFunc(skipped, func(s Skip) bool { return s.Machine == m.Name }); i >= 0 {
			note += ", its drain would be blocked by " + skipped[i].Budgets
		}
		out.add(m.Name + " (" + note + ")")
	}
	return out
}

func grantingMessage(turns []likenv1.RebootTurn, down nameList, waiting []*likenv1.Machine, inLedger func(string) bool, maxUnavailable int) string {
	var b strings.Builder
	if len(turns) > 0 {
		fmt.Fprintf(&b, "Holding a turn: %s (maxUnavailable %d).", holders(turns), maxUnavailable)
	}
	if down.n > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "Down without a turn (Lost, silent, NotReady, or a leader whose control plane is not ready; they count against maxUnavailable %d): %s.", maxUnavailable, down)
	}
	var names nameList
	for _, m := range waiting {
		if !inLedger(m.Name) {
			names.add(m.Name)
		}
	}
	if names.n > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "Waiting for a turn: %s.", names)
	}
	return b.String()
}

// drainBlock is a PodDisruptionBudget that would block a drain: it allows
// allowed disruptions, the drains of the turns held take taken of them, and
// the drain would evict pods under it.
type drainBlock struct {
	budget  string
	allowed int32
	taken   int
	pods    []string
}

// drainBlocks are the budgets that would refuse the drain's first
// eviction under them, by name: those with no disruption allowed once
// those taken are counted. A drain evicts one pod at a time, and the
// budget allows the next once the last one runs again elsewhere, so a
// machine with more pods under a budget than it allows at once is not
// blocked (passing it over would keep it waiting for ever).
func drainBlocks(drain Drain, allowed map[string]int32, taken map[string]int) []drainBlock {
	var out []drainBlock
	for b, pods := range drain.Needs {
		if len(pods) > 0 && taken[b] >= int(allowed[b]) {
			out = append(out, drainBlock{budget: b, allowed: allowed[b], taken: taken[b], pods: pods})
		}
	}
	slices.SortFunc(out, func(a, b drainBlock) int { return strings.Compare(a.budget, b.budget) })
	return out
}

// skippedMessage says which machines were passed over because their drain
// would be blocked, and what to do; empty when none was.
func skippedMessage(skipped []Skip) string {
	return passedOverMessage(" Passed over, because PodDisruptionBudgets would block their drain now:", len(skipped),
		func(i int) string {
			return fmt.Sprintf(" %s waits: its drain would be blocked by %s.", skipped[i].Machine, clip.To(skipped[i].Budgets, maxMachineMessage))
		},
		" The next machine in order takes each such turn; a machine passed over gets its turn by itself once its budgets allow the evictions "+
			"(let the workload run its pods elsewhere, or relax the budget).",
		slices.ContainsFunc(skipped, func(s Skip) bool { return s.Leader }))
}

// passedOverMessage says which n machines were passed over: intro, a
// sentence for each (at most maxListed), then tail, and when a leader was
// passed over, that it holds the workers of an upgrade back. Empty when n
// is 0.
func passedOverMessage(intro string, n int, sentence func(i int) string, tail string, leader bool) string {
	if n == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(intro)
	for i := range n {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more machines.", n-maxListed)
			break
		}
		b.WriteString(sentence(i))
	}
	b.WriteString(tail)
	if leader {
		b.WriteString(" A leader passed over holds back the workers of an upgrade until it runs the new release.")
	}
	return b.String()
}

// maxListed is how many machine names a message lists before it only
// counts the rest: a condition message holds at most 32768 bytes, and a
// fleet of thousands of machines waiting for turns would not fit (the API
// server would refuse the ledger write, and nothing would be granted).
const maxListed = 10

// holders lists the machines that hold turns.
func holders(turns []likenv1.RebootTurn) nameList {
	var out nameList
	for _, t := range turns {
		out.add(t.Machine)
	}
	return out
}

// nameList keeps the first maxListed machine names it is given and counts
// them all.
type nameList struct {
	names []string
	n     int
}

func (l *nameList) add(name string) {
	if len(l.names) < maxListed {
		l.names = append(l.names, name)
	}
	l.n++
}

// String joins the names kept with commas, then says how many more there
// are.
func (l nameList) String() string {
	if l.n <= len(l.names) {
		return strings.Join(l.names, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(l.names, ","), l.n-len(l.names))
}

// nextDeadline is the delay until the startup grace ends, a turn reaches
// the stall timeout, or a machine's settle time or stall timeout after its
// return ends, whichever comes first; 0 when none is ahead.
func nextDeadline(turns []likenv1.RebootTurn, settling []likenv1.SettlingMachine, now, grantFrom time.Time, stallTimeout, settleTime time.Duration) time.Duration {
	var next time.Duration
	consider := func(at time.Time) {
		if d := at.Sub(now); d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	consider(grantFrom)
	for _, t := range turns {
		consider(t.GrantedAt.Add(stallTimeout))
	}
	for _, s := range settling {
		consider(s.ReturnedAt.Add(settleTime))
		consider(s.ReturnedAt.Add(stallTimeout))
	}
	return next
}

// ceilSecond rounds t up to a whole second, so a time printed without
// fractions is never earlier than t.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}
