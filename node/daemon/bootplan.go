package daemon

import (
	"fmt"
	"time"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/slots"
)

// bootKind is what a boot is, as classifyBoot tells it from disk alone.
type bootKind string

const (
	// bootNormal: the proven slot, no trial under way.
	bootNormal bootKind = "normal"
	// bootArmedHere: the proven slot, in the boot that armed a trial
	// (liken-node restarted before the turn's reboot).
	bootArmedHere bootKind = "trial armed in this boot"
	// bootTrial: a trial boot its trial record vouches for.
	bootTrial bootKind = "trial"
	// bootTrialUnrecorded: a trial boot of the staged slot whose record is
	// gone; it gets the default trial timeout.
	bootTrialUnrecorded bootKind = "trial without a record"
	// bootTrialUnvouched: a trial boot of a slot liken armed no trial for;
	// it gives up at once.
	bootTrialUnvouched bootKind = "trial nothing vouches for"
	// bootTrialFailed: the proven slot again after a trial boot that did
	// not commit.
	bootTrialFailed bootKind = "trial failed"
	// bootCommitUnfinished: the trial's slot, proven in the boot loader,
	// not yet in the slot store and the daemon state.
	bootCommitUnfinished bootKind = "commit interrupted after the boot loader"
	// bootNeverArmed: the trial record was written, the flag never armed.
	bootNeverArmed bootKind = "trial recorded, never armed"
	// bootUnreadable: the boot state cannot be read on a boot that is not
	// a trial.
	bootUnreadable bootKind = "boot state unreadable"
	// bootTrialUnreadable: the boot state cannot be read in a trial boot.
	bootTrialUnreadable bootKind = "boot state unreadable in a trial boot"
	// bootStray: the booted slot is neither proven nor on trial.
	bootStray bootKind = "neither proven nor on trial"
)

// bootFacts is what startBoot reads before it decides anything.
type bootFacts struct {
	// State is the daemon state as read from disk; classifyBoot does not
	// change it.
	State *diskState
	// Boot is what the kernel command line and the running image say.
	Boot BootInfo
	// Loader is the boot loader's state, or LoaderErr why it cannot be read.
	Loader    boot.State
	LoaderErr error
	// Slot is the booted slot in the slot store.
	Slot slots.Info
	// KernelArgs are the kernel arguments this boot passed, as the boot
	// loader holds them (written only in a turn, right before its reboot),
	// or KernelArgsErr why they cannot be read (GRUB then passed none).
	KernelArgs    []string
	KernelArgsErr error
	Now           time.Time
}

// bootPlan is what classifyBoot decides; startBoot carries it out in the
// order of the fields.
type bootPlan struct {
	Kind bootKind
	Mode bootMode
	// Confusion explains modeConfused.
	Confusion string
	// Stop ends the start with this error before anything is written:
	// nothing this boot could commit (StartFailed reboots a trial boot).
	Stop error
	// CommitSlot is a slot whose commit the slot store finishes.
	CommitSlot string
	// FailSlot is a slot the slot store marks Failed, with FailMessage.
	FailSlot, FailMessage string
	// Events wait for the first reconcile, which has the objects.
	Events []pendingEvent
	// ApplyAtBoot is the configuration a new boot applies, if any.
	ApplyAtBoot *changes.Config
	// DisarmLeftovers withdraws a trial flag no turn armed and repairs
	// both copies of the boot state.
	DisarmLeftovers bool
	// State is the daemon state to save.
	State *diskState
	// Log and LogValues say what the boot is.
	Log       string
	LogValues []any
}

