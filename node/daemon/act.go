package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// This file holds the actions decide picks (plan.go). Each runs outside
// the daemon's lock, which it takes only to record how it went; an action
// that fails records when it may run again (retryLater), or, for the
// configuration, a failure the machine reports (configFailed).

// action is one step of a reconcile.
type action interface {
	fmt.Stringer
	// do carries the action out and records its outcome for the next
	// decision.
	do(ctx context.Context, d *Daemon, f *facts)
}

// retryLater records that the action of key failed: decide does not pick
// it again before Timing.APIRetry has passed.
func (d *Daemon) retryLater(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retry == nil {
		d.retry = map[string]time.Time{}
	}
	d.retry[key] = d.clock.Now().Add(d.t.APIRetry)
}

// configFailed records a failure to apply the configuration, retried with
// a backoff that doubles; the first of a row is an event.
func (d *Daemon) configFailed(ctx context.Context, f *facts, what string, err error) {
	klog.FromContext(ctx).Error(err, "Applying a configuration change failed; retrying with backoff", "what", what)
	d.mu.Lock()
	first := d.config.Err == nil
	d.config.Err = fmt.Errorf("%s: %w", what, err)
	d.config.Backoff = min(max(2*d.config.Backoff, d.t.RetryMin), d.t.RetryMax)
	d.config.RetryAt = d.clock.Now().Add(d.config.Backoff)
	d.config.Turn, d.config.Failed = "", nil
	d.mu.Unlock()
	if first {
		d.event(f.M, f.C, "Warning", ReasonApplyFailed, "Apply", "Could not apply %s: %v. Correct the value in the Machine or Cluster; liken retries", what, err)
	}
}

// configApplied forgets the last failure to apply the configuration.
func (d *Daemon) configApplied() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.config = configFailure{}
}

// emitEvents reports what background work left.
type emitEvents struct{ events []pendingEvent }

func (a emitEvents) String() string { return fmt.Sprintf("emit %d events", len(a.events)) }

func (a emitEvents) do(_ context.Context, d *Daemon, f *facts) {
	d.mu.Lock()
	d.pendingEvents = d.pendingEvents[min(len(a.events), len(d.pendingEvents)):]
	d.mu.Unlock()
	for _, e := range a.events {
		d.event(f.M, f.C, e.typ, e.reason, e.action, "%s", e.note)
	}
}

// applyFirst applies the first configuration of this machine: what the
// Machine and the Cluster say is what its first boot applies, but for the
// node agent's arguments (settings.k3sArgs): the agent started before
// liken-node with none, and restarts for them in a turn; and for the
// kernel arguments, which this boot did not pass: they wait for a reboot
// turn.
type applyFirst struct{ cfg changes.Config }

func (a applyFirst) String() string { return "apply the first configuration" }

func (a applyFirst) do(ctx context.Context, d *Daemon, f *facts) {
	cfg := a.cfg
	first := changes.Merge(cfg, changes.Config{}, likenv1.ClassRestartK3s)
	booted, err := d.o.Bootloader.KernelArgs()
	if err != nil {
		klog.FromContext(ctx).Error(err, "The boot loader's kernel arguments cannot be read; this boot passed none")
	}
	first.Settings.KernelArgs = booted
	err = d.o.Applier.StageBoot(ctx, cfg, changes.Diff(changes.Config{}, cfg))
	if err == nil {
		err = d.o.Applier.Boot(ctx, first)
	}
	if err == nil {
		err = d.update(func(st *diskState) { st.Applied, st.NextBoot = &first, &cfg })
	}
	if err != nil {
		d.configFailed(ctx, f, "first configuration", err)
		return
	}
	d.configApplied()
	klog.FromContext(ctx).Info("First configuration applied")
}

// applyAtBoot applies again what this boot should have applied.
type applyAtBoot struct{ cfg changes.Config }

func (a applyAtBoot) String() string { return "apply the configuration at boot again" }

func (a applyAtBoot) do(ctx context.Context, d *Daemon, f *facts) {
	if err := d.o.Applier.Boot(ctx, a.cfg); err != nil {
		d.configFailed(ctx, f, "applying the configuration at boot", err)
		return
	}
	d.mu.Lock()
	d.bootErr = nil
	d.mu.Unlock()
	d.configApplied()
	klog.FromContext(ctx).Info("Applied the configuration at boot after a retry")
}

// applyLive applies Live changes: those that need no turn at once, the
// others in the Live turn for change turn. An apply that fails is undone
// (what was applied before, applied again) and retried after a backoff.
type applyLive struct {
	cfg     changes.Config
	changed []changes.Change
	turn    string
}

