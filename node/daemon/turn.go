package daemon

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/rules"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/release"
)

// turnHandle is the turn running in its own goroutine.
type turnHandle struct {
	change  string
	release *release.Target
	slot    string
	request string
	cancel  context.CancelFunc
	// aborted is set under d.mu when the turn is taken back; the goroutine
	// checks it under d.mu before it arms the trial and before it reboots.
	aborted bool
	// from is the cache's Cluster (never changed) that granted the turn.
	from *likenv1.Cluster
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

// syncTurn starts the turn the ledger grants, or gives back one that is no
// longer granted or no longer matches what is staged. Call with d.mu held.
func (d *Daemon) syncTurn(ctx context.Context, v *view) {
	log := klog.FromContext(ctx)
	entry := ledgerEntry(v.c, d.o.Machine)
	granted := func(change string) bool { return entry != nil && change != "" && entry.Change == change }

	if h := d.turn; h != nil {
		if granted(h.change) && v.change == h.change {
			return
		}
		why := "the turn left the Cluster's ledger"
		if entry != nil && entry.Change != h.change {
			why = "the ledger now names another change"
		} else if v.change != h.change {
			why = "what is staged changed before the reboot"
		}
		log.Info("Giving back the turn before the reboot", "change", h.change, "why", why)
		h.aborted = true
		h.cancel()
		d.turn = nil
		d.drainBlocked = nil
		d.dropTurnRecord(ctx)
		d.event(v.m, v.c, "Normal", ReasonTurnTakenBack, "GiveBack", "Gave back the turn for change %s before rebooting (%s); the node is uncordoned if liken cordoned it, and the machine waits again", h.change, why)
		return
	}
	if t := d.st.Turn; t != nil && t.K3s != nil {
		return // a RestartK3s turn: syncK3sTurn's
	}
	if d.staleLedger != nil {
		if v.c == d.staleLedger {
			return // the API server no longer grants what this copy does
		}
		d.staleLedger = nil
	}
	if t := d.st.Turn; t != nil && t.BootID == d.o.Boot.BootID {
		// A turn this boot started before the daemon restarted.
		if !granted(t.Change) || v.change != t.Change || d.mode != modeNormal {
			log.Info("Dropping the turn a previous run started: it is no longer granted or no longer matches", "change", t.Change, "now", v.change, "ledger", entry, "mode", d.modeName())
			d.dropTurnRecord(ctx)
			return
		}
		log.Info("Resuming the turn a previous run started", "change", t.Change)
		d.event(v.m, v.c, "Normal", ReasonTurnResumed, "TakeTurn", "Resumed the turn for change %s that liken-node started before it restarted", t.Change)
		d.startTurn(ctx, v, false)
		return
	}
	if !d.asking(v) || !granted(v.change) || v.k3sTurn {
		return
	}
	if !rules.Cleared(v.m, v.change) {
		log.Info("The ledger lists a turn, but the change is not approved; waiting for liken approve-reboot", "change", v.change)
		return
	}
	d.startTurn(ctx, v, true)
}

// dropTurnRecord forgets a turn that did not reboot, and disarms a trial
// it armed. Call with d.mu held.
func (d *Daemon) dropTurnRecord(ctx context.Context) {
	log := klog.FromContext(ctx)
	armed := d.st.Trial != nil && d.st.Trial.ArmedBootID == d.o.Boot.BootID
	if armed {
		if err := d.o.Bootloader.DisarmTrial(); err != nil {
			log.Error(err, "Disarming the trial of a turn given back failed; the next boot may try the staged slot once")
		}
	}
	if err := d.update(func(st *diskState) {
		st.Turn = nil
		if armed {
			st.Trial = nil
		}
	}); err != nil {
		log.Error(err, "Forgetting the turn given back")
	}
}

// startTurn records the turn on disk and runs it. Call with d.mu held.
func (d *Daemon) startTurn(ctx context.Context, v *view, fresh bool) {
	log := klog.FromContext(ctx).WithValues("change", v.change)
	h := &turnHandle{change: v.change, request: v.request, from: v.c}
	if v.staged {
		t := *v.target
		h.release, h.slot = &t, d.slots.Other()
	}
	if fresh {
		rec := &turnRecord{Change: h.change, Release: h.release, Slot: h.slot, RebootRequest: h.request, BootID: d.o.Boot.BootID, StartedAt: v.now}
		if err := d.update(func(st *diskState) { st.Turn = rec }); err != nil {
			log.Error(err, "Recording the turn failed; not starting it")
			return
		}
		what := "a reboot"
		if h.release != nil {
			what = "release " + h.release.Version
		}
		log.Info("Turn granted; cordoning, draining and rebooting", "for", what)
		d.event(v.m, v.c, "Normal", ReasonTurnStarted, "TakeTurn", "Took the turn for change %s (%s): cordon, drain, reboot", h.change, what)
	}
	tctx, cancel := context.WithCancel(ctx)
	h.cancel = cancel
	d.turn = h
	d.turnsRunning++
	m, c := v.m.DeepCopy(), v.c.DeepCopy()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() {
			d.mu.Lock()
			d.turnsRunning--
			d.downWaitingFor = ""
			if d.turn == h {
				// Ended without rebooting: the next reconcile decides
				// again from the ledger and the turn record.
				d.turn = nil
			}
			d.mu.Unlock()
			d.enqueue()
		}()
		d.runTurn(klog.NewContext(tctx, log), h, m, c)
	}()
}

