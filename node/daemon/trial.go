package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/slots"
)

// startBoot opens the slot store and the daemon state and works out what
// this boot is, from disk alone: a trial boot starts its timer here, so it
// returns to the proven slot in time even with no API server.
func (d *Daemon) startBoot(ctx context.Context) error {
	log := klog.FromContext(ctx)
	store, err := slots.Open(ctx, d.o.Root, string(d.o.Boot.Slot), slots.WithClock(d.clock), slots.WithBootPartition(d.o.BootPartition))
	if err != nil {
		return fmt.Errorf("opening the slot store: %w", err)
	}
	d.slots = store
	st, err := loadState(d.o.Root)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.st = st
	now := d.clock.Now()
	bootID := d.o.Boot.BootID
	booted := d.o.Boot.Slot
	newBoot := st.BootID != bootID
	log = log.WithValues("slot", booted, "trial", d.o.Boot.Trial, "bootID", bootID, "version", d.o.Boot.Version, "newBoot", newBoot)

	bs, err := d.o.Bootloader.State()
	if err != nil {
		d.mode, d.confusion = modeConfused, fmt.Sprintf("the boot state cannot be read (%v): the machine writes no slot and takes no turn until it can", err)
		log.Error(err, "Reading the boot state failed")
	}

	next := st.clone()
	tr := next.Trial
	switch {
	case err != nil:
	case d.o.Boot.Trial && tr != nil && boot.Slot(tr.Slot) == booted && tr.ArmedBootID != bootID:
		// Also when the boot loader already names this slot proven: the
		// daemon stopped in the middle of a commit, which it finishes.
		d.mode = modeTrial
		if tr.StartedAt.IsZero() {
			tr.StartedAt = now
		}
	case d.o.Boot.Trial:
		// A trial boot nothing vouches for: the state that armed it is
		// gone. Only a verified, staged slot may be tried.
		if info, gerr := d.slots.Get(string(booted)); gerr == nil && info.State == likenv1.SlotStaged && info.Version == d.o.Boot.Version {
			d.mode = modeTrial
			next.Trial = &trialRecord{Slot: string(booted), Version: info.Version, Digest: info.Digest,
				Timeout: Duration(likenv1.DefaultTrialTimeout), ArmedAt: now, StartedAt: now}
			log.Info("Trial boot without a trial record; the staged slot gets the default trial timeout", "timeout", likenv1.DefaultTrialTimeout)
		} else {
			d.mode = modeTrial
			next.Trial = &trialRecord{Slot: string(booted), Version: d.o.Boot.Version, ArmedAt: now, StartedAt: now,
				Failure: fmt.Sprintf("slot %s was booted as a trial, but it holds no staged release liken armed a trial for", booted)}
		}
	case booted == bs.Proven:
		d.mode = modeNormal
		if tr != nil && tr.ArmedBootID != bootID {
			reason := tr.Failure
			if reason == "" {
				reason = fmt.Sprintf("the trial boot of slot %s (release %s) never came back to commit: the machine booted its proven slot %s again, so the trial kernel or OS did not start, hung, or lost power", tr.Slot, tr.Version, booted)
			}
			log.Info("The last trial failed; running the proven slot", "trialSlot", tr.Slot, "release", tr.Version, "reason", reason)
			next.TrialFailure = &trialFailure{Slot: tr.Slot, Version: tr.Version, Digest: tr.Digest, Reason: reason, At: now, Resume: tr.Resume}
			if err := d.slots.MarkFailed(tr.Slot, "trial failed: "+reason); err != nil {
				log.Error(err, "Marking the slot whose trial failed", "trialSlot", tr.Slot)
			}
			next.Trial = nil
		}
	default:
		d.mode = modeConfused
		d.confusion = fmt.Sprintf("the machine booted slot %s without a trial while the boot state names slot %s as proven: it writes no slot and takes no turn; check the boot folder's grubenv", booted, bs.Proven)
		log.Info("Booted slot is neither proven nor on trial", "proven", bs.Proven)
	}

	if newBoot {
		if next.Applied != nil {
			nb := next.Applied
			if next.NextBoot != nil {
				nb = next.NextBoot
			}
			cfg := changes.Merge(*next.Applied, *nb, likenv1.ClassNextBoot, likenv1.ClassReboot)
			if err := d.o.Applier.Boot(ctx, cfg); err != nil {
				// Kept until a retry succeeds (syncConfig): the machine reads
				// Degraded with ConfigApplied=False meanwhile.
				d.bootErr = fmt.Errorf("applying the configuration at boot: %w", err)
				log.Error(err, "Applying the configuration at boot failed")
			}
			next.Applied = &cfg
		}
		if t := next.Turn; t != nil && t.BootID != bootID && d.mode != modeTrial {
			// The turn's reboot happened; the trial (if any) was settled above.
			if t.RebootRequest != "" {
				next.ObservedRebootRequest = t.RebootRequest
			}
			next.Turn = nil
		}
		next.BootID, next.BootSeen = bootID, now
	}
	if err := next.save(d.o.Root); err != nil {
		return err
	}
	d.st = next
	if d.mode == modeTrial {
		d.startTrialTimer(ctx)
	}
	log.Info("Boot examined", "mode", d.modeName())
	return nil
}