func (a applyLive) String() string {
	if a.turn != "" {
		return "apply live in the turn for change " + a.turn + ": " + strings.Join(changes.Paths(a.changed), ", ")
	}
	return "apply live " + strings.Join(changes.Paths(a.changed), ", ")
}

func (a applyLive) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	fields := strings.Join(changes.Paths(a.changed), ", ")
	if a.turn != "" {
		// The ledger is the only truth: read it from the API server, not
		// the cache, right before the change.
		if ok, err := d.ledgerGrants(ctx, f, a.turn, "the live change"); err != nil || !ok {
			d.retryLater(retryLive)
			return
		}
	}
	if err := d.o.Applier.ApplyLive(ctx, a.cfg, a.changed); err != nil {
		if undo := d.o.Applier.ApplyLive(ctx, *f.St.Applied, a.changed); undo != nil {
			log.Error(undo, "Applying the previous values again after a live change failed", "fields", fields)
		}
		d.configFailed(ctx, f, "live change of "+fields, err)
		if a.turn != "" {
			d.mu.Lock()
			d.config.Turn, d.config.Failed = a.turn, a.changed
			d.mu.Unlock()
		}
		return
	}
	cfg := a.cfg
	if err := d.update(func(st *diskState) { st.Applied = &cfg }); err != nil {
		d.configFailed(ctx, f, "live change", err)
		return
	}
	d.configApplied()
	if a.turn == "" {
		log.Info("Applied live changes", "fields", changes.Paths(a.changed))
		d.event(f.M, f.C, "Normal", ReasonConfigApplied, "ApplyLive", "Applied %s live", fields)
		return
	}
	log.Info("Applied live changes in the turn", "fields", changes.Paths(a.changed), "change", a.turn)
	d.event(f.M, f.C, "Normal", ReasonConfigApplied, "ApplyLive", "Applied %s live in the turn for change %s (no cordon, no drain, no reboot); the turn ends once the status says so", fields, a.turn)
}

// stageBoot stages NextBoot and Reboot changes for the next boot.
type stageBoot struct {
	cfg     changes.Config
	changed []changes.Change
}

func (a stageBoot) String() string {
	return "stage for the next boot " + strings.Join(changes.Paths(a.changed), ", ")
}

func (a stageBoot) do(ctx context.Context, d *Daemon, f *facts) {
	if err := d.o.Applier.StageBoot(ctx, a.cfg, a.changed); err != nil {
		d.configFailed(ctx, f, "staging "+strings.Join(changes.Paths(a.changed), ", ")+" for the next boot", err)
		return
	}
	cfg := a.cfg
	if err := d.update(func(st *diskState) { st.NextBoot = &cfg }); err != nil {
		d.configFailed(ctx, f, "staging for the next boot", err)
		return
	}
	d.configApplied()
	klog.FromContext(ctx).Info("Staged changes for the next boot", "fields", changes.Paths(a.changed))
}

// forgetConfigFailure forgets a failure: its backoff is over and nothing
// is left to apply (a failed restart of k3s or Live change is retried in
// its turn), or a person corrected a value that failed in a Live turn (the
// new value asks for a turn at once).
type forgetConfigFailure struct{ why string }

func (a forgetConfigFailure) String() string { return "forget the configuration failure: " + a.why }

func (a forgetConfigFailure) do(ctx context.Context, d *Daemon, _ *facts) {
	klog.FromContext(ctx).Info("Forgetting the configuration failure", "why", a.why)
	d.configApplied()
}

// forgetK3sFailure forgets a failed restart of k3s.
type forgetK3sFailure struct{ why string }

func (a forgetK3sFailure) String() string { return "forget the failed restart of k3s: " + a.why }

func (a forgetK3sFailure) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	if err := d.update(func(st *diskState) { st.K3sFailure = nil }); err != nil {
		log.Error(err, "Forgetting the failed restart of k3s")
		d.retryLater(retryK3sFailure)
		return
	}
	log.Info("Forgetting the failed restart of k3s", "change", f.St.K3sFailure.Change, "why", a.why)
}

// recordResumeSeen records the resume value a failed trial is first
// reported under.
type recordResumeSeen struct{ resume string }

func (a recordResumeSeen) String() string { return "record the resume value of the failed trial" }