// wait sleeps for the API retry interval; false when ctx ended.
func (d *Daemon) wait(ctx context.Context, dur time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-d.clock.After(dur):
		return true
	}
}

// awaitDatastore returns true once a leader's etcd member may go down for
// what (SafeToStop; at once on a machine that runs no control plane), or
// false when ctx ended first. While it may not, the Machine says why and
// an event says so each time the reason changes; the turn is kept.
func (d *Daemon) awaitDatastore(ctx context.Context, h *turnHandle, m *likenv1.Machine, c *likenv1.Cluster, what string) bool {
	if d.o.ControlPlane == nil {
		return true
	}
	log := klog.FromContext(ctx)
	last := ""
	for {
		err := d.o.ControlPlane.SafeToStop(ctx)
		if ctx.Err() != nil {
			return false
		}
		d.mu.Lock()
		if err == nil {
			d.downWaitingFor = ""
			d.mu.Unlock()
			if last != "" {
				log.Info("The datastore keeps its majority without this leader now", "for", what)
				d.enqueue()
			}
			return true
		}
		d.downWaitingFor = err.Error()
		if err.Error() != last && !h.aborted {
			log.Info("Not going down yet: the datastore would lose its majority", "for", what, "reason", err.Error())
			d.event(m, c, "Warning", ReasonWaitingForDatastore, "Wait", "%s for change %s waits: %v", what, h.change, err)
		}
		d.mu.Unlock()
		if err.Error() != last {
			d.enqueue()
			last = err.Error()
		}
		if !d.wait(ctx, d.t.APIRetry) {
			return false
		}
	}
}

