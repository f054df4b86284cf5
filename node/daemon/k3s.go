package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// k3sHeld is the RestartK3s turn this boot holds, or nil. Call with d.mu
// held.
func (d *Daemon) k3sHeld() *turnRecord {
	if t := d.st.Turn; t != nil && t.K3s != nil && t.BootID == d.o.Boot.BootID {
		return t
	}
	return nil
}

// syncK3sTurn runs a RestartK3s turn, each step on disk before the next
// so that a restart of liken-node resumes it and a power cut leaves k3s
// on the configuration it ran before
// (docs/design/protocol.md#a-machine-restarts-k3s-in-its-turn). The new
// configuration is on trial until the Node is Ready again; past the
// Cluster's trial timeout, k3s restarts with Applied and the machine
// reports the failure. Call with d.mu held.
func (d *Daemon) syncK3sTurn(ctx context.Context, v *view) {
	log := klog.FromContext(ctx)
	entry := ledgerEntry(v.c, d.o.Machine)
	timeout := v.c.Spec.Disruption.TrialTimeoutOrDefault()
	t := d.k3sHeld()
	if t == nil {
		if d.st.Turn != nil || d.turn != nil || d.turnsRunning > 0 || !v.k3sTurn || !d.asking(v) ||
			entry == nil || entry.Change != v.change {
			return
		}
		cfg := changes.Merge(*d.st.Applied, v.desired, likenv1.ClassRestartK3s)
		rec := &turnRecord{Change: v.change, K3s: &cfg, BootID: d.o.Boot.BootID, StartedAt: v.now}
		if err := d.update(func(st *diskState) { st.Turn = rec }); err != nil {
			log.Error(err, "Recording the RestartK3s turn failed; not restarting k3s")
			return
		}
		fields := fieldsOrConfig(changes.Paths(v.k3s))
		log.Info("RestartK3s turn granted; restarting k3s in place", "change", v.change, "fields", fields)
		d.event(v.m, v.c, "Normal", ReasonTurnStarted, "TakeTurn", "Took the turn for change %s: restarting k3s in place for %s (no cordon, no drain, no reboot); the node must be Ready again within %s, or k3s restarts with the configuration it ran before", v.change, fields, timeout)
		t = rec
	}
	if t.RestartedAt.IsZero() {
		if entry == nil || entry.Change != t.Change {
			// Taken back or released before the restart was confirmed: k3s
			// may run either configuration, so a turn restarts it again.
			log.Info("The RestartK3s turn left the ledger before the restart of k3s was confirmed; asking for another", "change", t.Change)
			d.downWaitingFor = ""
			if err := d.update(func(st *diskState) { st.Turn, st.K3sRestartDue = nil, true }); err != nil {
				log.Error(err, "Forgetting the RestartK3s turn given back")
			}
			d.event(v.m, v.c, "Normal", ReasonTurnTakenBack, "GiveBack", "The turn for change %s left the Cluster's ledger before the restart of k3s was confirmed; the machine asks for another turn to restart k3s with the declared configuration", t.Change)
			d.replan(v)
			return
		}
		if d.configErr != nil {
			// The last restart failed: retried once the backoff is over
			// (syncConfig clears the error), still holding the turn.
			return
		}
		// The ledger is the only truth: read it from the API server, not
		// the cache, right before k3s goes down.
		cl, err := d.o.Liken.LikenV1alpha1().Clusters().Get(ctx, v.c.Name, metav1.GetOptions{})
		if err != nil {
			log.Error(err, "Reading the Cluster before restarting k3s failed; retrying")
			v.requeue(d.t.APIRetry)
			return
		}
		if e := ledgerEntry(cl, d.o.Machine); e == nil || e.Change != t.Change {
			// The cache is behind; its update brings the next reconcile.
			log.Info("The RestartK3s turn is no longer in the ledger; not restarting k3s", "change", t.Change)
			v.requeue(d.t.APIRetry)
			return
		}
		// On a leader the restart takes its etcd member down for a moment:
		// only while the datastore keeps its majority without it.
		if d.o.ControlPlane != nil {
			if err := d.o.ControlPlane.SafeToStop(ctx); err != nil {
				if err.Error() != d.downWaitingFor {
					log.Info("Not restarting k3s yet: the datastore would lose its majority", "change", t.Change, "reason", err.Error())
					d.event(v.m, v.c, "Warning", ReasonWaitingForDatastore, "Wait", "the restart of k3s for change %s waits: %v", t.Change, err)
				}
				d.downWaitingFor = err.Error()
				v.requeue(d.t.APIRetry)
				return
			}
			d.downWaitingFor = ""
		}
		cfg := changes.Merge(*d.st.Applied, v.desired, likenv1.ClassRestartK3s)
		changed := changes.Only(changes.Diff(*d.st.Applied, cfg), likenv1.ClassRestartK3s)
		what := fieldsOrConfig(changes.Paths(changed))
		began := d.clock.Now()
		if err := d.o.Applier.RestartK3s(ctx, cfg, changed); err != nil {
			d.configFailed(ctx, v, "k3s restart for "+what+" in the turn", err)
			return
		}
		// Applied stays what k3s ran before: the new configuration is on
		// trial, and a boot after a power cut starts k3s with Applied.
		if err := d.update(func(st *diskState) {
			st.Turn.K3s = &cfg
			st.Turn.RestartedAt = began
			st.K3sRestartDue = false
		}); err != nil {
			d.configFailed(ctx, v, "recording the k3s restart", err)
			return
		}
		t = d.st.Turn
		log.Info("Restarted k3s in the turn; waiting for the node to be Ready again", "fields", what, "timeout", timeout)
		d.event(v.m, v.c, "Normal", ReasonK3sRestarted, "RestartK3s", "Restarted k3s in place for %s in the turn for change %s; pods kept running. The turn ends once the node is Ready again; after %s, k3s restarts with the configuration it ran before", what, t.Change, timeout)
		d.replan(v)
	}
	if d.configErr != nil {
		// The restart back to Applied failed: retried after the backoff.
		return
	}
	// A heartbeat in a later second than the restart (the API server keeps
	// them to the second). A leader's control plane restarted with the
	// node agent: the turn ends only once it is back, or the next leader's
	// turn could take a second member of the datastore down.
	ready, why := readySince(v.node, d.o.Boot.BootID, t.RestartedAt.Truncate(time.Second).Add(time.Second), "the restart of k3s", t.RestartedAt)
	if ready && d.controlPlaneErr != nil {
		ready, why = false, d.controlPlaneErr.Error()
	}
	if !ready {
		d.k3sWaitingFor = why
		left := t.RestartedAt.Add(timeout).Sub(v.now)
		switch {
		case t.RolledBack:
			// k3s runs what it ran before; the stall timeout names a
			// machine that does not come back even so.
			v.requeue(d.t.APIRetry)
			return
		case left > 0:
			v.requeue(min(d.t.APIRetry, left))
			return
		}
		d.rollBackK3s(ctx, v, t, why, timeout)
		return
	}
	if err := d.update(func(st *diskState) {
		if !t.RolledBack {
			cfg := changes.Merge(*st.Applied, *t.K3s, likenv1.ClassRestartK3s)
			st.Applied = &cfg
		}
		st.Turn = nil
	}); err != nil {
		log.Error(err, "Ending the RestartK3s turn")
		return
	}
	d.k3sWaitingFor = ""
	if t.RolledBack {
		log.Info("k3s is back on the configuration it ran before; the turn is over", "change", t.Change)
		d.event(v.m, v.c, "Normal", ReasonK3sBack, "EndTurn", "The node is Ready again on the configuration k3s ran before; the turn for change %s is over, and the machine reports the failed value until it changes", t.Change)
	} else {
		log.Info("k3s is back after its restart; the turn is over", "change", t.Change)
		d.event(v.m, v.c, "Normal", ReasonK3sBack, "EndTurn", "The node is Ready again after the restart of k3s; the turn for change %s is over", t.Change)
	}
	d.replan(v)
}