func (a recordResumeSeen) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	if tf := f.St.TrialFailure; a.resume != tf.Resume {
		log.Info("The rollout was resumed while the trial ran; the failure still holds the release back until the next resume", "failed", tf.Version, "armedWith", tf.Resume, "resume", a.resume)
	}
	if err := d.update(func(st *diskState) {
		st.TrialFailure.Resume, st.TrialFailure.ResumeUnseen = a.resume, false
	}); err != nil {
		log.Error(err, "Recording the resume value the failed trial is first reported under; retried")
		d.retryLater(retryResumeSeen)
	}
}

// forgetTrialFailure clears a failed trial: the Cluster wants another
// release, or a person resumed the rollout.
type forgetTrialFailure struct{ version string }

func (a forgetTrialFailure) String() string { return "forget the failed trial of " + a.version }

func (a forgetTrialFailure) do(ctx context.Context, d *Daemon, _ *facts) {
	log := klog.FromContext(ctx)
	log.Info("Clearing the failed trial: the Cluster wants another release or the rollout was resumed", "failed", a.version)
	if err := d.update(func(st *diskState) { st.TrialFailure = nil }); err != nil {
		log.Error(err, "Clearing the failed trial")
		d.retryLater(retryTrialFailure)
	}
}

// cancelDownload stops the running download; retarget, when set, is the
// release the Cluster wants instead.
type cancelDownload struct{ retarget *release.Target }

func (a cancelDownload) String() string { return "stop the download" }

func (a cancelDownload) do(ctx context.Context, d *Daemon, f *facts) {
	if a.retarget != nil && f.Download != nil {
		klog.FromContext(ctx).Info("Retarget: stopping the download of a release the Cluster no longer wants", "old", f.Download.Target.Version, "new", a.retarget.Version)
		d.event(f.M, f.C, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Stopped downloading release %s: the Cluster's version is now %s, downloaded into the same slot", f.Download.Target.Version, a.retarget.Version)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cancelDownload()
}

// forgetDownloadFailure forgets the last failed download: the Cluster
// wants no release, or the release is staged.
type forgetDownloadFailure struct{}

func (forgetDownloadFailure) String() string { return "forget the failed download" }

func (forgetDownloadFailure) do(_ context.Context, d *Daemon, _ *facts) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dlFailure = nil
}

// withdrawSlot withdraws the release the Cluster no longer wants.
type withdrawSlot struct{ slot slots.Info }

func (a withdrawSlot) String() string { return "withdraw slot " + a.slot.Name }

func (a withdrawSlot) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	if err := d.slots.Withdraw(a.slot.Name); err != nil {
		log.Error(err, "Withdrawing the release the Cluster no longer wants", "slot", a.slot.Name)
		d.retryLater(retryWithdraw)
		return
	}
	log.Info("Withdrew the release the Cluster no longer wants", "slot", a.slot.Name, "release", a.slot.Version)
	d.event(f.M, f.C, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Withdrew release %s from slot %s: the Cluster's version is %s, which this machine runs", a.slot.Version, a.slot.Name, f.C.Spec.Version)
}

// startDownload starts the download of target into slot; replaces is
// what the slot holds now.
type startDownload struct {
	target   release.Target
	slot     string
	replaces slots.Info
}

func (a startDownload) String() string {
	return fmt.Sprintf("download %s into slot %s", a.target.Version, a.slot)
}

func (a startDownload) do(ctx context.Context, d *Daemon, f *facts) {
	if a.replaces.State == likenv1.SlotStaged {
		d.event(f.M, f.C, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Withdrew staged release %s from slot %s: the Cluster's version is now %s", a.replaces.Version, a.slot, a.target.Version)
	}
	d.startDownload(ctx, f, a.target, a.slot)
}

// reportDownloadFailure reports a failed download once.
type reportDownloadFailure struct{}

func (reportDownloadFailure) String() string { return "report the failed download" }

func (reportDownloadFailure) do(_ context.Context, d *Daemon, f *facts) {
	d.mu.Lock()
	fl := d.dlFailure
	if fl == nil {
		d.mu.Unlock()
		return
	}
	fl.reported = true
	target, err, retryAt := fl.target, fl.err, fl.retryAt
	d.mu.Unlock()
	file := release.FileOf(err)
	if file == "" {
		file = "the release as a whole"
	}
	d.event(f.M, f.C, "Warning", ReasonReleaseFailed, "Download",
		"Release %s, %s: %s (%v). Nothing was staged; retrying in %s",
		target.Version, file, reasonOf(err), err, retryAt.Sub(f.Now).Round(time.Second))
}

// savePendingSince remembers when each pending change was first seen.
type savePendingSince struct{ since map[string]Since }

func (savePendingSince) String() string { return "record when the pending changes were first seen" }

func (a savePendingSince) do(ctx context.Context, d *Daemon, _ *facts) {
	if err := d.update(func(st *diskState) { st.PendingSince = a.since }); err != nil {
		klog.FromContext(ctx).Error(err, "Recording when changes were staged")
		d.retryLater(retryPendingSince)
	}
}

// beginK3sTurn records a RestartK3s turn the ledger grants.
type beginK3sTurn struct {
	change string
	cfg    changes.Config
	fields []string
}

func (a beginK3sTurn) String() string { return "take the RestartK3s turn for change " + a.change }

func (a beginK3sTurn) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	cfg := a.cfg
	rec := &turnRecord{Change: a.change, K3s: &cfg, BootID: d.o.Boot.BootID, StartedAt: f.Now}
	if err := d.update(func(st *diskState) { st.Turn = rec }); err != nil {
		log.Error(err, "Recording the RestartK3s turn failed; not restarting k3s")
		d.retryLater(retryBeginTurn)
		return
	}
	fields := fieldsOrConfig(a.fields)
	log.Info("RestartK3s turn granted; restarting k3s in place", "change", a.change, "fields", fields)
	d.event(f.M, f.C, "Normal", ReasonTurnStarted, "TakeTurn", "Took the turn for change %s: restarting k3s in place for %s (no cordon, no drain, no reboot); the node must be Ready again within %s, or k3s restarts with the configuration it ran before", a.change, fields, f.C.Spec.Disruption.TrialTimeoutOrDefault())
}

// giveBackK3sTurn forgets a RestartK3s turn that left the ledger before
// its restart was confirmed: k3s may run either configuration, so a turn
// restarts it again.
type giveBackK3sTurn struct{ change string }

func (a giveBackK3sTurn) String() string {
	return "give back the RestartK3s turn for change " + a.change
}

func (a giveBackK3sTurn) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	log.Info("The RestartK3s turn left the ledger before the restart of k3s was confirmed; asking for another", "change", a.change)
	d.mu.Lock()
	d.downWaitingFor = ""
	d.mu.Unlock()
	if err := d.update(func(st *diskState) { st.Turn, st.K3sRestartDue = nil, true }); err != nil {
		log.Error(err, "Forgetting the RestartK3s turn given back")
		d.retryLater(retryDropTurn)
		return
	}
	d.event(f.M, f.C, "Normal", ReasonTurnTakenBack, "GiveBack", "The turn for change %s left the Cluster's ledger before the restart of k3s was confirmed; the machine asks for another turn to restart k3s with the declared configuration", a.change)
}

