package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/release"
)

// Event reasons of the node daemon.
const (
	ReasonConfigApplied     = "ConfigApplied"
	ReasonK3sRestarted      = "K3sRestarted"
	ReasonK3sBack           = "K3sBack"
	ReasonApplyFailed       = "ApplyFailed"
	ReasonDownloadStarted   = "DownloadStarted"
	ReasonReleaseStaged     = "ReleaseStaged"
	ReasonReleaseFailed     = "ReleaseVerificationFailed"
	ReasonReleaseWithdrawn  = "ReleaseWithdrawn"
	ReasonTurnStarted       = "TurnStarted"
	ReasonTurnTakenBack     = "TurnTakenBack"
	ReasonTurnResumed       = "TurnResumed"
	ReasonDrainBlocked      = likenv1.ConditionDrainBlocked
	ReasonDrained           = "Drained"
	ReasonSlotRecheckFailed = "SlotRecheckFailed"
	// ReasonSlotStoreRepaired: the slot store disagreed with the boot
	// loader at start, and was made to agree.
	ReasonSlotStoreRepaired = "SlotStoreRepaired"
	ReasonTrialArmed        = "TrialArmed"
	ReasonRebooting         = "Rebooting"
	ReasonTrialSucceeded    = "TrialSucceeded"
	ReasonTrialFailed       = likenv1.ReasonTrialFailed
	// ReasonWaitingForDatastore: a leader holds its turn but does not go
	// down yet, because the datastore would lose its majority.
	ReasonWaitingForDatastore = "WaitingForDatastore"
	// ReasonWaitingForTurn on ConfigApplied: RestartK3s changes wait for
	// the machine's turn to restart k3s.
	ReasonWaitingForTurn = "WaitingForTurn"
)

// Reasons of a leader's ControlPlaneReady condition.
const (
	ReasonControlPlaneReady    = "Healthy"
	ReasonControlPlaneNotReady = "NotHealthy"
)

// view is what one reconcile works out before it acts and reports.
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
	// k3s are, on a leader, the RestartK3s changes that wait for a leader
	// turn (a worker applies them at once).
	k3s     []changes.Change
	request string
	// k3sTurn: the change asks for a RestartK3s turn (only RestartK3s
	// changes wait; a reboot turn goes first when anything needs one).
	k3sTurn bool

	pending []likenv1.PendingChange
	change  string
	after   time.Duration
}

func (v *view) requeue(after time.Duration) {
	if after > 0 && (v.after == 0 || after < v.after) {
		v.after = after
	}
}

