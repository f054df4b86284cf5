package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/rules"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// This file is the node daemon's plan: decide, a pure function from what
// the daemon observes (facts) to the one action to take next and when to
// look again. Every rule of a reconcile lives here, in the order a
// reconcile applies them; the actions (act.go) carry them out outside any
// lock, one at a time, and report back as facts. docs/design/daemon.md
// describes it; TestDecide has a row for each rule.

// facts is everything one reconcile decides from: the informers' caches,
// the state on disk, the slot store, the boot, and what the daemon's
// actors (a download, a drain, a re-check) and its last actions reported.
// observe gathers it; decide reads nothing else.
type facts struct {
	Now     time.Time
	Timing  Timing
	Machine string
	Boot    BootInfo
	// Leader: the machine runs a control plane of its own.
	Leader bool
	// Layer is the Machine document of the layer this machine was
	// installed from; nil when there is none.
	Layer *likenv1.Machine
	Mode  bootMode
	// Confusion explains modeConfused.
	Confusion string
	// Rebooting: a reboot was asked for; nothing more happens.
	Rebooting bool

	// M is the Machine (the daemon's own last status write until the
	// cache delivers it), C its Cluster, Node its Node; nil when missing.
	M    *likenv1.Machine
	C    *likenv1.Cluster
	Node *corev1.Node

	// St is the state on disk (never changed in place).
	St *diskState
	// Slots are the slot store's records; Other the inactive slot.
	Slots []slots.Info
	Other string

	// ControlPlaneErr is what is wrong with a leader's own control plane
	// (nil: healthy, or no control plane).
	ControlPlaneErr error
	// Observed is what the machine observes of itself (ObserveErr: the
	// observation failed, and the status keeps the last one).
	Observed   likenv1.ObservedState
	ObserveErr error

	// Download is the download running now; DownloadFailure the last
	// failed attempt at a target.
	Download        *downloadFacts
	DownloadFailure *downloadFailure
	// Run is the reboot turn this liken-node runs; ActorsStopping counts
	// the actors of a turn given back that have not stopped yet.
	Run            *turnRun
	ActorsStopping int
	// StaleLedger is the cache's Cluster (compared by identity: the
	// informer replaces an object it updates) whose ledger granted a turn
	// the API server no longer grants: no turn starts from it.
	StaleLedger *likenv1.Cluster
	// DownWaitingFor says why a leader holding its turn did not go down
	// at its last try: the datastore would not keep its majority.
	DownWaitingFor string

	// Config is the last failure to apply the configuration.
	Config configFailure
	// BootErr is the failure of this boot's Applier.Boot; SlotErr says the
	// slot store disagrees with the boot loader and could not be repaired.
	BootErr, SlotErr error
	// PendingEvents are outcomes of background work, waiting for a
	// reconcile that has the Machine and Cluster to attach them to.
	PendingEvents []pendingEvent
	// Retry holds, per action key, when an action that failed may run
	// again.
	Retry map[string]time.Time
	// Uncordoned is the cache's Node (compared by identity) the last
	// uncordon was decided from: the cache has not delivered it yet.
	Uncordoned *corev1.Node

	// StatusWrittenInBoot: a status write succeeded in this boot;
	// LastStatusErr is the last one's failure; LastProgressWrite the time
	// of the last write that carried download progress.
	StatusWrittenInBoot bool
	LastStatusErr       error
	LastProgressWrite   time.Time
	// StatusRefusedAt is the Machine's resourceVersion a status write was
	// refused against (a conflict): the cache is behind, and its update
	// brings the next write.
	StatusRefusedAt string
	// LastSent is the last status written, LastSentVersion the Machine's
	// resourceVersion that write returned: the same status is not written
	// again on it (an API server that changes what it stores would
	// otherwise be written to at every step).
	LastSent        *likenv1.MachineStatus
	LastSentVersion string
}

// downloadFacts is the progress of the running download.
type downloadFacts struct {
	Target      release.Target
	Slot        string
	Done, Total int64
}

// configFailure is the last failure to apply the configuration: retried
// at RetryAt, with a backoff that doubles.
type configFailure struct {
	Err     error
	RetryAt time.Time
	Backoff time.Duration
	// Turn is the change of the Live turn the failure happened in, and
	// Failed the values that failed. The machine keeps reporting the
	// turn's change, so the operator keeps its turn and grants the values
	// to no other machine, until they are corrected (then it forgets the
	// failure at once) or its retry in the same turn succeeds.
	Turn   string
	Failed []changes.Change
}