// restartK3s restarts k3s with the new configuration, once the API server
// still grants the turn and, on a leader, the datastore keeps its
// majority without it; the restart is on disk before the next step.
type restartK3s struct {
	change  string
	cfg     changes.Config
	changed []changes.Change
}

func (a restartK3s) String() string { return "restart k3s for change " + a.change }

func (a restartK3s) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	// The ledger is the only truth: read it from the API server, not
	// the cache, right before k3s goes down.
	if ok, err := d.ledgerGrants(ctx, f, a.change, "the restart of k3s"); err != nil || !ok {
		d.retryLater(retryK3sRestart)
		return
	}
	if err := d.datastoreLetsGo(ctx, f, a.change, "the restart of k3s"); err != nil {
		d.retryLater(retryK3sRestart)
		return
	}
	what := fieldsOrConfig(changes.Paths(a.changed))
	began := d.clock.Now()
	if err := d.o.Applier.RestartK3s(ctx, a.cfg, a.changed); err != nil {
		d.configFailed(ctx, f, "k3s restart for "+what+" in the turn", err)
		return
	}
	// Applied stays what k3s ran before: the new configuration is on
	// trial, and a boot after a power cut starts k3s with Applied.
	cfg := a.cfg
	if err := d.update(func(st *diskState) {
		st.Turn.K3s = &cfg
		st.Turn.RestartedAt = began
		st.K3sRestartDue = false
	}); err != nil {
		d.configFailed(ctx, f, "recording the k3s restart", err)
		return
	}
	timeout := f.C.Spec.Disruption.TrialTimeoutOrDefault()
	log.Info("Restarted k3s in the turn; waiting for the node to be Ready again", "fields", what, "timeout", timeout)
	d.event(f.M, f.C, "Normal", ReasonK3sRestarted, "RestartK3s", "Restarted k3s in place for %s in the turn for change %s; pods kept running. The turn ends once the node is Ready again; after %s, k3s restarts with the configuration it ran before", what, a.change, timeout)
}