// sync is one reconcile: apply configuration, run the release pipeline,
// start or give back the turn, settle a trial, report.
func (d *Daemon) sync(ctx context.Context) (time.Duration, error) {
	log := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rebooting || ctx.Err() != nil {
		return 0, nil
	}
	m, err := d.machines.Get(d.o.Machine)
	if apierrors.IsNotFound(err) {
		log.Info("Machine does not exist yet; waiting for it")
		d.trialWaitingFor = fmt.Sprintf("the Machine %s does not exist", d.o.Machine)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// Work from the daemon's own last status write until the informer
	// delivers it: a reconcile that worked from the cached copy would
	// write the same status again and be refused as a conflict.
	m = d.written.Latest(key, m)
	c, err := d.clusters.Get(m.Spec.Cluster)
	if apierrors.IsNotFound(err) {
		log.Info("Cluster does not exist yet; waiting for it", "cluster", m.Spec.Cluster)
		d.trialWaitingFor = fmt.Sprintf("the Cluster %s does not exist", m.Spec.Cluster)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	node, err := d.nodes.Get(d.o.Machine)
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	v := &view{m: m, c: c, node: node, now: d.clock.Now()}
	v.requeue(d.t.Resync)
	// A leader's own control plane, checked once per reconcile (Resync at
	// rest, sooner while it is not ready): ControlPlaneReady, the trial's
	// commit and the end of a RestartK3s turn all read this one answer. A
	// restart of the control plane in this reconcile cannot end its turn
	// on it: the turn also needs a Node heartbeat from after the restart.
	d.controlPlaneErr = d.controlPlaneHealthy(ctx)
	if d.controlPlaneErr != nil {
		v.requeue(d.t.APIRetry)
	}

	d.syncConfig(ctx, v)
	d.syncRelease(ctx, v)
	d.plan(v)
	d.syncK3sTurn(ctx, v)
	d.syncTurn(ctx, v)
	if err := d.syncCordon(ctx, v); err != nil {
		return 0, err
	}
	if err := d.writeStatus(ctx, v); err != nil {
		return 0, err
	}
	if d.mode == modeTrial {
		switch {
		case d.st.Trial.Failure != "":
		case !d.statusWrittenInBoot:
			d.trialWaitingFor = "liken-node could not write the Machine's status"
			if d.lastStatusErr != nil {
				d.trialWaitingFor += ": " + d.lastStatusErr.Error()
			}
		default:
			ready, why := readySince(node, d.o.Boot.BootID, d.o.Boot.BootedAt.Truncate(time.Second), "this boot", d.o.Boot.BootedAt)
			if !ready {
				d.trialWaitingFor = why
				break
			}
			if err := d.controlPlaneErr; err != nil {
				d.trialWaitingFor = err.Error()
				v.requeue(d.t.APIRetry)
				break
			}
			if err := d.commitTrial(ctx, m, c); err != nil {
				return 0, err
			}
			return 0, d.writeAgain(ctx)
		}
	}
	return v.after, nil
}

// controlPlaneHealthy checks a leader's own control plane; nil on a
// machine that runs none.
func (d *Daemon) controlPlaneHealthy(ctx context.Context) error {
	if d.o.ControlPlane == nil {
		return nil
	}
	return d.o.ControlPlane.Check(ctx)
}

// writeAgain reports at once what just changed (after a commit).
func (d *Daemon) writeAgain(_ context.Context) error {
	d.enqueue()
	return nil
}

// syncConfig applies Live and RestartK3s changes and stages the NextBoot
// and Reboot ones for the next boot. Call with d.mu held.
func (d *Daemon) syncConfig(ctx context.Context, v *view) {
	log := klog.FromContext(ctx)
	v.desired = changes.Desired(v.m, v.c)
	if d.st.Applied == nil {
		// The first configuration of this machine: what the Machine and
		// the Cluster say is what its first boot applies, but for the node
		// agent's settings: the agent started before liken-node with none,
		// and restarts for them below (a leader in its turn).
		cfg := v.desired
		first := changes.Merge(cfg, changes.Config{}, likenv1.ClassRestartK3s)
		err := d.o.Applier.StageBoot(ctx, cfg, changes.Diff(changes.Config{}, cfg))
		if err == nil {
			err = d.o.Applier.Boot(ctx, first)
		}
		if err != nil {
			d.configFailed(ctx, v, "first configuration", err)
			return
		}
		if err := d.update(func(st *diskState) { st.Applied, st.NextBoot = &first, &cfg }); err != nil {
			d.configFailed(ctx, v, "first configuration", err)
			return
		}
		log.Info("First configuration applied")
	}
	if v.now.Before(d.configRetryAt) {
		v.requeue(d.configRetryAt.Sub(v.now))
		d.pendingConfig(v)
		return
	}
	if d.bootErr != nil {
		// What this boot should have applied is not in effect: apply it
		// again before anything else, and stay Degraded until it holds.
		if err := d.o.Applier.Boot(ctx, *d.st.Applied); err != nil {
			d.configFailed(ctx, v, "applying the configuration at boot", err)
			return
		}
		d.bootErr = nil
		log.Info("Applied the configuration at boot after a retry")
	}
	d.clearK3sFailure(ctx, v)
	applied := *d.st.Applied
	diff := changes.Diff(applied, v.desired)
	// Live changes wait while k3s restarts in its turn: they would write
	// the registry mirrors' files from the configuration k3s ran before.
	if live := changes.Only(diff, likenv1.ClassLive); len(live) > 0 && d.k3sHeld() == nil {
		cfg := changes.Merge(applied, v.desired, likenv1.ClassLive)
		if err := d.o.Applier.ApplyLive(ctx, cfg, live); err != nil {
			d.configFailed(ctx, v, "live change of "+strings.Join(changes.Paths(live), ", "), err)
			return
		}
		if err := d.update(func(st *diskState) { st.Applied = &cfg }); err != nil {
			d.configFailed(ctx, v, "live change", err)
			return
		}
		applied = cfg
		log.Info("Applied live changes", "fields", changes.Paths(live))
		d.event(v.m, v.c, "Normal", ReasonConfigApplied, "ApplyLive", "Applied %s live", strings.Join(changes.Paths(live), ", "))
	}
	// RestartK3s changes wait for a turn on every machine (syncK3sTurn):
	// a restart that does not bring the node back takes it out of the
	// fleet, and a leader's takes its datastore member down.
	nb := *d.st.Applied
	if d.st.NextBoot != nil {
		nb = *d.st.NextBoot
	}
	if boot := changes.Only(changes.Diff(nb, v.desired), likenv1.ClassNextBoot, likenv1.ClassReboot); len(boot) > 0 {
		cfg := changes.Merge(nb, v.desired, likenv1.ClassNextBoot, likenv1.ClassReboot)
		if err := d.o.Applier.StageBoot(ctx, cfg, boot); err != nil {
			d.configFailed(ctx, v, "staging "+strings.Join(changes.Paths(boot), ", ")+" for the next boot", err)
			return
		}
		if err := d.update(func(st *diskState) { st.NextBoot = &cfg }); err != nil {
			d.configFailed(ctx, v, "staging for the next boot", err)
			return
		}
		log.Info("Staged changes for the next boot", "fields", changes.Paths(boot))
	}
	d.configErr = nil
	d.configBackoff = 0
	d.pendingConfig(v)
}

func (d *Daemon) pendingConfig(v *view) {
	if d.st.Applied == nil {
		return
	}
	diff := changes.Diff(*d.st.Applied, v.desired)
	v.rebootCfg = changes.Only(diff, likenv1.ClassReboot)
	v.nextBoot = changes.Only(diff, likenv1.ClassNextBoot)
	v.k3s = changes.Only(diff, likenv1.ClassRestartK3s)
	if len(v.k3s) == 0 && d.st.K3sRestartDue {
		// What k3s runs is not known: restart it with what is declared.
		v.k3s = []changes.Change{{Field: changes.FieldK3sArgs, Class: likenv1.ClassRestartK3s, Value: "restart-due"}}
	}
}

func (d *Daemon) configFailed(ctx context.Context, v *view, what string, err error) {
	klog.FromContext(ctx).Error(err, "Applying a configuration change failed; retrying with backoff", "what", what)
	first := d.configErr == nil
	d.configErr = fmt.Errorf("%s: %w", what, err)
	d.configBackoff = min(max(2*d.configBackoff, d.t.RetryMin), d.t.RetryMax)
	d.configRetryAt = v.now.Add(d.configBackoff)
	v.requeue(d.configBackoff)
	if first {
		d.event(v.m, v.c, "Warning", ReasonApplyFailed, "Apply", "Could not apply %s: %v. Correct the value in the Machine or Cluster; liken retries", what, err)
	}
	d.pendingConfig(v)
}

// plan works out the pending changes and the change identifier.
// Call with d.mu held.
func (d *Daemon) plan(v *view) {
	// The API server keeps a metav1.Time to the second: a time with more
	// precision would never compare equal to what it stores, and every
	// sync would write the status again.
	since := func(field, value string) metav1.Time {
		if s, ok := d.st.PendingSince[field]; ok && s.Value == value {
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
	if r := v.m.Annotations[likenv1.AnnotationRequestReboot]; r != "" && r != d.st.ObservedRebootRequest {
		v.request = r
		add(changes.FieldRebootRequest, likenv1.ClassReboot, r)
		ids = append(ids, "request="+r)
	}
	// RestartK3s changes are listed; they ask for a turn of their own
	// only when nothing waits for a reboot (the reboot turn goes first,
	// and they ask after it).
	rebootAsk := len(ids) > 0
	for _, c := range v.k3s {
		add(c.Field, c.Class, c.Value)
		if !rebootAsk {
			ids = append(ids, c.Field+"="+c.Value)
		}
	}
	v.k3sTurn = !rebootAsk && len(v.k3s) > 0
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
	if !equalSince(wanted, d.st.PendingSince) {
		if err := d.update(func(st *diskState) { st.PendingSince = wanted }); err != nil {
			klog.Background().Error(err, "Recording when changes were staged")
		}
	}
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
// Call with d.mu held.
func (d *Daemon) degraded(v *view) string {
	switch {
	case d.mode == modeConfused:
		return d.confusion
	case v.target == nil && v.c.Spec.Version != "" && v.c.Spec.Version != d.o.Boot.Version:
		return fmt.Sprintf("the Cluster's version %s is not in its releases.catalog, so the machine cannot verify it: add its catalog entry (version and digest) or set spec.version back", v.c.Spec.Version)
	case v.failedTrial != nil:
		return "the trial of release " + v.failedTrial.Version + " failed: " + v.failedTrial.Reason
	case d.slotErr != nil:
		return d.slotErr.Error() + "; liken-node tries again at its next start"
	case d.configErr != nil:
		return d.configErr.Error()
	case d.st.K3sFailure != nil:
		msg := d.st.K3sFailure.message(v.c.Name)
		if t := d.k3sHeld(); t != nil && t.RolledBack && d.k3sWaitingFor != "" {
			msg += "; waiting for the node to be Ready again: " + d.k3sWaitingFor
		}
		return msg
	}
	return ""
}

// asking tells whether the machine asks for a turn now.
func (d *Daemon) asking(v *view) bool {
	return v.change != "" && d.mode == modeNormal && !v.downloading && d.degraded(v) == ""
}

// syncCordon lifts a cordon liken left behind when no turn is under way:
// after the turn's reboot, after a failed trial, or after a turn was taken
// back. A node someone else cordoned is never touched.
func (d *Daemon) syncCordon(ctx context.Context, v *view) error {
	if v.node == nil || d.turn != nil || d.turnsRunning > 0 || d.st.Turn != nil || d.mode == modeTrial {
		return nil
	}
	if _, ours := v.node.Annotations[likenv1.AnnotationCordoned]; !ours {
		return nil
	}
	_, err := drain.Uncordon(ctx, d.o.Kube, d.o.Machine)
	return err
}