// liveCorrected tells whether a value of a failed Live turn is no longer
// declared: a person corrected it.
func liveCorrected(f *facts, v *view) bool {
	now := changes.Diff(*f.St.Applied, v.desired)
	for _, c := range f.Config.Failed {
		if !slices.ContainsFunc(now, func(n changes.Change) bool { return n.Field == c.Field && n.Value == c.Value }) {
			return true
		}
	}
	return false
}

// turnRun is the progress of the reboot turn this liken-node runs, step by
// step (the turn record on disk survives it; a restart of liken-node runs
// the steps again from the first).
type turnRun struct {
	Change  string
	Release *release.Target
	Slot    string
	Request string
	// From is the cache's Cluster that granted the turn.
	From *likenv1.Cluster
	// LedgerRead: the API server granted the turn before the cordon.
	LedgerRead bool
	Cordoned   bool
	// Draining and Drained: the drain runs, or ended; Blocked is what
	// blocks it, reported once the drain timeout passed.
	Draining, Drained bool
	Blocked           *drain.Blocked
	// Rechecking and Rechecked: the staged slot's re-check runs, or ended;
	// TrialOK says it matched its release (the reboot is a trial).
	Rechecking, Rechecked, TrialOK bool
	// sent are the turn's events the reboot waits for.
	sent []<-chan struct{}
}

// Keys of actions that retry after a failure (facts.Retry).
const (
	retryPendingSince = "pendingSince"
	retryResumeSeen   = "resumeSeen"
	retryTrialFailure = "trialFailure"
	retryWithdraw     = "withdraw"
	retryTurnStep     = "turnStep"
	retryGoDown       = "goDown"
	retryK3sRestart   = "k3sRestart"
	retryUncordon     = "uncordon"
	retryStatus       = "status"
	retryCommit       = "commit"
	retryK3sEnd       = "k3sEnd"
	retryK3sFailure   = "k3sFailure"
	retryBeginTurn    = "beginTurn"
	retryDropTurn     = "dropTurn"
	retryLive         = "live"
)

// retrying says whether the action of key failed and waits for its retry;
// it asks v to look again then.
func (f *facts) retrying(v *view, key string) bool {
	at, ok := f.Retry[key]
	if !ok || !f.Now.Before(at) {
		return false
	}
	v.requeue(at.Sub(f.Now))
	return true
}

// view is what decide works out from the facts on its way to an action;
// the status is made from it.
type view struct {
	m    *likenv1.Machine
	c    *likenv1.Cluster
	node *corev1.Node
	now  time.Time

	// target is the release to run when it is not the running one.
	target *release.Target
	// staged: target is staged in the other slot.
	staged bool
	// downloading: a download of target runs now.
	downloading bool
	// failedTrial: target already failed its trial here.
	failedTrial *trialFailure

	desired   changes.Config
	rebootCfg []changes.Change
	nextBoot  []changes.Change
	// live are the Live changes that wait for a Live turn.
	live []changes.Change
	// k3s are the RestartK3s changes, which wait for a turn.
	k3s     []changes.Change
	request string
	// liveTurn: the change asks for a Live turn (Live changes ask before
	// any other, but not while a turn is under way or a trial runs).
	liveTurn bool
	// k3sTurn: the change asks for a RestartK3s turn (only RestartK3s
	// changes wait; a reboot turn goes first when anything needs one).
	k3sTurn bool

	pending []likenv1.PendingChange
	change  string

	// k3sWaitsFor says what a RestartK3s turn waits for after the restart;
	// trialWaitsFor why a trial boot has not committed yet.
	k3sWaitsFor   string
	trialWaitsFor string
	// commit: the trial boot is proven and commits.
	commit bool

	after time.Duration
}

func (v *view) requeue(after time.Duration) {
	if after > 0 && (v.after == 0 || after < v.after) {
		v.after = after
	}
}