// rollBackK3s restarts k3s with the configuration it ran before the turn,
// whose restart did not bring the Node back Ready within timeout, then
// records the failure and the restart in one write: a liken-node that
// restarts in between rolls back again, and a power cut boots with
// Applied either way.
type rollBackK3s struct {
	turn    *turnRecord
	why     string
	timeout time.Duration
}

func (a rollBackK3s) String() string {
	return "roll back the restart of k3s for change " + a.turn.Change
}

func (a rollBackK3s) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	t := a.turn
	applied := *f.St.Applied
	fields := changes.Paths(changes.Only(changes.Diff(applied, *t.K3s), likenv1.ClassRestartK3s))
	what := fieldsOrConfig(fields)
	began := d.clock.Now()
	if err := d.o.Applier.RestartK3s(ctx, applied, nil); err != nil {
		d.configFailed(ctx, f, "restarting k3s with the configuration it ran before "+what+" changed", err)
		return
	}
	kf := &k3sFailure{Change: t.Change, Fields: fields, K3s: *t.K3s, Reason: a.why, Timeout: Duration(a.timeout), At: f.Now,
		Resume: f.C.Annotations[likenv1.AnnotationResumeRollout]}
	if err := d.update(func(st *diskState) {
		st.Turn.RolledBack = true
		st.Turn.RestartedAt = began
		st.K3sFailure = kf
	}); err != nil {
		d.configFailed(ctx, f, "recording the restart of k3s with the configuration it ran before", err)
		return
	}
	log.Info("k3s did not bring the node back Ready in time; restarted it with the configuration it ran before", "change", t.Change, "fields", what, "timeout", a.timeout, "reason", a.why)
	d.event(f.M, f.C, "Warning", likenv1.ReasonK3sRestartFailed, "RollBack", "%s", kf.message(f.C.Name))
}

// endK3sTurn ends a RestartK3s turn whose Node is Ready again: the new
// configuration becomes the one in effect (unless it was rolled back),
// and the turn is forgotten, in one write.
type endK3sTurn struct{ turn *turnRecord }

func (a endK3sTurn) String() string { return "end the RestartK3s turn for change " + a.turn.Change }

func (a endK3sTurn) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	t := a.turn
	if err := d.update(func(st *diskState) {
		if !t.RolledBack {
			cfg := changes.Merge(*st.Applied, *t.K3s, likenv1.ClassRestartK3s)
			st.Applied = &cfg
		}
		st.Turn = nil
	}); err != nil {
		log.Error(err, "Ending the RestartK3s turn")
		d.retryLater(retryK3sEnd)
		return
	}
	if t.RolledBack {
		log.Info("k3s is back on the configuration it ran before; the turn is over", "change", t.Change)
		d.event(f.M, f.C, "Normal", ReasonK3sBack, "EndTurn", "The node is Ready again on the configuration k3s ran before; the turn for change %s is over, and the machine reports the failed value until it changes", t.Change)
		return
	}
	log.Info("k3s is back after its restart; the turn is over", "change", t.Change)
	d.event(f.M, f.C, "Normal", ReasonK3sBack, "EndTurn", "The node is Ready again after the restart of k3s; the turn for change %s is over", t.Change)
}

// beginTurn records the reboot turn the ledger grants and starts it.
type beginTurn struct {
	change, request string
	release         *release.Target
	slot            string
}

func (a beginTurn) String() string { return "take the reboot turn for change " + a.change }

func (a beginTurn) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx).WithValues("change", a.change)
	rec := &turnRecord{Change: a.change, Release: a.release, Slot: a.slot, RebootRequest: a.request, BootID: d.o.Boot.BootID, StartedAt: f.Now}
	if err := d.update(func(st *diskState) { st.Turn = rec }); err != nil {
		log.Error(err, "Recording the turn failed; not starting it")
		d.retryLater(retryBeginTurn)
		return
	}
	what := "a reboot"
	if a.release != nil {
		what = "release " + a.release.Version
	}
	log.Info("Turn granted; cordoning, draining and rebooting", "for", what)
	d.event(f.M, f.C, "Normal", ReasonTurnStarted, "TakeTurn", "Took the turn for change %s (%s): cordon, drain, reboot", a.change, what)
	d.startRun(ctx, &turnRun{Change: a.change, Release: a.release, Slot: a.slot, Request: a.request, From: f.C})
}