func (d *Daemon) modeName() string {
	return [...]string{"normal", "trial", "confused"}[d.mode]
}

// trialDeadline is when the trial gives up: the trial timeout counted from
// when it was armed (the reboot is part of the trial), but never later than
// the timeout counted from this boot's start, should the clock have jumped.
func (tr *trialRecord) deadline() time.Time {
	t := time.Duration(tr.Timeout)
	if t <= 0 {
		t = likenv1.DefaultTrialTimeout
	}
	a, b := tr.ArmedAt.Add(t), tr.StartedAt.Add(t)
	if b.Before(a) {
		return b
	}
	return a
}

// startTrialTimer arms the timer that ends a trial that did not commit.
// Call with d.mu held.
func (d *Daemon) startTrialTimer(ctx context.Context) {
	tr := d.st.Trial
	wait := tr.deadline().Sub(d.clock.Now())
	if tr.Failure != "" || wait < 0 {
		wait = 0
	}
	d.trialWaitingFor = "liken-node has not reached the API server"
	klog.FromContext(ctx).Info("Trial boot: waiting to rejoin the cluster", "slot", tr.Slot, "release", tr.Version, "deadline", tr.deadline(), "left", wait.Round(time.Second))
	d.trialTimer = d.clock.AfterFunc(wait, func() { d.trialExpired(ctx) })
}

// trialExpired gives up a trial that did not commit in time: it records
// why, and reboots without committing, so the boot loader starts the
// proven slot.
func (d *Daemon) trialExpired(ctx context.Context) {
	log := klog.FromContext(ctx)
	d.mu.Lock()
	if d.mode != modeTrial || d.rebooting || ctx.Err() != nil {
		d.mu.Unlock()
		return
	}
	tr := d.st.Trial
	reason := tr.Failure
	if reason == "" {
		reason = fmt.Sprintf("the trial boot of slot %s (release %s) did not rejoin the cluster within the trial timeout (%s): %s", tr.Slot, tr.Version, time.Duration(tr.Timeout), d.trialWaitingFor)
	}
	if err := d.update(func(st *diskState) { st.Trial.Failure = reason }); err != nil {
		log.Error(err, "Recording the trial failure before the reboot")
	}
	d.rebooting = true
	d.mu.Unlock()
	log.Info("Trial failed; rebooting to the proven slot without committing", "reason", reason)
	if err := d.reboot(ctx); err != nil {
		log.Error(err, "Rebooting after the failed trial failed; trying again")
		d.mu.Lock()
		d.rebooting = false
		d.trialTimer = d.clock.AfterFunc(d.t.APIRetry, func() { d.trialExpired(ctx) })
		d.mu.Unlock()
	}
}

// reboot hands over to the Rebooter; a simulated reboot stops Run.
func (d *Daemon) reboot(ctx context.Context) error {
	err := d.o.Rebooter.Reboot(ctx)
	if errors.Is(err, ErrRebooted) {
		d.stop(ErrRebooted)
		return nil
	}
	return err
}

// commitTrial makes the trial slot the proven one: the boot loader first
// (from then on a reboot boots the new slot), then the slot store, then
// the daemon state. A crash between the steps is finished at the next
// start. Call with d.mu held.
func (d *Daemon) commitTrial(ctx context.Context, m *likenv1.Machine, c *likenv1.Cluster) error {
	log := klog.FromContext(ctx)
	tr := d.st.Trial
	slot := boot.Slot(tr.Slot)
	if err := d.o.Bootloader.Commit(slot); err != nil {
		return fmt.Errorf("committing slot %s in the boot loader: %w", slot, err)
	}
	if err := d.slots.Commit(tr.Slot); err != nil {
		return fmt.Errorf("committing slot %s in the slot store: %w", slot, err)
	}
	if err := d.update(func(st *diskState) {
		st.Trial = nil
		st.TrialFailure = nil
		if st.Turn != nil {
			if st.Turn.RebootRequest != "" {
				st.ObservedRebootRequest = st.Turn.RebootRequest
			}
			st.Turn = nil
		}
	}); err != nil {
		return err
	}
	d.mode = modeNormal
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	log.Info("Trial succeeded; slot committed as proven", "slot", slot, "release", tr.Version)
	d.event(m, c, "Normal", ReasonTrialSucceeded, "Commit", "The trial of release %s in slot %s succeeded: the node is Ready and liken-node reached the API server; slot %s is now the proven slot", tr.Version, slot, slot)
	return nil
}