// plan is decide's answer: the next action (nil: nothing to do but wait)
// and when to look again without news.
type plan struct {
	Do    action
	After time.Duration
	// TrialWaitsFor says why a trial boot has not committed yet, for the
	// trial's failure should its timer end it.
	TrialWaitsFor string
	v             *view
}

// decide picks the next action from the facts, in the order a reconcile
// takes them: the events background work left, the configuration, the
// release, the pending changes, a RestartK3s turn, a reboot turn, a
// cordon left behind, the status, and a trial's commit.
func decide(f *facts) plan {
	if f.Rebooting {
		return plan{}
	}
	if f.M == nil {
		return plan{TrialWaitsFor: fmt.Sprintf("the Machine %s does not exist", f.Machine)}
	}
	if f.C == nil {
		return plan{TrialWaitsFor: fmt.Sprintf("the Cluster %s does not exist", f.M.Spec.Cluster)}
	}
	v := &view{m: f.M, c: f.C, node: f.Node, now: f.Now}
	v.requeue(f.Timing.Resync)
	if f.ControlPlaneErr != nil {
		v.requeue(f.Timing.APIRetry)
	}
	p := plan{v: v}
	for _, step := range []func(*facts, *view) action{
		decideEvents, decideConfig, decideRelease, decidePending,
		decideLiveTurn, decideK3sTurn, decideTurn, decideCordon, decideTrial, decideStatus, decideCommit,
	} {
		if a := step(f, v); a != nil {
			p.Do = a
			break
		}
	}
	p.After, p.TrialWaitsFor = v.after, v.trialWaitsFor
	return p
}

// decideEvents reports what background work left for a reconcile.
func decideEvents(f *facts, _ *view) action {
	if len(f.PendingEvents) > 0 {
		return emitEvents{events: f.PendingEvents}
	}
	return nil
}

// decideConfig applies the Live changes that need no turn and stages the
// NextBoot and Reboot ones for the next boot; other Live changes and
// RestartK3s ones wait for a turn (decideLiveTurn, decideK3sTurn). The
// first configuration of a machine is what its first
// boot applies.
func decideConfig(f *facts, v *view) action {
	v.desired = changes.Desired(v.m, v.c)
	backingOff := f.Config.Err != nil && v.now.Before(f.Config.RetryAt)
	if f.Config.Turn != "" && f.St.Applied != nil && liveCorrected(f, v) {
		return forgetConfigFailure{why: "a value that failed in the Live turn was corrected"}
	}
	if backingOff {
		v.requeue(f.Config.RetryAt.Sub(v.now))
	}
	if f.St.Applied == nil {
		if backingOff {
			return nil
		}
		return applyFirst{cfg: v.desired}
	}
	defer pendingConfig(f, v)
	if backingOff {
		return nil
	}
	if f.BootErr != nil {
		// What this boot should have applied is not in effect: apply it
		// again before anything else, and stay Degraded until it holds.
		return applyAtBoot{cfg: *f.St.Applied}
	}
	if why := k3sFailureCleared(f, v); why != "" && !f.retrying(v, retryK3sFailure) {
		return forgetK3sFailure{why: why}
	}
	applied := *f.St.Applied
	diff := changes.Diff(applied, v.desired)
	if _, now := changes.SplitLive(changes.Only(diff, likenv1.ClassLive)); len(now) > 0 {
		return applyLive{cfg: changes.MergeChanges(applied, v.desired, now), changed: now}
	}
	nb := applied
	if f.St.NextBoot != nil {
		nb = *f.St.NextBoot
	}
	if boot := changes.Only(changes.Diff(nb, v.desired), likenv1.ClassNextBoot, likenv1.ClassReboot); len(boot) > 0 {
		return stageBoot{cfg: changes.Merge(nb, v.desired, likenv1.ClassNextBoot, likenv1.ClassReboot), changed: boot}
	}
	if f.Config.Err != nil {
		if inTurn, _ := changes.SplitLive(changes.Only(diff, likenv1.ClassLive)); f.Config.Turn != "" && !slices.Equal(inTurn, f.Config.Failed) {
			// Other Live values were declared since, and the failed ones
			// are still declared: no retry, and the turn stays held, until
			// a person corrects the failed values (liveCorrected).
			return nil
		}
		// The backoff is over and nothing is left to apply: a restart of
		// k3s that failed, or a Live change that failed in its turn, is
		// retried next (decideK3sTurn, decideLiveTurn).
		return forgetConfigFailure{why: "its backoff is over and nothing is left to apply"}
	}
	return nil
}