// resumeTurn runs again the turn a previous liken-node of this boot
// started, from its first step.
type resumeTurn struct{ turn turnRecord }

func (a resumeTurn) String() string { return "resume the reboot turn for change " + a.turn.Change }

func (a resumeTurn) do(ctx context.Context, d *Daemon, f *facts) {
	t := a.turn
	klog.FromContext(ctx).Info("Resuming the turn a previous run started", "change", t.Change)
	d.event(f.M, f.C, "Normal", ReasonTurnResumed, "TakeTurn", "Resumed the turn for change %s that liken-node started before it restarted", t.Change)
	d.startRun(ctx, &turnRun{Change: t.Change, Release: t.Release, Slot: t.Slot, Request: t.RebootRequest, From: f.C})
}

// giveBack stops the reboot turn before its reboot: the ledger no longer
// grants it, or what is staged changed.
type giveBack struct{ change, why string }

func (a giveBack) String() string { return "give back the reboot turn: " + a.why }

func (a giveBack) do(ctx context.Context, d *Daemon, f *facts) {
	klog.FromContext(ctx).Info("Giving back the turn before the reboot", "change", a.change, "why", a.why)
	d.endRun()
	if err := d.dropTurnRecord(ctx); err != nil {
		d.retryLater(retryDropTurn)
	}
	d.event(f.M, f.C, "Normal", ReasonTurnTakenBack, "GiveBack", "Gave back the turn for change %s before rebooting (%s); the node is uncordoned if liken cordoned it, and the machine waits again", a.change, a.why)
}

// dropTurn forgets the turn a previous liken-node of this boot started,
// which is no longer granted or no longer matches.
type dropTurn struct{ change string }

func (a dropTurn) String() string { return "drop the turn for change " + a.change }

func (a dropTurn) do(ctx context.Context, d *Daemon, f *facts) {
	klog.FromContext(ctx).Info("Dropping the turn a previous run started: it is no longer granted or no longer matches", "change", a.change, "mode", f.Mode.String())
	if err := d.dropTurnRecord(ctx); err != nil {
		d.retryLater(retryDropTurn)
	}
}

// readLedger reads the ledger from the API server before the cordon.
type readLedger struct{ change string }

func (a readLedger) String() string { return "read the ledger before the cordon" }

func (a readLedger) do(ctx context.Context, d *Daemon, f *facts) {
	ok, err := d.ledgerGrants(ctx, f, a.change, "the cordon")
	if err != nil {
		d.retryLater(retryTurnStep)
		return
	}
	if ok {
		d.runStep(func(r *turnRun) { r.LedgerRead = true })
	}
}

// cordon cordons the node, recording that liken did.
type cordon struct{ change string }

func (a cordon) String() string { return "cordon" }

func (a cordon) do(ctx context.Context, d *Daemon, _ *facts) {
	if _, err := drain.Cordon(ctx, d.o.Kube, d.o.Machine, a.change); err != nil {
		klog.FromContext(ctx).Error(err, "Cordoning failed; retrying")
		d.retryLater(retryTurnStep)
		return
	}
	d.runStep(func(r *turnRun) { r.Cordoned = true })
}

// startDrain starts the drain; it reports when blocked and when done.
type startDrain struct{ timeout time.Duration }

func (a startDrain) String() string { return "drain" }

func (a startDrain) do(ctx context.Context, d *Daemon, f *facts) { d.startDrain(ctx, f, a.timeout) }

// startRecheck starts the re-check of the staged slot against its
// release; it reports when done.
type startRecheck struct {
	slot    string
	release release.Target
}

func (a startRecheck) String() string { return "re-check slot " + a.slot }

func (a startRecheck) do(ctx context.Context, d *Daemon, f *facts) {
	d.startRecheck(ctx, f, a.slot, a.release)
}

// goDown is the turn's last step: on a leader, only while the datastore
// keeps its majority without it; then the ledger read from the API server
// once more, the trial armed (when the re-check passed) and the reboot.
type goDown struct {
	change string
	trial  bool
}

func (a goDown) String() string {
	if a.trial {
		return "arm the trial and reboot"
	}
	return "reboot"
}