// classifyBoot works out what this boot is, and what to do about it, from
// the daemon state, the boot loader's state, the boot information and the
// booted slot's record. It only decides: startBoot does the writes. Each
// case is a row of docs/design/boot.md's "What each failure leads to".
func classifyBoot(f bootFacts) bootPlan {
	bi, bs, now := f.Boot, f.Loader, f.Now
	booted, bootID := bi.Slot, bi.BootID
	next := f.State.clone()
	tr := next.Trial
	p := bootPlan{State: next}
	switch {
	case f.LoaderErr != nil && bi.Trial:
		return bootPlan{Kind: bootTrialUnreadable, Mode: modeTrial, State: f.State,
			Stop: fmt.Errorf("reading the boot state in a trial boot: %w", f.LoaderErr)}
	case f.LoaderErr != nil:
		p.Kind, p.Mode = bootUnreadable, modeConfused
		p.Confusion = fmt.Sprintf("the boot state cannot be read (%v): the machine writes no slot and takes no turn until it can", f.LoaderErr)
		p.Log, p.LogValues = "Reading the boot state failed", []any{"err", f.LoaderErr}
	case bi.Trial && tr != nil && boot.Slot(tr.Slot) == booted && tr.ArmedBootID != bootID:
		// Also when the boot loader already names this slot proven: the
		// daemon stopped in the middle of a commit, which it finishes.
		p.Kind, p.Mode = bootTrial, modeTrial
		if tr.StartedAt.IsZero() {
			tr.StartedAt = now
		}
	case bi.Trial && f.Slot.State == likenv1.SlotStaged && f.Slot.Version == bi.Version:
		// A trial boot whose record is gone: only a verified, staged slot
		// may be tried.
		p.Kind, p.Mode = bootTrialUnrecorded, modeTrial
		next.Trial = &trialRecord{Slot: string(booted), Version: f.Slot.Version, Digest: f.Slot.Digest,
			Timeout: Duration(likenv1.DefaultTrialTimeout), ArmedAt: now, StartedAt: now}
		p.Log, p.LogValues = "Trial boot without a trial record; the staged slot gets the default trial timeout", []any{"timeout", likenv1.DefaultTrialTimeout}
	case bi.Trial:
		p.Kind, p.Mode = bootTrialUnvouched, modeTrial
		next.Trial = &trialRecord{Slot: string(booted), Version: bi.Version, ArmedAt: now, StartedAt: now,
			Failure: fmt.Sprintf("slot %s was booted as a trial, but it holds no staged release liken armed a trial for", booted)}
	case booted == bs.Proven && tr != nil && tr.Slot == string(booted) && tr.ArmedBootID != bootID:
		// The trial boot committed in the boot loader and stopped (a power
		// cut, or the trial timer after a write that failed) before the
		// slot store and the daemon state said so: the boot loader
		// decides, so the commit is finished here.
		p.Kind, p.Mode = bootCommitUnfinished, modeNormal
		p.CommitSlot = tr.Slot
		p.Events = []pendingEvent{{"Normal", ReasonTrialSucceeded, "Commit",
			fmt.Sprintf("The trial of release %s in slot %s had committed in the boot loader before the machine stopped; liken-node finished the commit: slot %s is the proven slot", tr.Version, tr.Slot, tr.Slot)}}
		p.Log, p.LogValues = "Finished a commit interrupted after the boot loader's write", []any{"trialSlot", tr.Slot, "release", tr.Version}
		next.Trial, next.TrialFailure = nil, nil
		settleTurn(next)
	case booted == bs.Proven && tr != nil && tr.Arming && tr.ArmedBootID != bootID:
		// The power failed between the trial record and the boot loader's
		// flag: no trial boot happened, none failed. A half-written flag
		// (the backup copy armed) is withdrawn with the leftovers.
		p.Kind, p.Mode = bootNeverArmed, modeNormal
		p.Log, p.LogValues = "The trial was recorded but never armed before the machine stopped; the machine asks for its turn again", []any{"trialSlot", tr.Slot, "release", tr.Version}
		next.Trial = nil
	case booted == bs.Proven && tr != nil && tr.ArmedBootID != bootID:
		p.Kind, p.Mode = bootTrialFailed, modeNormal
		reason := tr.Failure
		if reason == "" {
			reason = fmt.Sprintf("the trial boot of slot %s (release %s) never came back to commit: the machine booted its proven slot %s again, so the trial kernel or OS did not start, hung, or lost power", tr.Slot, tr.Version, booted)
		}
		p.Log, p.LogValues = "The last trial failed; running the proven slot", []any{"trialSlot", tr.Slot, "release", tr.Version, "reason", reason}
		next.TrialFailure = &trialFailure{Slot: tr.Slot, Version: tr.Version, Digest: tr.Digest, Reason: reason, At: now, Resume: tr.Resume, ResumeUnseen: true}
		p.FailSlot, p.FailMessage = tr.Slot, "trial failed: "+reason
		next.Trial = nil
	case booted == bs.Proven && tr != nil:
		p.Kind, p.Mode = bootArmedHere, modeNormal
	case booted == bs.Proven:
		p.Kind, p.Mode = bootNormal, modeNormal
	default:
		p.Kind, p.Mode = bootStray, modeConfused
		p.Confusion = fmt.Sprintf("the machine booted slot %s without a trial while the boot state names slot %s as proven: it writes no slot and takes no turn; check the boot folder's grubenv", booted, bs.Proven)
		p.Log, p.LogValues = "Booted slot is neither proven nor on trial", []any{"proven", bs.Proven}
	}

	if next.BootID != bootID {
		if next.Applied != nil {
			nb := next.Applied
			if next.NextBoot != nil {
				nb = next.NextBoot
			}
			cfg := changes.Merge(*next.Applied, *nb, likenv1.ClassNextBoot, likenv1.ClassReboot)
			// Not the staged arguments: those this boot ran with. A
			// reboot that was not the turn's leaves them pending.
			cfg.Settings.KernelArgs = f.KernelArgs
			p.ApplyAtBoot = &cfg
			next.Applied = &cfg
		}
		if t := next.Turn; t != nil && t.BootID != bootID && p.Mode != modeTrial {
			// The turn's reboot happened; the trial (if any) was settled above.
			settleTurn(next)
		}
		next.BootID, next.BootSeen = bootID, now
	}
	// No trial is due: a flag left armed (a power cut while it was armed
	// or withdrawn, a boot loader that could not clear it) or a damaged
	// copy is repaired before anything is written.
	p.DisarmLeftovers = p.Mode == modeNormal && next.Trial == nil
	return p
}