// pendingConfig works out the changes that wait: for a reboot, the next
// boot, or a restart of k3s.
func pendingConfig(f *facts, v *view) {
	if f.St.Applied == nil {
		return
	}
	diff := changes.Diff(*f.St.Applied, v.desired)
	v.rebootCfg = changes.Only(diff, likenv1.ClassReboot)
	v.nextBoot = changes.Only(diff, likenv1.ClassNextBoot)
	v.live, _ = changes.SplitLive(changes.Only(diff, likenv1.ClassLive))
	v.k3s = changes.Only(diff, likenv1.ClassRestartK3s)
	if len(v.k3s) == 0 && f.St.K3sRestartDue {
		// What k3s runs is not known: restart it with what is declared.
		v.k3s = []changes.Change{{Field: changes.FieldK3sArgs, Class: likenv1.ClassRestartK3s, Value: "restart-due"}}
	}
}

// k3sFailureCleared says why a failed restart of k3s is forgotten: the
// declared configuration differs from the one that failed, or a person
// resumed the rollout; "" while it holds.
func k3sFailureCleared(f *facts, v *view) string {
	kf := f.St.K3sFailure
	if kf == nil || f.St.Applied == nil {
		return ""
	}
	declared := changes.Merge(*f.St.Applied, v.desired, likenv1.ClassRestartK3s)
	switch {
	case len(changes.Only(changes.Diff(kf.K3s, declared), likenv1.ClassRestartK3s)) > 0:
		return "the declared value changed"
	case v.c.Annotations[likenv1.AnnotationResumeRollout] != kf.Resume:
		return "a person resumed the rollout"
	}
	return ""
}

// k3sHeld is the RestartK3s turn this boot holds, if any.
func k3sHeld(f *facts) *turnRecord {
	if t := f.St.Turn; t != nil && t.K3s != nil && t.BootID == f.Boot.BootID {
		return t
	}
	return nil
}

// catalogTarget is the release the Cluster wants, or nil when the machine
// runs it already or the catalog does not name it.
func catalogTarget(running string, c *likenv1.Cluster) *release.Target {
	if c.Spec.Version == "" || c.Spec.Version == running {
		return nil
	}
	for _, e := range c.Spec.Releases.Catalog {
		if e.Version == c.Spec.Version {
			return &release.Target{Version: e.Version, Digest: e.Digest}
		}
	}
	return nil
}

func (f *facts) slot(name string) slots.Info {
	for _, s := range f.Slots {
		if s.Name == name {
			return s
		}
	}
	return slots.Info{Name: name}
}