func (a goDown) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	r := f.Run
	// A leader goes down only while the datastore keeps its majority
	// without it, asked as the last step before the trial is armed and
	// the machine reboots: the operator granted the turn from a view that
	// may be as old as the drain.
	if err := d.datastoreLetsGo(ctx, f, a.change, "the reboot"); err != nil {
		d.retryLater(retryGoDown)
		return
	}
	c, ok, err := d.ledgerCluster(ctx, f, a.change, "the reboot")
	if err != nil {
		d.retryLater(retryGoDown)
		return
	}
	if !ok {
		// A trial an earlier try armed before its reboot failed must not
		// survive the turn: a power cut would boot it.
		if err := d.disarmOwnTrial(ctx); err != nil {
			d.retryLater(retryDropTurn)
		}
		return
	}
	// The kernel arguments the turn's reboot boots with are written now,
	// and only now: a reboot that is not a turn boots with those in
	// effect. A power cut from here on boots them within this turn.
	args, staged, argsChange := turnKernelArgs(f.St)
	if staged {
		if err := d.o.Bootloader.SetKernelArgs(args); err != nil {
			log.Error(err, "Writing the kernel arguments for the reboot failed; not rebooting")
			d.retryLater(retryGoDown)
			return
		}
	}
	sent := r.sent
	if a.trial {
		// The record first (marked Arming), then the flag, then the mark
		// cleared: a power cut at any point leaves either no flag and a
		// record the next boot drops, or a flag and a record for it.
		rec := &trialRecord{Slot: r.Slot, Version: r.Release.Version, Digest: r.Release.Digest,
			Timeout: Duration(c.Spec.Disruption.TrialTimeoutOrDefault()), ArmedAt: d.clock.Now(), ArmedBootID: d.o.Boot.BootID,
			Resume: c.Annotations[likenv1.AnnotationResumeRollout], Arming: true}
		if err := d.update(func(st *diskState) { st.Trial = rec }); err != nil {
			log.Error(err, "Recording the trial failed; not rebooting")
			d.retryLater(retryGoDown)
			return
		}
		if err := d.o.Bootloader.ArmTrial(boot.Slot(r.Slot)); err != nil {
			d.withdrawTrial(ctx)
			log.Error(err, "Arming the trial failed; not rebooting")
			d.retryLater(retryGoDown)
			return
		}
		if err := d.update(func(st *diskState) { st.Trial.Arming = false }); err != nil {
			d.withdrawTrial(ctx)
			log.Error(err, "Recording the armed trial failed; not rebooting")
			d.retryLater(retryGoDown)
			return
		}
		sent = append(sent, d.sink.expect(ReasonTrialArmed))
		d.event(f.M, c, "Normal", ReasonTrialArmed, "ArmTrial", "Slot %s re-checked against release %s; the next boot tries it once", r.Slot, r.Release.Version)
	}
	if err := d.update(func(st *diskState) {
		if st.Turn != nil {
			st.Turn.Rebooted = true
		}
	}); err != nil {
		log.Error(err, "Recording the reboot")
	}
	d.mu.Lock()
	d.rebooting = true
	d.mu.Unlock()
	what := "with no trial"
	if a.trial {
		what = fmt.Sprintf("into a trial of release %s in slot %s", r.Release.Version, r.Slot)
	}
	if argsChange {
		what += fmt.Sprintf(", with the kernel arguments %q", strings.Join(args, " "))
	}
	sent = append(sent, d.sink.expect(ReasonRebooting))
	d.event(f.M, c, "Normal", ReasonRebooting, "Reboot", "Rebooting %s for change %s", what, a.change)
	// Events are sent in the background: let the turn's last ones reach
	// the API server before the machine goes down.
	d.awaitSent(ctx, sent...)
	log.Info("Rebooting", "trial", a.trial)
	if err := d.reboot(ctx); err != nil {
		log.Error(err, "The reboot failed; trying again")
		d.mu.Lock()
		d.rebooting = false
		d.mu.Unlock()
		d.retryLater(retryGoDown)
	}
}

// turnKernelArgs are the kernel arguments a turn's reboot boots with (the
// staged ones, when any configuration is staged) and whether they differ
// from those in effect.
func turnKernelArgs(st *diskState) (args []string, staged, changed bool) {
	if st == nil || st.NextBoot == nil {
		return nil, false, false
	}
	args = st.NextBoot.Settings.KernelArgs
	return args, true, st.Applied == nil || !slices.Equal(args, st.Applied.Settings.KernelArgs)
}

// withdrawTrial withdraws a trial that could not be armed in full.
func (d *Daemon) withdrawTrial(ctx context.Context) {
	if err := d.o.Bootloader.DisarmTrial(); err != nil {
		klog.FromContext(ctx).Error(err, "Withdrawing the trial that could not be armed failed; the next write repairs it")
	}
	_ = d.update(func(st *diskState) { st.Trial = nil })
}