// ledgerGrants reads the Cluster from the API server, not the cache,
// retrying until it answers, and says whether its ledger still grants h's
// change to this machine, before the irreversible step named by before;
// false also when ctx ended. When the API server no longer grants the
// turn, no turn starts again from the cached Cluster that granted it
// (staleLedger) until the cache delivers a newer one, which ends the turn.
func (d *Daemon) ledgerGrants(ctx context.Context, h *turnHandle, c *likenv1.Cluster, before string) (*likenv1.Cluster, bool) {
	log := klog.FromContext(ctx)
	for {
		cl, err := d.o.Liken.LikenV1alpha1().Clusters().Get(ctx, c.Name, metav1.GetOptions{})
		if err == nil {
			if e := ledgerEntry(cl, d.o.Machine); e == nil || e.Change != h.change {
				log.Info("The turn is no longer in the Cluster's ledger; stopping until the cache has caught up", "before", before)
				d.mu.Lock()
				d.staleLedger = h.from
				d.mu.Unlock()
				return nil, false
			}
			return cl, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		log.Error(err, "Reading the Cluster's ledger failed; retrying", "before", before)
		if !d.wait(ctx, d.t.APIRetry) {
			return nil, false
		}
	}
}

// runTurn cordons, drains, re-checks the staged slot, arms the trial and
// reboots. It stops as soon as ctx ends (the turn was given back). The
// ledger is the only truth: it is read from the API server before the
// cordon and again right before the trial is armed and the machine
// reboots, since a take-back may not have reached the cache.
func (d *Daemon) runTurn(ctx context.Context, h *turnHandle, m *likenv1.Machine, c *likenv1.Cluster) {
	log := klog.FromContext(ctx)
	if _, ok := d.ledgerGrants(ctx, h, c, "the cordon"); !ok {
		return
	}
	for {
		if _, err := drain.Cordon(ctx, d.o.Kube, d.o.Machine, h.change); err == nil {
			break
		} else if ctx.Err() == nil {
			log.Error(err, "Cordoning failed; retrying")
		}
		if !d.wait(ctx, d.t.APIRetry) {
			return
		}
	}
	timeout := c.Spec.Disruption.DrainTimeoutOrDefault()
	err := drain.Run(ctx, drain.Options{
		Client: d.o.Kube, Node: d.o.Machine, Clock: d.clock, Timeout: timeout,
		Poll: d.t.DrainPoll, RetryMin: d.t.EvictRetryMin, RetryMax: d.t.EvictRetryMax,
		OnBlocked: func(b drain.Blocked) {
			msg := b.Message(d.o.Machine, timeout)
			log.Info("Drain blocked", "pods", b.Pods, "budgets", b.PDBs)
			d.mu.Lock()
			if !h.aborted {
				d.drainBlocked = &b
				d.event(m, c, "Warning", ReasonDrainBlocked, "Drain", "%s", msg)
			}
			d.mu.Unlock()
			d.enqueue()
		},
	})
	if err != nil {
		return
	}
	d.mu.Lock()
	d.drainBlocked = nil
	var sent []<-chan struct{}
	if !h.aborted {
		sent = append(sent, d.sink.expect(ReasonDrained))
		d.event(m, c, "Normal", ReasonDrained, "Drain", "Node %s drained", d.o.Machine)
	}
	d.mu.Unlock()
	d.enqueue()

	trial := false
	if h.release != nil {
		if _, err := d.slots.Recheck(ctx, h.slot); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error(err, "The staged slot does not match its release any more; rebooting without a trial", "slot", h.slot)
			d.mu.Lock()
			d.event(m, c, "Warning", ReasonSlotRecheckFailed, "Recheck", "Slot %s no longer matches release %s (%v): rebooting without a trial; the machine stays on its proven slot and downloads the release again", h.slot, h.release.Version, err)
			d.mu.Unlock()
		} else {
			trial = true
		}
	}

	// A leader goes down only while the datastore keeps its majority
	// without it, asked as the last step before the trial is armed and
	// the machine reboots: the operator granted the turn from a view that
	// may be as old as the drain. While it waits, a turn taken back ends
	// ctx.
	if !d.awaitDatastore(ctx, h, m, c, "the reboot") {
		return
	}
	cl, ok := d.ledgerGrants(ctx, h, c, "the reboot")
	if !ok {
		return
	}
	c = cl

	d.mu.Lock()
	if h.aborted || ctx.Err() != nil {
		d.mu.Unlock()
		return
	}
	if trial {
		// The record first (marked Arming), then the flag, then the mark
		// cleared: a power cut at any point leaves either no flag and a
		// record the next boot drops, or a flag and a record for it.
		rec := &trialRecord{Slot: h.slot, Version: h.release.Version, Digest: h.release.Digest,
			Timeout: Duration(c.Spec.Disruption.TrialTimeoutOrDefault()), ArmedAt: d.clock.Now(), ArmedBootID: d.o.Boot.BootID,
			Resume: c.Annotations[likenv1.AnnotationResumeRollout], Arming: true}
		if err := d.update(func(st *diskState) { st.Trial = rec }); err != nil {
			d.mu.Unlock()
			log.Error(err, "Recording the trial failed; not rebooting")
			return
		}
		if err := d.o.Bootloader.ArmTrial(boot.Slot(h.slot)); err != nil {
			if derr := d.o.Bootloader.DisarmTrial(); derr != nil {
				log.Error(derr, "Withdrawing the trial that could not be armed failed; the next write repairs it")
			}
			_ = d.update(func(st *diskState) { st.Trial = nil })
			d.mu.Unlock()
			log.Error(err, "Arming the trial failed; not rebooting")
			return
		}
		if err := d.update(func(st *diskState) { st.Trial.Arming = false }); err != nil {
			if derr := d.o.Bootloader.DisarmTrial(); derr != nil {
				log.Error(derr, "Withdrawing the trial whose record could not be written failed")
			}
			_ = d.update(func(st *diskState) { st.Trial = nil })
			d.mu.Unlock()
			log.Error(err, "Recording the armed trial failed; not rebooting")
			return
		}
		sent = append(sent, d.sink.expect(ReasonTrialArmed))
		d.event(m, c, "Normal", ReasonTrialArmed, "ArmTrial", "Slot %s re-checked against release %s; the next boot tries it once", h.slot, h.release.Version)
	}
	if err := d.update(func(st *diskState) {
		if st.Turn != nil {
			st.Turn.Rebooted = true
		}
	}); err != nil {
		log.Error(err, "Recording the reboot")
	}
	d.rebooting = true
	what := "with no trial"
	if trial {
		what = fmt.Sprintf("into a trial of release %s in slot %s", h.release.Version, h.slot)
	}
	sent = append(sent, d.sink.expect(ReasonRebooting))
	d.event(m, c, "Normal", ReasonRebooting, "Reboot", "Rebooting %s for change %s", what, h.change)
	d.mu.Unlock()
	// Events are sent in the background: let the turn's last ones reach
	// the API server before the machine goes down.
	d.awaitSent(ctx, sent...)
	log.Info("Rebooting", "trial", trial)
	if err := d.reboot(ctx); err != nil {
		log.Error(err, "The reboot failed; trying again")
		d.mu.Lock()
		d.rebooting = false
		d.mu.Unlock()
		d.wait(ctx, d.t.APIRetry)
	}
}
