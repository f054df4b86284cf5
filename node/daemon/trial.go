package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/slots"
)

// startBoot opens the slot store and the daemon state and works out what
// this boot is, from disk alone (classifyBoot decides, startBoot does the
// writes): a trial boot starts its timer here, so it returns to the proven
// slot in time even with no API server. Run calls it before anything else
// of the daemon runs.
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
	d.st = st
	f := bootFacts{State: st, Boot: d.o.Boot, Now: d.clock.Now()}
	f.Loader, f.LoaderErr = d.o.Bootloader.State()
	if f.KernelArgs, f.KernelArgsErr = d.o.Bootloader.KernelArgs(); f.KernelArgsErr != nil {
		log.Error(f.KernelArgsErr, "The boot loader's kernel arguments cannot be read; this boot passed none, and the staged ones wait for a turn")
	}
	// Get fails only for a slot that is not A or B, which New refuses.
	f.Slot, _ = store.Get(string(d.o.Boot.Slot))
	p := classifyBoot(f)
	log = log.WithValues("slot", d.o.Boot.Slot, "trial", d.o.Boot.Trial, "bootID", d.o.Boot.BootID, "version", d.o.Boot.Version, "newBoot", st.BootID != d.o.Boot.BootID, "boot", p.Kind)
	if p.Stop != nil {
		return p.Stop
	}
	d.mode, d.confusion = p.Mode, p.Confusion
	if p.Log != "" {
		log.Info(p.Log, p.LogValues...)
	}

	if p.CommitSlot != "" {
		if err := d.slots.Commit(p.CommitSlot); err != nil {
			log.Error(err, "Finishing the commit of the slot the boot loader already proves", "trialSlot", p.CommitSlot)
		}
	}
	if f.LoaderErr == nil && d.mode != modeConfused {
		d.reconcileSlots(ctx, string(f.Loader.Proven))
	}
	if p.FailSlot != "" {
		if err := d.slots.MarkFailed(p.FailSlot, p.FailMessage); err != nil {
			log.Error(err, "Marking the slot whose trial failed", "trialSlot", p.FailSlot)
		}
	}
	d.pendingEvents = append(d.pendingEvents, p.Events...)
	if p.ApplyAtBoot != nil {
		if err := d.o.Applier.Boot(ctx, *p.ApplyAtBoot); err != nil {
			// Kept until a retry succeeds (decideConfig): the machine reads
			// Degraded with ConfigApplied=False meanwhile.
			d.bootErr = fmt.Errorf("applying the configuration at boot: %w", err)
			log.Error(err, "Applying the configuration at boot failed")
		}
	}
	if p.DisarmLeftovers {
		if err := d.disarmLeftovers(ctx); err != nil {
			log.Error(err, "Repairing the boot state failed; no release is downloaded until it succeeds")
		}
	}
	if err := p.State.save(d.o.Root); err != nil {
		return err
	}
	d.st = p.State
	if d.mode == modeTrial {
		deadline := d.st.Trial.deadline()
		d.startTrialTimer(ctx)
		d.feedWatchdog(ctx, deadline)
	} else if d.mode == modeNormal {
		// Nothing left to try (a commit was finished): the watchdog the
		// init armed for this boot is not needed.
		d.disarmWatchdog(ctx)
	}
	log.Info("Boot examined", "mode", d.mode.String())
	return nil
}

// reconcileSlots makes the slot store agree with the boot loader, which
// proves slot proven: a store that disagrees (an unreadable state file
// replaced during a trial) would refuse to record a failed trial and to
// download again. What it repaired is reported in a Warning event; a
// repair that could not be written keeps the machine Degraded.
func (d *Daemon) reconcileSlots(ctx context.Context, proven string) {
	log := klog.FromContext(ctx)
	changed, err := d.slots.Reconcile(proven)
	what := strings.Join(changed, "; ")
	if err != nil {
		d.slotErr = fmt.Errorf("the slot store disagrees with the boot loader (%s) and could not be repaired: %w", what, err)
		log.Error(err, "Repairing the slot store failed", "changes", changed)
		return
	}
	d.slotErr = nil
	if len(changed) == 0 {
		return
	}
	log.Info("The slot store disagreed with the boot loader; repaired it", "proven", proven, "changes", changed)
	d.pendingEvents = append(d.pendingEvents, pendingEvent{"Warning", ReasonSlotStoreRepaired, "Repair",
		fmt.Sprintf("The slot store disagreed with the boot loader, which proves slot %s (its state file was unreadable once): %s", proven, what)})
}

// settleTurn forgets the turn whose reboot happened, and remembers the
// reboot request it honoured.
func settleTurn(st *diskState) {
	if t := st.Turn; t != nil {
		if t.RebootRequest != "" {
			st.ObservedRebootRequest = t.RebootRequest
		}
		st.Turn = nil
	}
}

// disarmLeftovers withdraws a trial flag no turn of this boot armed and
// repairs the two copies of the boot state, and says whether it is safe
// to write into the inactive slot: never while a trial is armed, since a
// power cut in the middle of the write would trial-boot half-written
// bytes. Call with no turn under way.
func (d *Daemon) disarmLeftovers(ctx context.Context) error {
	log := klog.FromContext(ctx)
	bs, err := d.o.Bootloader.State()
	if err != nil && d.o.Boot.Trial {
		// Nothing this boot could commit: give the trial up (StartFailed
		// reboots; the flag is already cleared, so the proven slot boots).
		return fmt.Errorf("reading the boot state in a trial boot: %w", err)
	}
	if err != nil {
		return fmt.Errorf("reading the boot state: %w", err)
	}
	damaged := d.o.Bootloader.Check()
	if bs.Trial == "" && damaged == nil {
		return nil
	}
	log.Info("Withdrawing a trial flag no turn armed, and repairing both copies of the boot state", "state", bs, "check", damaged)
	if err := d.o.Bootloader.DisarmTrial(); err != nil {
		return fmt.Errorf("withdrawing the trial flag (%s): %w", bs, err)
	}
	if bs, err = d.o.Bootloader.State(); err != nil {
		return fmt.Errorf("reading the boot state: %w", err)
	}
	if bs.Trial != "" {
		return fmt.Errorf("the boot state still arms a trial of slot %s after it was withdrawn; check the boot folder's grubenv", bs.Trial)
	}
	if err := d.o.Bootloader.Check(); err != nil {
		return fmt.Errorf("the boot state is still damaged after it was rewritten: %w", err)
	}
	return nil
}