// rollBackK3s restarts k3s with the configuration it ran before the turn
// t, whose restart did not bring the Node back Ready within timeout, then
// records the failure and the restart in one write: a liken-node that
// restarts in between rolls back again, and a power cut boots with
// Applied either way. Call with d.mu held.
func (d *Daemon) rollBackK3s(ctx context.Context, v *view, t *turnRecord, why string, timeout time.Duration) {
	log := klog.FromContext(ctx)
	fields := changes.Paths(changes.Only(changes.Diff(*d.st.Applied, *t.K3s), likenv1.ClassRestartK3s))
	what := fieldsOrConfig(fields)
	began := d.clock.Now()
	if err := d.o.Applier.RestartK3s(ctx, *d.st.Applied, nil); err != nil {
		d.configFailed(ctx, v, "restarting k3s with the configuration it ran before "+what+" changed", err)
		return
	}
	f := &k3sFailure{Change: t.Change, Fields: fields, K3s: *t.K3s, Reason: why, Timeout: Duration(timeout), At: v.now,
		Resume: v.c.Annotations[likenv1.AnnotationResumeRollout]}
	if err := d.update(func(st *diskState) {
		st.Turn.RolledBack = true
		st.Turn.RestartedAt = began
		st.K3sFailure = f
	}); err != nil {
		d.configFailed(ctx, v, "recording the restart of k3s with the configuration it ran before", err)
		return
	}
	d.k3sWaitingFor = ""
	log.Info("k3s did not bring the node back Ready in time; restarted it with the configuration it ran before", "change", t.Change, "fields", what, "timeout", timeout, "reason", why)
	d.event(v.m, v.c, "Warning", likenv1.ReasonK3sRestartFailed, "RollBack", "%s", f.message(v.c.Name))
	d.replan(v)
}

