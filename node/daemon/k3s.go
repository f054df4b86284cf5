package daemon

import (
	"context"
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

// syncK3sTurn runs a leader's RestartK3s turn, each step on disk before
// the next so that a restart or a power cut resumes or asks again
// (docs/design/protocol.md#a-leader-restarts-k3s-in-its-turn). Call with d.mu held.
func (d *Daemon) syncK3sTurn(ctx context.Context, v *view) {
	log := klog.FromContext(ctx)
	entry := ledgerEntry(v.c, d.o.Machine)
	t := d.k3sHeld()
	if t == nil {
		if d.st.Turn != nil || d.turn != nil || d.turnsRunning > 0 || !v.k3sTurn || !d.asking(v) ||
			entry == nil || entry.Change != v.change {
			return
		}
		cfg := changes.Merge(*d.st.Applied, v.desired, likenv1.ClassRestartK3s)
		rec := &turnRecord{Change: v.change, K3s: &cfg, BootID: d.o.Boot.BootID, StartedAt: v.now}
		if err := d.update(func(st *diskState) { st.Turn = rec }); err != nil {
			log.Error(err, "Recording the leader turn failed; not restarting k3s")
			return
		}
		fields := strings.Join(changes.Paths(v.k3s), ", ")
		log.Info("Leader turn granted; restarting k3s in place", "change", v.change, "fields", fields)
		d.event(v.m, v.c, "Normal", ReasonTurnStarted, "TakeTurn", "Took the leader turn for change %s: restarting k3s in place for %s (no cordon, no drain, no reboot)", v.change, fields)
		t = rec
	}
	if t.RestartedAt.IsZero() {
		if entry == nil || entry.Change != t.Change {
			// Taken back or released before the restart was confirmed: k3s
			// may run either configuration, so a turn restarts it again.
			log.Info("The leader turn left the ledger before the restart of k3s was confirmed; asking for another", "change", t.Change)
			d.downWaitingFor = ""
			if err := d.update(func(st *diskState) { st.Turn, st.K3sRestartDue = nil, true }); err != nil {
				log.Error(err, "Forgetting the leader turn given back")
			}
			d.event(v.m, v.c, "Normal", ReasonTurnTakenBack, "GiveBack", "The leader turn for change %s left the Cluster's ledger before the restart of k3s was confirmed; the machine asks for another turn to restart k3s with the declared configuration", t.Change)
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
			log.Info("The leader turn is no longer in the ledger; not restarting k3s", "change", t.Change)
			v.requeue(d.t.APIRetry)
			return
		}
		// The restart takes this leader's etcd member down for a moment:
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
		what := strings.Join(changes.Paths(changed), ", ")
		if what == "" {
			what = "the declared configuration"
		}
		began := d.clock.Now()
		if err := d.o.Applier.RestartK3s(ctx, cfg, changed); err != nil {
			d.configFailed(ctx, v, "k3s restart for "+what+" in the leader turn", err)
			return
		}
		if err := d.update(func(st *diskState) {
			st.Applied = &cfg
			st.Turn.K3s = &cfg
			st.Turn.RestartedAt = began
			st.K3sRestartDue = false
		}); err != nil {
			d.configFailed(ctx, v, "recording the k3s restart", err)
			return
		}
		t = d.st.Turn
		log.Info("Restarted k3s in the leader turn; waiting for the node to be Ready again", "fields", what)
		d.event(v.m, v.c, "Normal", ReasonK3sRestarted, "RestartK3s", "Restarted k3s in place for %s in the leader turn for change %s; pods kept running. The turn ends once the node is Ready again", what, t.Change)
		d.replan(v)
	}
	// A heartbeat in a later second than the restart (the API server keeps
	// them to the second).
	ready, why := readySince(v.node, d.o.Boot.BootID, t.RestartedAt.Truncate(time.Second).Add(time.Second), "the restart of k3s", t.RestartedAt)
	if !ready {
		d.k3sWaitingFor = why
		v.requeue(d.t.APIRetry)
		return
	}
	// A leader's control plane restarted with the node agent: the turn
	// ends only once it is back, or the next leader's turn could take a
	// second member of the datastore down.
	if err := d.controlPlaneErr; err != nil {
		d.k3sWaitingFor = err.Error()
		v.requeue(d.t.APIRetry)
		return
	}
	if err := d.update(func(st *diskState) { st.Turn = nil }); err != nil {
		log.Error(err, "Ending the leader turn")
		return
	}
	d.k3sWaitingFor = ""
	log.Info("k3s is back after its restart; the leader turn is over", "change", t.Change)
	d.event(v.m, v.c, "Normal", ReasonK3sBack, "EndTurn", "The node is Ready again after the restart of k3s; the leader turn for change %s is over", t.Change)
	d.replan(v)
}

// replan works out the pending changes again after the state changed
// within a reconcile. Call with d.mu held.
func (d *Daemon) replan(v *view) {
	v.pending, v.change, v.request, v.k3sTurn = nil, "", "", false
	d.pendingConfig(v)
	d.plan(v)
}