// decideRelease runs the release pipeline: download the Cluster's version
// into the other slot, verify and stage it; withdraw a release the Cluster
// no longer wants. A failed trial holds its release back.
func decideRelease(f *facts, v *view) action {
	v.target = catalogTarget(f.Boot.Version, v.c)
	other := f.slot(f.Other)

	// A failed trial holds the release back until the version changes or
	// a person resumes the rollout after the failure. The resume value
	// that counts is the Cluster's when the failure is first seen here:
	// a resume given while the trial ran (for another machine's halt)
	// does not clear a failure nobody has seen yet.
	if tf := f.St.TrialFailure; tf != nil {
		resume := v.c.Annotations[likenv1.AnnotationResumeRollout]
		if tf.ResumeUnseen {
			if !f.retrying(v, retryResumeSeen) {
				return recordResumeSeen{resume: resume}
			}
			// Not saved: this reconcile holds the release anyway.
			unsaved := *tf
			unsaved.Resume, unsaved.ResumeUnseen = resume, false
			tf = &unsaved
		}
		if v.target != nil && tf.Version == v.target.Version && tf.Digest == v.target.Digest && resume == tf.Resume {
			v.failedTrial = tf
		} else if !f.retrying(v, retryTrialFailure) {
			return forgetTrialFailure{version: tf.Version}
		}
	}

	if r := f.Run; r != nil {
		// During a turn the release it reboots into stays staged, even
		// when the re-check before the reboot marks the slot Failed (the
		// machine then reboots without a trial); only a new target
		// changes what is staged, and the turn is given back.
		v.staged = v.target != nil && r.Release != nil && *r.Release == *v.target
		return nil
	}
	if f.Mode != modeNormal || f.St.Turn != nil {
		// No slot changes during a trial, nor on a boot that is not the
		// proven slot.
		v.staged = v.target != nil && other.State == likenv1.SlotStaged && other.Target() == *v.target
		v.downloading = f.Download != nil
		return nil
	}

	dl := f.Download
	switch {
	case v.target == nil || v.failedTrial != nil:
		if dl != nil {
			return cancelDownload{}
		}
		if f.DownloadFailure != nil {
			return forgetDownloadFailure{}
		}
		if v.target == nil && v.c.Spec.Version == f.Boot.Version &&
			(other.State == likenv1.SlotStaged || other.State == likenv1.SlotDownloading) && !f.retrying(v, retryWithdraw) {
			return withdrawSlot{slot: other}
		}
	case other.State == likenv1.SlotStaged && other.Target() == *v.target:
		v.staged = true
		if dl != nil && dl.Target != *v.target {
			return cancelDownload{}
		}
		if f.DownloadFailure != nil {
			// A download of this target that just staged it reports itself.
			return forgetDownloadFailure{}
		}
	case dl != nil && dl.Target == *v.target:
		v.downloading = true
	case dl != nil:
		return cancelDownload{retarget: v.target}
	default:
		if fl := f.DownloadFailure; fl != nil && fl.target == *v.target && v.now.Before(fl.retryAt) {
			v.requeue(fl.retryAt.Sub(v.now))
			break
		}
		return startDownload{target: *v.target, slot: f.Other, replaces: other}
	}
	if fl := f.DownloadFailure; fl != nil && !fl.reported && v.target != nil && fl.target == *v.target {
		return reportDownloadFailure{}
	}
	return nil
}

// decidePending works out the pending changes and the change identifier,
// and remembers when each was first seen.
func decidePending(f *facts, v *view) action {
	// The API server keeps a metav1.Time to the second: a time with more
	// precision would never compare equal to what it stores, and every
	// reconcile would write the status again.
	since := func(field, value string) metav1.Time {
		if s, ok := f.St.PendingSince[field]; ok && s.Value == value {
			return apiTime(s.Since)
		}
		return apiTime(v.now)
	}
	wanted := map[string]Since{}
	add := func(field string, class likenv1.DisruptionClass, value string) {
		s := since(field, value)
		wanted[field] = Since{Value: value, Since: s.Time}
		v.pending = append(v.pending, likenv1.PendingChange{Field: field, Class: class, Since: s})
	}
	var ids []string
	if v.staged {
		add(changes.FieldVersion, likenv1.ClassReboot, v.target.String())
		ids = append(ids, "release="+v.target.String())
	}
	for _, c := range v.rebootCfg {
		add(c.Field, c.Class, c.Value)
		ids = append(ids, c.Field+"="+c.Value)
	}
	if r := v.m.Annotations[likenv1.AnnotationRequestReboot]; r != "" && r != f.St.ObservedRebootRequest {
		v.request = r
		add(changes.FieldRebootRequest, likenv1.ClassReboot, r)
		ids = append(ids, "request="+r)
	}
	// Live changes ask for their turn first: it is short, and a reboot
	// that waits for approval, a halt or a window must not hold back a fix
	// of the name servers or the CA bundle. Not while a turn is under way
	// in this boot or a trial runs: they ask after it. RestartK3s changes
	// ask last, when nothing else waits: one turn judges one kind of
	// change.
	underWay := f.Run != nil || f.Mode == modeTrial || (f.St.Turn != nil && f.St.Turn.BootID == f.Boot.BootID)
	v.liveTurn = len(v.live) > 0 && !underWay
	rebootAsk := len(ids) > 0
	if v.liveTurn {
		ids = nil
	}
	for _, c := range v.live {
		add(c.Field, c.Class, c.Value)
		if v.liveTurn {
			ids = append(ids, c.Field+"="+c.Value)
		}
	}
	v.k3sTurn = !rebootAsk && !v.liveTurn && len(v.k3s) > 0
	for _, c := range v.k3s {
		add(c.Field, c.Class, c.Value)
		if v.k3sTurn {
			ids = append(ids, c.Field+"="+c.Value)
		}
	}
	for _, c := range v.nextBoot {
		// Remembered for since, not listed: they ask for no reboot.
		s := since(c.Field, c.Value)
		wanted[c.Field] = Since{Value: c.Value, Since: s.Time}
	}
	if len(ids) > 0 {
		sort.Strings(ids)
		h := sha256.Sum256([]byte(strings.Join(ids, "\n")))
		v.change = hex.EncodeToString(h[:8])
	}
	if !equalSince(wanted, f.St.PendingSince) && !f.retrying(v, retryPendingSince) {
		return savePendingSince{since: wanted}
	}
	return nil
}

