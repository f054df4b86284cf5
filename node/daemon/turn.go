package daemon

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/release"
)

// This file holds what a turn's steps (act.go) share: the run of a reboot
// turn and its two actors, the drain and the re-check, which run in the
// background and report back; the ledger read from the API server; and a
// leader's question to its datastore.

// startRun makes r the reboot turn this liken-node runs; its actors stop
// when the run ends (endRun) or the daemon stops.
func (d *Daemon) startRun(ctx context.Context, r *turnRun) {
	rctx, cancel := context.WithCancel(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.run, d.runCtx, d.runCancel = r, rctx, cancel
}

// endRun ends the reboot turn this liken-node runs, stopping its actors.
func (d *Daemon) endRun() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.runCancel != nil {
		d.runCancel()
	}
	d.run, d.runCtx, d.runCancel = nil, nil, nil
	d.downWaitingFor = ""
}

// runStep records the progress of the reboot turn this liken-node runs.
func (d *Daemon) runStep(step func(r *turnRun)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.run != nil {
		step(d.run)
	}
}

// actor runs work in the background for the turn r; the work stops when
// the turn ends. It is counted until it returns: a turn given back ends
// only once its actors have stopped.
func (d *Daemon) actor(r *turnRun, work func(ctx context.Context)) {
	d.mu.Lock()
	if d.run != r || d.runCtx == nil {
		d.mu.Unlock()
		return
	}
	ctx := d.runCtx
	d.actors++
	d.mu.Unlock()
	d.wg.Go(func() {
		defer func() {
			d.mu.Lock()
			d.actors--
			d.mu.Unlock()
			d.enqueue()
		}()
		work(ctx)
	})
}

// markRun marks the turn under way, under the lock, as an actor starts
// for it, and returns it (nil when none is).
func (d *Daemon) markRun(mark func(*turnRun)) *turnRun {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.run != nil {
		mark(d.run)
	}
	return d.run
}