func (m bootMode) String() string {
	return [...]string{"normal", "trial", "confused"}[m]
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
func (d *Daemon) startTrialTimer(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tr := d.st.Trial
	wait := tr.deadline().Sub(d.clock.Now())
	if tr.Failure != "" || wait < 0 {
		wait = 0
	}
	d.trialWaitingFor = "liken-node has not reached the API server"
	klog.FromContext(ctx).Info("Trial boot: waiting to rejoin the cluster", "slot", tr.Slot, "release", tr.Version, "deadline", tr.deadline(), "left", wait.Round(time.Second))
	d.armTrialTimer(ctx, wait)
}

// armTrialTimer has trialExpired run after wait, in a goroutine of its
// own: a clock may call back while it holds its own lock (an injected one
// does), and trialExpired waits for d.mu, whose holders read the clock.
// Call with d.mu held.
func (d *Daemon) armTrialTimer(ctx context.Context, wait time.Duration) {
	d.trialTimer = d.clock.AfterFunc(wait, func() { go d.trialExpired(ctx) })
}

// trialExpired gives up a trial that did not commit in time: it records
// why, and reboots without committing, so the boot loader starts the
// proven slot.
func (d *Daemon) trialExpired(ctx context.Context) {
	log := klog.FromContext(ctx)
	d.mu.Lock()
	if d.committing {
		// A commit under way hands the trial back when it fails
		// (trialTimerAfterCommitFailed).
		d.expiredInCommit = true
	}
	if d.mode != modeTrial || d.rebooting || d.committing || ctx.Err() != nil {
		d.mu.Unlock()
		return
	}
	tr := d.st.Trial
	reason := tr.Failure
	if reason == "" {
		reason = fmt.Sprintf("the trial boot of slot %s (release %s) did not rejoin the cluster within the trial timeout (%s): %s", tr.Slot, tr.Version, time.Duration(tr.Timeout), d.trialWaitingFor)
	}
	if err := d.updateLocked(func(st *diskState) { st.Trial.Failure = reason }); err != nil {
		log.Error(err, "Recording the trial failure before the reboot")
	}
	d.rebooting = true
	d.mu.Unlock()
	log.Info("Trial failed; rebooting to the proven slot without committing", "reason", reason)
	if err := d.reboot(ctx); err != nil {
		log.Error(err, "Rebooting after the failed trial failed; trying again")
		d.mu.Lock()
		d.rebooting = false
		d.armTrialTimer(ctx, d.t.APIRetry)
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

// trialTimerAfterCommitFailed hands a trial whose commit failed back to
// its timer: one whose deadline passed meanwhile gives up now.
func (d *Daemon) trialTimerAfterCommitFailed(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	expired := d.expiredInCommit
	d.expiredInCommit = false
	if d.mode != modeTrial || d.st.Trial == nil || !(expired || !d.clock.Now().Before(d.st.Trial.deadline())) {
		return
	}
	if d.trialTimer != nil {
		d.trialTimer.Stop()
	}
	d.armTrialTimer(ctx, 0)
}

// feedWatchdog feeds the watchdog the init armed for this trial boot until
// the trial commits (disarmWatchdog), liken-node stops, or the trial's
// deadline passes: a liken-node that hangs, or whose reboot fails, lets it
// reset the machine into the proven slot. It does not take d.mu.
func (d *Daemon) feedWatchdog(ctx context.Context, deadline time.Time) {
	wd := d.o.Watchdog
	if wd == nil {
		return
	}
	log := klog.FromContext(ctx)
	t := d.clock.NewTicker(d.t.WatchdogFeed)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer t.Stop()
		for {
			d.wdMu.Lock()
			if d.wdDone {
				d.wdMu.Unlock()
				return
			}
			if d.clock.Now().After(deadline) {
				d.wdMu.Unlock()
				log.Info("The trial's deadline has passed: no longer feeding the watchdog, which resets the machine into the proven slot unless liken-node reboots it first", "deadline", deadline)
				return
			}
			err := wd.Keepalive()
			d.wdMu.Unlock()
			if err != nil {
				log.Error(err, "Feeding the trial watchdog failed; it resets the machine into the proven slot unless a later feeding succeeds")
			}
			select {
			case <-ctx.Done():
				// Stopping (SIGTERM, or the trial gave up and reboots):
				// the watchdog stays armed.
				return
			case <-t.C():
			}
		}
	}()
}

// disarmWatchdog stops the trial's watchdog for good: the trial committed.
func (d *Daemon) disarmWatchdog(ctx context.Context) {
	if d.o.Watchdog == nil {
		return
	}
	d.wdMu.Lock()
	defer d.wdMu.Unlock()
	if d.wdDone {
		return
	}
	d.wdDone = true
	if err := d.o.Watchdog.Disarm(); err != nil {
		klog.FromContext(ctx).Error(err, "Disarming the trial watchdog failed; the machine may reset once more, into the slot now proven")
		return
	}
	klog.FromContext(ctx).Info("Trial watchdog disarmed")
}