func equalSince(a, b map[string]Since) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if y, ok := b[k]; !ok || x.Value != y.Value || !x.Since.Equal(y.Since) {
			return false
		}
	}
	return true
}

// degraded says why the machine needs a person, or "".
func degraded(f *facts, v *view) string {
	switch {
	case f.Mode == modeConfused:
		return f.Confusion
	case v.target == nil && v.c.Spec.Version != "" && v.c.Spec.Version != f.Boot.Version:
		return fmt.Sprintf("the Cluster's version %s is not in its releases.catalog, so the machine cannot verify it: add its catalog entry (version and digest) or set spec.version back", v.c.Spec.Version)
	case v.failedTrial != nil:
		return "the trial of release " + v.failedTrial.Version + " failed: " + v.failedTrial.Reason
	case f.SlotErr != nil:
		return f.SlotErr.Error() + "; liken-node tries again at its next start"
	case f.Config.Err != nil:
		return f.Config.Err.Error()
	case f.St.K3sFailure != nil:
		msg := f.St.K3sFailure.message(v.c.Name)
		if t := k3sHeld(f); t != nil && t.RolledBack && v.k3sWaitsFor != "" {
			msg += "; waiting for the node to be Ready again: " + v.k3sWaitsFor
		}
		return msg
	}
	return ""
}

// asking tells whether the machine asks for a turn now.
func asking(f *facts, v *view) bool {
	return v.change != "" && f.Mode == modeNormal && !v.downloading && degraded(f, v) == ""
}

// ledgerEntry is the machine's entry in the Cluster's turn ledger.
func ledgerEntry(c *likenv1.Cluster, machine string) *likenv1.RebootTurn {
	for i := range c.Status.RebootTurns {
		if c.Status.RebootTurns[i].Machine == machine {
			return &c.Status.RebootTurns[i]
		}
	}
	return nil
}

// decideLiveTurn applies the Live changes in the Live turn the ledger
// grants them: no cordon, no drain, no reboot. Not while another turn is
// under way (each turn is judged on one kind of change). The
// turn ends when the status says the changes are applied; an apply that
// fails keeps it, so the value reaches no other machine
// (docs/design/protocol.md#live-changes-in-turns).
func decideLiveTurn(f *facts, v *view) action {
	if !v.liveTurn || !asking(f, v) || f.St.Turn != nil || f.Run != nil || f.ActorsStopping > 0 || f.retrying(v, retryLive) {
		return nil
	}
	if e := ledgerEntry(v.c, f.Machine); e == nil || e.Change != v.change || e.Reason != likenv1.TurnLive {
		return nil // a turn of another reason is not for applying values in place
	}
	return applyLive{cfg: changes.MergeChanges(*f.St.Applied, v.desired, v.live), changed: v.live, turn: v.change}
}