// uncordon lifts liken's cordon; from is the cache's Node it was decided
// from.
type uncordon struct{ from *corev1.Node }

func (uncordon) String() string { return "uncordon" }

func (a uncordon) do(ctx context.Context, d *Daemon, _ *facts) {
	if _, err := drain.Uncordon(ctx, d.o.Kube, d.o.Machine); err != nil {
		klog.FromContext(ctx).Error(err, "Lifting liken's cordon failed; retrying")
		d.retryLater(retryUncordon)
		return
	}
	d.mu.Lock()
	d.uncordoned = a.from
	d.mu.Unlock()
}

// writeStatus writes the Machine's status.
type writeStatus struct{ status likenv1.MachineStatus }

func (a writeStatus) String() string {
	return fmt.Sprintf("write the status (%s, change %q)", a.status.Phase, a.status.Change)
}

func (a writeStatus) do(ctx context.Context, d *Daemon, f *facts) {
	m := f.M.DeepCopy()
	m.Status = a.status
	out, err := d.o.Liken.LikenV1alpha1().Machines().UpdateStatus(ctx, m, metav1.UpdateOptions{FieldManager: FieldManager})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.lastStatusErr = err
		d.written.Forget(key)
		if apierrors.IsConflict(err) {
			// The cache is behind; its update brings the next reconcile.
			d.statusRefusedAt = f.M.ResourceVersion
			return
		}
		// An API server that refuses or does not answer is asked again
		// with a backoff that doubles, up to 30 s.
		d.statusBackoff = min(max(2*d.statusBackoff, d.t.APIRetry), 30*time.Second)
		klog.FromContext(ctx).Error(err, "Writing the Machine's status failed; retrying", "in", d.statusBackoff)
		if d.retry == nil {
			d.retry = map[string]time.Time{}
		}
		d.retry[retryStatus] = d.clock.Now().Add(d.statusBackoff)
		return
	}
	d.lastStatusErr, d.statusBackoff = nil, 0
	st := a.status
	d.lastSent, d.lastSentVersion = &st, out.ResourceVersion
	d.written.Wrote(key, f.M.ResourceVersion, out)
	d.statusWrittenInBoot = true
	if a.status.Download != nil {
		d.lastProgressWrite = d.clock.Now()
	}
	klog.FromContext(ctx).V(2).Info("Status written", "phase", a.status.Phase, "change", a.status.Change)
}

// commitTrial makes the trial slot the proven one: the boot loader first
// (from then on a reboot boots the new slot), then the slot store, then
// the daemon state. A crash between the steps is finished at the next
// start.
type commitTrial struct{}

func (commitTrial) String() string { return "commit the trial" }

func (commitTrial) do(ctx context.Context, d *Daemon, f *facts) {
	log := klog.FromContext(ctx)
	d.mu.Lock()
	if d.rebooting || d.mode != modeTrial || d.st.Trial == nil || d.st.Trial.Failure != "" {
		// The trial timer gave the trial up meanwhile.
		d.mu.Unlock()
		return
	}
	// The trial timer leaves a commit under way alone; a commit that
	// fails hands the trial back to it.
	d.committing = true
	d.mu.Unlock()
	tr := f.St.Trial
	slot := boot.Slot(tr.Slot)
	err := d.o.Bootloader.Commit(slot)
	if err != nil {
		err = fmt.Errorf("committing slot %s in the boot loader: %w", slot, err)
	} else if err = d.slots.Commit(tr.Slot); err != nil {
		err = fmt.Errorf("committing slot %s in the slot store: %w", slot, err)
	} else {
		err = d.update(func(st *diskState) {
			st.Trial = nil
			st.TrialFailure = nil
			settleTurn(st)
		})
	}
	d.mu.Lock()
	d.committing = false
	if err != nil {
		d.mu.Unlock()
		log.Error(err, "Committing the trial failed; retrying until the trial's deadline")
		d.retryLater(retryCommit)
		d.trialTimerAfterCommitFailed(ctx)
		return
	}
	d.mode = modeNormal
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	d.mu.Unlock()
	d.disarmWatchdog(ctx)
	log.Info("Trial succeeded; slot committed as proven", "slot", slot, "release", tr.Version)
	d.event(f.M, f.C, "Normal", ReasonTrialSucceeded, "Commit", "The trial of release %s in slot %s succeeded: the node is Ready and liken-node reached the API server; slot %s is now the proven slot", tr.Version, slot, slot)
}
