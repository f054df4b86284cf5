package turns

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
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
}

// Result says how a ledger entry ended.
type Result string

// Results of a turn.
const (
	// ResultFinished: the machine came back Ready from a new boot.
	ResultFinished Result = "Finished"
	// ResultTrialFailed: the machine came back from a new boot and reports
	// TrialFailed.
	ResultTrialFailed Result = "TrialFailed"
	// ResultTakenBack: the need vanished before the machine started, its
	// approval was withdrawn, or the machine was deleted.
	ResultTakenBack Result = "TakenBack"
	// ResultReleased: a person resumed a stalled rollout.
	ResultReleased Result = "Released"
)

// Ended is a ledger entry that this decision removes.
type Ended struct {
	Turn    likenv1.RebootTurn
	Result  Result
	Message string
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
	// RequeueAfter is when the decision must be taken again even if nothing
	// changes: the end of the startup grace or the next stall deadline.
	RequeueAfter time.Duration
}

// Decide computes the ledger, halt and Progressing condition from in.
//
// The rules are those of docs/design/protocol.md: end turns that are
// done, failed or no longer wanted; honour a resume request; halt on a
// failed trial or a stalled turn; then grant, leaders before workers and
// by machine name, while turns held plus unavailable machines without a
// turn stay within maxUnavailable and at most one leader is down; a
// Release turn only to a machine whose staged release is spec.version.
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

	// End the turns that are over.
	var failed *Ended
	kept := st.RebootTurns[:0:0]
	for _, t := range st.RebootTurns {
		m := findMachine(in.Machines, t.Machine)
		if e, over := turnOver(t, m, in.Nodes[t.Machine]); over {
			d.Ended = append(d.Ended, e)
			if e.Result == ResultTrialFailed && failed == nil {
				failed = &d.Ended[len(d.Ended)-1]
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
	if st.Halt != nil && st.Halt.Reason == likenv1.ReasonTrialFailed && st.Halt.Version != c.Spec.Version {
		lift(fmt.Sprintf("spec.version changed from %s to %s", st.Halt.Version, c.Spec.Version))
	}
	if failed != nil {
		st.Halt = &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonTrialFailed,
			Machine: failed.Turn.Machine,
			Version: c.Spec.Version,
			Message: failed.Message,
			Since:   metav1.NewTime(in.Now),
		}
		d.Halted = st.Halt
	}

	// A turn held longer than the stall timeout stops every grant.
	stalled := oldestStalled(st.RebootTurns, in.Now, stallTimeout)
	switch {
	case stalled != nil && (st.Halt == nil || st.Halt.Reason == likenv1.ReasonRolloutStalled && st.Halt.Machine != stalled.Machine):
		st.Halt = &likenv1.RolloutHalt{
			Reason:  likenv1.ReasonRolloutStalled,
			Machine: stalled.Machine,
			Version: c.Spec.Version,
			Message: stallMessage(c.Name, stalled, stallTimeout),
			Since:   metav1.NewTime(in.Now),
		}
		d.Halted = st.Halt
	case stalled == nil && st.Halt != nil && st.Halt.Reason == likenv1.ReasonRolloutStalled:
		lift(fmt.Sprintf("machine %s no longer holds a stalled turn", st.Halt.Machine))
	}

	// Grant.
	maxUnavailable, budgetErr := c.Spec.Disruption.MaxUnavailableFor(len(in.Machines))
	inLedger := func(name string) bool { return fleet.FindTurn(st.RebootTurns, name) != nil }
	unavailable := func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineLost || in.Silent[m.Name] || in.Nodes[m.Name].State == fleet.NodeNotReady
	}
	d.Waiting = waiting(in.Machines, func(name string) bool { return inLedger(name) || in.Silent[name] })
	var blocked *metav1.Condition
	switch {
	case budgetErr != nil:
		blocked = &metav1.Condition{Reason: likenv1.ReasonPaused, Message: fmt.Sprintf(
			"No turn is granted: %v. Fix spec.disruption.maxUnavailable (a whole number or a percentage such as 20%%).", budgetErr)}
	case maxUnavailable == 0:
		blocked = &metav1.Condition{Reason: likenv1.ReasonPaused, Message: "No turn is granted: spec.disruption.maxUnavailable is 0. " +
			"Set it to 1 or more (or a percentage above 0%) to let machines reboot."}
	case in.Now.Before(in.GrantFrom):
		blocked = &metav1.Condition{Reason: likenv1.ReasonStartupGrace, Message: fmt.Sprintf(
			"cluster-operator %s started leading; it grants no turn until %s, so that machines that went down before it started read Lost first. Granting resumes then by itself.",
			in.Identity, ceilSecond(in.GrantFrom).UTC().Format(time.RFC3339))}
	case stalled != nil:
		blocked = &metav1.Condition{Reason: likenv1.ReasonRolloutStalled, Message: stallMessage(c.Name, stalled, stallTimeout)}
	}
	trialHalt := st.Halt != nil && st.Halt.Reason == likenv1.ReasonTrialFailed
	if blocked == nil {
		free := maxUnavailable - len(st.RebootTurns)
		for _, m := range in.Machines {
			if !inLedger(m.Name) && unavailable(m) {
				free--
			}
		}
		leadersBehind := false
		for _, m := range in.Machines {
			if fleet.IsLeader(m) && m.Status.Version != c.Spec.Version {
				leadersBehind = true
			}
		}
		leaderDownOtherThan := func(name string) bool {
			for _, m := range in.Machines {
				if m.Name != name && fleet.IsLeader(m) && (inLedger(m.Name) || unavailable(m)) {
					return true
				}
			}
			return false
		}
		for _, m := range d.Waiting {
			reason := reasonFor(m)
			// A Release turn is for spec.version only: a machine that still
			// reports an earlier target staged (spec.version just changed,
			// and it has not staged the new one yet) would reboot into the
			// wrong release, or be taken back as soon as it restages.
			if reason == likenv1.TurnRelease && (trialHalt || m.Status.Staged != c.Spec.Version || !fleet.IsLeader(m) && leadersBehind) {
				continue
			}
			if fleet.IsLeader(m) && leaderDownOtherThan(m.Name) {
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
			t := likenv1.RebootTurn{
				Machine:   m.Name,
				Reason:    reason,
				Change:    m.Status.Change,
				Leader:    fleet.IsLeader(m),
				BootID:    m.Status.Observed.BootID,
				GrantedAt: metav1.NewTime(in.Now),
			}
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
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, likenv1.ReasonTrialFailed, st.Halt.Message
	case len(st.RebootTurns) > 0 || len(d.Waiting) > 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonGranting
		var down nameList
		for _, m := range in.Machines {
			if !inLedger(m.Name) && unavailable(m) {
				down.add(m.Name)
			}
		}
		cond.Message = grantingMessage(st.RebootTurns, down, d.Waiting, inLedger, maxUnavailable)
		cond.Message += leadersFirstMessage(in.Machines, d.Waiting, inLedger, c.Spec.Version)
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, likenv1.ReasonIdle
		cond.Message = "No machine holds or waits for a reboot turn."
	}
	fleet.SetCondition(&st.Conditions, cond, in.Now)

	d.Status = *st
	d.RequeueAfter = nextDeadline(st.RebootTurns, in.Now, in.GrantFrom, stallTimeout)
	return d
}

// turnOver says whether the ledger entry t ends, and how.
func turnOver(t likenv1.RebootTurn, m *likenv1.Machine, node Node) (Ended, bool) {
	if m == nil {
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s: the Machine was deleted", t.Machine)}, true
	}
	boot := m.Status.Observed.BootID
	newBoot := boot != "" && boot != t.BootID
	if newBoot {
		if tf := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionTrialFailed); tf != nil && tf.Status == metav1.ConditionTrue {
			return Ended{Turn: t, Result: ResultTrialFailed, Message: fmt.Sprintf(
				"The trial boot of machine %s failed (%s: %s); it returned to its proven slot. "+
					"No machine gets a Release turn until spec.version changes or a person resumes the rollout (liken rollout resume, or a new value of annotation %s on the Cluster).",
				m.Name, tf.Reason, tf.Message, likenv1.AnnotationResumeRollout)}, true
		}
		if m.Status.Phase == likenv1.MachineReady && !node.CordonedByLiken {
			return Ended{Turn: t, Result: ResultFinished, Message: fmt.Sprintf(
				"Machine %s finished its %s turn: Ready on %s from a new boot", m.Name, t.Reason, m.Status.Version)}, true
		}
		// Back from the reboot and already asking for something else (a
		// change that arrived during the turn): this turn is over, and the
		// new change asks for a turn of its own.
		switch m.Status.Phase {
		case likenv1.MachineDownloading, likenv1.MachineUpdatePending, likenv1.MachineRebootPending:
			if m.Status.Change != t.Change && !node.CordonedByLiken {
				return Ended{Turn: t, Result: ResultFinished, Message: fmt.Sprintf(
					"Machine %s finished its %s turn: it is back from a new boot on %s and now has another change staged", m.Name, t.Reason, m.Status.Version)}, true
			}
		}
		return Ended{}, false
	}
	switch m.Status.Phase {
	case likenv1.MachineUpdating, likenv1.MachineRebooting, likenv1.MachineLost, likenv1.MachineDegraded:
		return Ended{}, false // started (or cannot tell): the turn stays
	}
	if m.Status.Change != t.Change {
		why := fmt.Sprintf("its staged change is now %q, not %q", m.Status.Change, t.Change)
		if m.Status.Change == "" {
			why = "it no longer has anything staged"
		}
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s before it started: %s", m.Name, why)}, true
	}
	if fleet.IsManual(m) && !fleet.Approved(m, t.Change) {
		return Ended{Turn: t, Result: ResultTakenBack, Message: fmt.Sprintf(
			"Took back the turn of machine %s before it started: its approval (annotation %s) no longer matches change %q",
			m.Name, likenv1.AnnotationApprovedChange, t.Change)}, true
	}
	return Ended{}, false
}

// waiting are the machines that ask for a turn they may have, leaders
// first, then workers, each in the order of machines (by name: the grant
// order). skip leaves out the machines that hold a turn already, and the
// silent ones: what they show is their last word, and they could not act
// on a turn.
func waiting(machines []*likenv1.Machine, skip func(string) bool) []*likenv1.Machine {
	var leaders, workers []*likenv1.Machine
	for _, m := range machines {
		if skip(m.Name) || m.Status.Change == "" {
			continue
		}
		if m.Status.Phase != likenv1.MachineUpdatePending && m.Status.Phase != likenv1.MachineRebootPending {
			continue
		}
		if fleet.IsManual(m) && !fleet.Approved(m, m.Status.Change) {
			continue
		}
		if fleet.IsLeader(m) {
			leaders = append(leaders, m)
		} else {
			workers = append(workers, m)
		}
	}
	return append(leaders, workers...)
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

func reasonFor(m *likenv1.Machine) likenv1.TurnReason {
	if m.Status.Phase == likenv1.MachineUpdatePending {
		return likenv1.TurnRelease
	}
	return likenv1.TurnReboot
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

func stallMessage(cluster string, t *likenv1.RebootTurn, timeout time.Duration) string {
	return fmt.Sprintf("Machine %s has held its %s turn since %s, longer than the stall timeout (%s), and has not come back. "+
		"No machine gets a turn until a person examines it: granting resumes by itself when it comes back or its Machine is deleted; "+
		"to release its turn and resume now, run `liken rollout resume %s` (or set annotation %s on the Cluster to a new value).",
		t.Machine, t.Reason, t.GrantedAt.UTC().Format(time.RFC3339), timeout, cluster, likenv1.AnnotationResumeRollout)
}

// leadersFirstMessage explains why workers that wait for a Release turn
// get none: every leader updates first. It names the leaders not yet on
// version and what each of them waits for; it is empty when no worker
// waits for that reason.
func leadersFirstMessage(machines, waiting []*likenv1.Machine, inLedger func(string) bool, version string) string {
	workerWaits := false
	for _, m := range waiting {
		if !fleet.IsLeader(m) && !inLedger(m.Name) && reasonFor(m) == likenv1.TurnRelease {
			workerWaits = true
			break
		}
	}
	if !workerWaits {
		return ""
	}
	var behind nameList
	for _, m := range machines {
		if !fleet.IsLeader(m) || m.Status.Version == version {
			continue
		}
		phase := string(m.Status.Phase)
		if phase == "" {
			phase = "no status yet"
		}
		note := phase
		if fleet.IsManual(m) && m.Status.Change != "" && !fleet.Approved(m, m.Status.Change) && !inLedger(m.Name) {
			note += ", waits for `liken approve-reboot " + m.Name + "`"
		}
		behind.add(m.Name + " (" + note + ")")
	}
	if behind.n == 0 {
		return ""
	}
	return fmt.Sprintf(" Workers update to %s after every leader runs it; leaders not on it yet: %s.", version, behind)
}

func grantingMessage(turns []likenv1.RebootTurn, down nameList, waiting []*likenv1.Machine, inLedger func(string) bool, maxUnavailable int) string {
	var b strings.Builder
	if len(turns) > 0 {
		var held nameList
		for _, t := range turns {
			held.add(t.Machine)
		}
		fmt.Fprintf(&b, "Holding a turn: %s (maxUnavailable %d).", held, maxUnavailable)
	}
	if down.n > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "Down without a turn (Lost, silent or NotReady; they count against maxUnavailable %d): %s.", maxUnavailable, down)
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

// maxListed is how many machine names a message lists before it only
// counts the rest: a condition message holds at most 32768 bytes, and a
// fleet of thousands of machines waiting for turns would not fit (the API
// server would refuse the ledger write, and nothing would be granted).
const maxListed = 10

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

// nextDeadline is the delay until the startup grace ends or a turn
// reaches the stall timeout, whichever comes first; 0 when neither is
// ahead.
func nextDeadline(turns []likenv1.RebootTurn, now, grantFrom time.Time, stallTimeout time.Duration) time.Duration {
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