// decideK3sTurn runs a RestartK3s turn, each step on disk before the next,
// so that a restart of liken-node resumes it and a power cut leaves k3s on
// the configuration it ran before
// (docs/design/protocol.md#a-machine-restarts-k3s-in-its-turn). The new
// configuration is on trial until the Node is Ready again; past the
// Cluster's trial timeout, k3s restarts with Applied and the machine
// reports the failure.
func decideK3sTurn(f *facts, v *view) action {
	entry := ledgerEntry(v.c, f.Machine)
	t := k3sHeld(f)
	if t == nil {
		if f.St.Turn != nil || f.Run != nil || f.ActorsStopping > 0 || !v.k3sTurn || !asking(f, v) ||
			entry == nil || entry.Change != v.change || f.retrying(v, retryBeginTurn) {
			return nil
		}
		return beginK3sTurn{change: v.change, cfg: changes.Merge(*f.St.Applied, v.desired, likenv1.ClassRestartK3s), fields: changes.Paths(v.k3s)}
	}
	if t.RestartedAt.IsZero() {
		if entry == nil || entry.Change != t.Change {
			// Taken back or released before the restart was confirmed: k3s
			// may run either configuration, so a turn restarts it again.
			if f.retrying(v, retryDropTurn) {
				return nil
			}
			return giveBackK3sTurn{change: t.Change}
		}
		if f.Config.Err != nil || f.retrying(v, retryK3sRestart) {
			// The last restart failed, or the ledger or the datastore
			// said not yet: retried once that wait is over.
			return nil
		}
		cfg := changes.Merge(*f.St.Applied, v.desired, likenv1.ClassRestartK3s)
		return restartK3s{change: t.Change, cfg: cfg, changed: changes.Only(changes.Diff(*f.St.Applied, cfg), likenv1.ClassRestartK3s)}
	}
	if f.Config.Err != nil {
		// The restart back to Applied failed: retried after the backoff.
		return nil
	}
	// A heartbeat in a later second than the restart (the API server keeps
	// them to the second). A leader's control plane restarted with the
	// node agent: the turn ends only once it is back, or the next leader's
	// turn could take a second member of the datastore down.
	ready, why := readySince(v.node, f.Boot.BootID, t.RestartedAt.Truncate(time.Second).Add(time.Second), "the restart of k3s", t.RestartedAt)
	if ready && f.ControlPlaneErr != nil {
		ready, why = false, f.ControlPlaneErr.Error()
	}
	if ready {
		if f.retrying(v, retryK3sEnd) {
			return nil
		}
		return endK3sTurn{turn: t}
	}
	v.k3sWaitsFor = why
	timeout := v.c.Spec.Disruption.TrialTimeoutOrDefault()
	left := t.RestartedAt.Add(timeout).Sub(v.now)
	switch {
	case t.RolledBack:
		// k3s runs what it ran before; the stall timeout names a machine
		// that does not come back even so.
		v.requeue(f.Timing.APIRetry)
		return nil
	case left > 0:
		v.requeue(min(f.Timing.APIRetry, left))
		return nil
	}
	return rollBackK3s{turn: t, why: why, timeout: timeout}
}

// decideTurn starts the reboot turn the ledger grants and takes its next
// step, or gives back one that is no longer granted or no longer matches
// what is staged.
func decideTurn(f *facts, v *view) action {
	entry := ledgerEntry(v.c, f.Machine)
	granted := func(change string) bool { return entry != nil && change != "" && entry.Change == change }

	if r := f.Run; r != nil {
		if granted(r.Change) && v.change == r.Change {
			return turnStep(f, v, r)
		}
		why := "the turn left the Cluster's ledger"
		if entry != nil && entry.Change != r.Change {
			why = "the ledger now names another change"
		} else if v.change != r.Change {
			why = "what is staged changed before the reboot"
		}
		return giveBack{change: r.Change, why: why}
	}
	if t := f.St.Turn; t != nil && t.K3s != nil {
		return nil // a RestartK3s turn: decideK3sTurn's
	}
	if f.StaleLedger != nil && v.c == f.StaleLedger {
		return nil // the API server no longer grants what this copy does
	}
	if t := f.St.Turn; t != nil && t.BootID == f.Boot.BootID {
		// A turn this boot started before liken-node restarted.
		if !granted(t.Change) || v.change != t.Change || f.Mode != modeNormal {
			if f.retrying(v, retryDropTurn) {
				return nil
			}
			return dropTurn{change: t.Change}
		}
		return resumeTurn{turn: *t}
	}
	if !asking(f, v) || !granted(v.change) || v.liveTurn || v.k3sTurn || !rules.Cleared(v.m, v.change) || f.retrying(v, retryBeginTurn) {
		// A turn the ledger lists for a change not approved yet waits for
		// liken approve-reboot (the RebootPending condition says so).
		return nil
	}
	b := beginTurn{change: v.change, request: v.request}
	if v.staged {
		t := *v.target
		b.release, b.slot = &t, f.Other
	}
	return b
}