// message says what failed and what to do, for the Machine's
// ConfigApplied condition and the event.
func (f *k3sFailure) message(cluster string) string {
	what := fieldsOrConfig(f.Fields)
	return fmt.Sprintf("the restart of k3s for %s (change %s) did not bring the node back Ready within %s (%s); liken restarted k3s with the configuration it ran before, and no other machine restarts k3s for this change. Correct %s in the Machine or Cluster %s, or run `liken rollout resume %s` to try the same value again",
		what, f.Change, time.Duration(f.Timeout), f.Reason, what, cluster, cluster)
}

// fieldsOrConfig names the fields a restart of k3s is for. A restart
// with no field that differs from Applied (k3s restarted again because a
// turn was given back before its restart was confirmed) names the
// declared configuration.
func fieldsOrConfig(fields []string) string {
	if len(fields) == 0 {
		return "the declared configuration"
	}
	return strings.Join(fields, ", ")
}

// clearK3sFailure forgets a failed restart of k3s once the declared
// configuration differs from the one that failed, or a person resumed the
// rollout. Call with d.mu held.
func (d *Daemon) clearK3sFailure(ctx context.Context, v *view) {
	f := d.st.K3sFailure
	if f == nil || d.st.Applied == nil {
		return
	}
	why := ""
	declared := changes.Merge(*d.st.Applied, v.desired, likenv1.ClassRestartK3s)
	switch {
	case len(changes.Only(changes.Diff(f.K3s, declared), likenv1.ClassRestartK3s)) > 0:
		why = "the declared value changed"
	case v.c.Annotations[likenv1.AnnotationResumeRollout] != f.Resume:
		why = "a person resumed the rollout"
	default:
		return
	}
	if err := d.update(func(st *diskState) { st.K3sFailure = nil }); err != nil {
		klog.FromContext(ctx).Error(err, "Forgetting the failed restart of k3s")
		return
	}
	klog.FromContext(ctx).Info("Forgetting the failed restart of k3s", "change", f.Change, "why", why)
}

// replan works out the pending changes again after the state changed
// within a reconcile. Call with d.mu held.
func (d *Daemon) replan(v *view) {
	v.pending, v.change, v.request, v.k3sTurn = nil, "", "", false
	d.pendingConfig(v)
	d.plan(v)
}