// startDrain drains the node in the background: a drain blocked past
// timeout is reported (condition and event) and goes on; nothing is
// forced.
func (d *Daemon) startDrain(ctx context.Context, f *facts, timeout time.Duration) {
	log := klog.FromContext(ctx)
	m, c := f.M.DeepCopy(), f.C.DeepCopy()
	r := d.markRun(func(r *turnRun) { r.Draining = true })
	d.actor(r, func(ctx context.Context) {
		err := drain.Run(ctx, drain.Options{
			Client: d.o.Kube, Node: d.o.Machine, Clock: d.clock, Timeout: timeout,
			Poll: d.t.DrainPoll, RetryMin: d.t.EvictRetryMin, RetryMax: d.t.EvictRetryMax,
			OnBlocked: func(b drain.Blocked) {
				log.Info("Drain blocked", "pods", b.Pods, "budgets", b.PDBs)
				d.mu.Lock()
				if d.run == r {
					r.Blocked = &b
					d.event(m, c, "Warning", ReasonDrainBlocked, "Drain", "%s", b.Message(d.o.Machine, timeout))
				}
				d.mu.Unlock()
				d.enqueue()
			},
		})
		if err != nil {
			return // the turn was given back
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.run == r {
			r.Draining, r.Drained, r.Blocked = false, true, nil
			r.sent = append(r.sent, d.sink.expect(ReasonDrained))
			d.event(m, c, "Normal", ReasonDrained, "Drain", "Node %s drained", d.o.Machine)
		}
	})
}

// startRecheck re-checks the staged slot against its release in the
// background, reading from the disk: a slot that no longer matches is
// rebooted into without a trial, and downloaded again.
func (d *Daemon) startRecheck(ctx context.Context, f *facts, slot string, target release.Target) {
	log := klog.FromContext(ctx)
	m, c := f.M.DeepCopy(), f.C.DeepCopy()
	r := d.markRun(func(r *turnRun) { r.Rechecking = true })
	d.actor(r, func(ctx context.Context) {
		_, err := d.slots.Recheck(ctx, slot)
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.run != r {
			return
		}
		r.Rechecking, r.Rechecked, r.TrialOK = false, true, err == nil
		if err != nil {
			log.Error(err, "The staged slot does not match its release any more; rebooting without a trial", "slot", slot)
			d.event(m, c, "Warning", ReasonSlotRecheckFailed, "Recheck", "Slot %s no longer matches release %s (%v): rebooting without a trial; the machine stays on its proven slot and downloads the release again", slot, target.Version, err)
		}
	})
}

// disarmOwnTrial withdraws a trial this boot armed (a turn whose reboot
// failed), keeping the turn, and puts back the kernel arguments in effect.
func (d *Daemon) disarmOwnTrial(ctx context.Context) error {
	d.mu.Lock()
	armed := d.st.Trial != nil && d.st.Trial.ArmedBootID == d.o.Boot.BootID
	d.mu.Unlock()
	if armed {
		if err := d.o.Bootloader.DisarmTrial(); err != nil {
			klog.FromContext(ctx).Error(err, "Disarming the trial of a turn the API server no longer grants failed")
			return err
		}
		if err := d.update(func(st *diskState) { st.Trial = nil }); err != nil {
			return err
		}
	}
	return d.keepAppliedKernelArgs(ctx)
}

// keepAppliedKernelArgs puts back the kernel arguments in effect, which
// goDown may have replaced before a reboot that did not happen: the next
// boot that is not a turn must not pass the turn's arguments.
func (d *Daemon) keepAppliedKernelArgs(ctx context.Context) error {
	d.mu.Lock()
	applied := d.st.Applied
	d.mu.Unlock()
	if applied == nil {
		return nil
	}
	if err := d.o.Bootloader.SetKernelArgs(applied.Settings.KernelArgs); err != nil {
		klog.FromContext(ctx).Error(err, "Putting back the kernel arguments in effect after a turn that did not reboot failed")
		return err
	}
	return nil
}

// dropTurnRecord forgets a turn that did not reboot, and disarms a trial
// it armed.
func (d *Daemon) dropTurnRecord(ctx context.Context) error {
	log := klog.FromContext(ctx)
	d.mu.Lock()
	armed := d.st.Trial != nil && d.st.Trial.ArmedBootID == d.o.Boot.BootID
	d.mu.Unlock()
	if armed {
		if err := d.o.Bootloader.DisarmTrial(); err != nil {
			log.Error(err, "Disarming the trial of a turn given back failed; the next boot may try the staged slot once")
		}
	}
	// A boot partition that cannot be written does not keep the turn (and
	// liken's cordon): the arguments stay as the turn wrote them, and a
	// reboot that is not a turn would pass them, which the next boot
	// reports.
	_ = d.keepAppliedKernelArgs(ctx)
	if err := d.update(func(st *diskState) {
		st.Turn = nil
		if armed {
			st.Trial = nil
		}
	}); err != nil {
		log.Error(err, "Forgetting the turn given back")
		return err
	}
	return nil
}

// ledgerCluster reads the Cluster from the API server, not the cache, and
// says whether its ledger still grants change to this machine, before the
// irreversible step named by before. When it no longer does, the reboot
// turn this liken-node runs ends, and no turn starts again from the cached
// Cluster that granted it (StaleLedger) until the cache delivers a newer
// one, which gives the turn back.
func (d *Daemon) ledgerCluster(ctx context.Context, f *facts, change, before string) (*likenv1.Cluster, bool, error) {
	log := klog.FromContext(ctx)
	cl, err := d.o.Liken.LikenV1alpha1().Clusters().Get(ctx, f.C.Name, metav1.GetOptions{})
	if err != nil {
		log.Error(err, "Reading the Cluster's ledger failed; retrying", "before", before)
		return nil, false, err
	}
	if e := ledgerEntry(cl, d.o.Machine); e == nil || e.Change != change {
		log.Info("The turn is no longer in the Cluster's ledger; stopping until the cache has caught up", "before", before, "change", change)
		if f.Run != nil {
			d.endRun()
			d.mu.Lock()
			d.staleLedger = f.C
			d.mu.Unlock()
		}
		return nil, false, nil
	}
	return cl, true, nil
}

// ledgerGrants is ledgerCluster without the Cluster.
func (d *Daemon) ledgerGrants(ctx context.Context, f *facts, change, before string) (bool, error) {
	_, ok, err := d.ledgerCluster(ctx, f, change, before)
	return ok, err
}

// datastoreLetsGo returns nil once a leader's etcd member may go down for
// what (SafeToStop; at once on a machine that runs no control plane), or
// why not. While it may not, the Machine says why, and an event says so
// each time the reason changes.
func (d *Daemon) datastoreLetsGo(ctx context.Context, f *facts, change, what string) error {
	if d.o.ControlPlane == nil {
		return nil
	}
	log := klog.FromContext(ctx)
	err := d.o.ControlPlane.SafeToStop(ctx)
	d.mu.Lock()
	last := d.downWaitingFor
	if err == nil {
		d.downWaitingFor = ""
	} else {
		d.downWaitingFor = err.Error()
	}
	d.mu.Unlock()
	switch {
	case err == nil && last != "":
		log.Info("The datastore keeps its majority without this leader now", "for", what)
	case err != nil && err.Error() != last:
		log.Info("Not going down yet: the datastore would lose its majority", "for", what, "reason", err.Error())
		d.event(f.M, f.C, "Warning", ReasonWaitingForDatastore, "Wait", "%s for change %s waits: %v", what, change, err)
	}
	return err
}