// turnStep is the next step of the reboot turn r: the ledger read from
// the API server, the cordon, the drain, the re-check of the staged slot,
// then the reboot (goDown), which reads the ledger again and, on a
// leader, asks the datastore first.
func turnStep(f *facts, v *view, r *turnRun) action {
	if f.retrying(v, retryTurnStep) {
		return nil
	}
	switch {
	case !r.LedgerRead:
		return readLedger{change: r.Change}
	case !r.Cordoned:
		return cordon{change: r.Change}
	case !r.Drained && !r.Draining:
		return startDrain{timeout: v.c.Spec.Disruption.DrainTimeoutOrDefault()}
	case !r.Drained:
		return nil // the drain reports when it ends
	case r.Release != nil && !r.Rechecked && !r.Rechecking:
		return startRecheck{slot: r.Slot, release: *r.Release}
	case r.Release != nil && !r.Rechecked:
		return nil // the re-check reports when it ends
	}
	if f.retrying(v, retryGoDown) {
		return nil
	}
	return goDown{change: r.Change, trial: r.TrialOK}
}

// decideCordon lifts a cordon liken left behind when no turn is under way:
// after the turn's reboot, after a failed trial, or after a turn was given
// back. A node someone else cordoned is never touched.
func decideCordon(f *facts, v *view) action {
	n := v.node
	if n == nil || f.Run != nil || f.ActorsStopping > 0 || f.St.Turn != nil || f.Mode == modeTrial {
		return nil
	}
	if _, ours := n.Annotations[likenv1.AnnotationCordoned]; !ours || n == f.Uncordoned || f.retrying(v, retryUncordon) {
		return nil
	}
	return uncordon{from: n}
}

// decideTrial works out whether a trial boot is proven: it wrote its
// status in this boot, its kubelet of this boot posted Ready since the
// boot, and on a leader its control plane is healthy. The commit comes
// after the status (decideCommit).
func decideTrial(f *facts, v *view) action {
	if f.Mode != modeTrial || f.St.Trial == nil || f.St.Trial.Failure != "" {
		return nil
	}
	if !f.StatusWrittenInBoot {
		v.trialWaitsFor = "liken-node could not write the Machine's status"
		if f.LastStatusErr != nil {
			v.trialWaitsFor += ": " + f.LastStatusErr.Error()
		}
		return nil
	}
	ready, why := readySince(v.node, f.Boot.BootID, f.Boot.BootedAt.Truncate(time.Second), "this boot", f.Boot.BootedAt)
	switch {
	case !ready:
		v.trialWaitsFor = why
	case f.ControlPlaneErr != nil:
		v.trialWaitsFor = f.ControlPlaneErr.Error()
	default:
		v.commit = true
		v.trialWaitsFor = "its slot is being committed"
	}
	return nil
}

// decideStatus writes the status when it differs from what the API holds;
// progress alone is written at most every Timing.Progress. In a trial boot
// the first write happens even with nothing new: it proves the daemon
// reaches the API server.
func decideStatus(f *facts, v *view) action {
	st, err := apiPrecision(machineStatus(f, v))
	if err != nil {
		return nil
	}
	cur := v.m.Status
	force := f.Mode == modeTrial && !f.StatusWrittenInBoot
	if !force && equality.Semantic.DeepEqual(st, cur) {
		return nil
	}
	if f.StatusRefusedAt != "" && f.StatusRefusedAt == v.m.ResourceVersion {
		v.requeue(f.Timing.APIRetry)
		return nil
	}
	if !force && f.LastSent != nil && v.m.ResourceVersion == f.LastSentVersion && equality.Semantic.DeepEqual(st, *f.LastSent) {
		return nil
	}
	if !force && st.Download != nil && cur.Download != nil {
		same := st
		same.Download = cur.Download
		if equality.Semantic.DeepEqual(same, cur) {
			if wait := f.Timing.Progress - f.Now.Sub(f.LastProgressWrite); wait > 0 {
				v.requeue(wait)
				return nil
			}
		}
	}
	if f.retrying(v, retryStatus) {
		return nil
	}
	return writeStatus{status: st}
}

// decideCommit commits a proven trial, once its status is written.
func decideCommit(f *facts, v *view) action {
	if !v.commit || f.retrying(v, retryCommit) {
		return nil
	}
	return commitTrial{}
}
