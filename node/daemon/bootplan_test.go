package daemon

import (
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/slots"
)

// TestClassifyBoot has a row for each path of docs/design/boot.md's "What
// each failure leads to" that the daemon decides at boot, and for the
// ordinary boots around them. The machine armed a trial of release v2 in
// slot B in boot b-1, and runs boot b-2.
func TestClassifyBoot(t *testing.T) {
	const v1, v2 = "2026.11.01-001", "2026.11.20-001"
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	armedAt := now.Add(-time.Minute)
	ioErr := errors.New("input/output error")
	record := func(edit func(tr *trialRecord)) *diskState {
		st := &diskState{FormatVersion: stateFormat, BootID: "b-1",
			Turn: &turnRecord{Change: "release " + v2, Slot: "B", BootID: "b-1", StartedAt: armedAt, Rebooted: true},
			Trial: &trialRecord{Slot: "B", Version: v2, Digest: "sha256:2", Timeout: Duration(10 * time.Minute),
				ArmedAt: armedAt, ArmedBootID: "b-1", Resume: "r1"}}
		if edit != nil {
			edit(st.Trial)
		}
		return st
	}
	armedHere := record(func(tr *trialRecord) { tr.ArmedBootID = "b-2" })
	armedHere.BootID, armedHere.Turn.BootID, armedHere.Turn.Rebooted = "b-2", "b-2", false
	noTrial := &diskState{FormatVersion: stateFormat, BootID: "b-1"}
	provenA := boot.State{Proven: boot.SlotA}
	provenB := boot.State{Proven: boot.SlotB}
	onA := BootInfo{Slot: boot.SlotA, BootID: "b-2", Version: v1}
	onB := BootInfo{Slot: boot.SlotB, BootID: "b-2", Version: v2}
	trialB := BootInfo{Slot: boot.SlotB, Trial: true, BootID: "b-2", Version: v2}
	activeA := slots.Info{Name: "A", State: likenv1.SlotActive, Version: v1}
	stagedB := slots.Info{Name: "B", State: likenv1.SlotStaged, Version: v2, Digest: "sha256:2"}

	type want struct {
		kind     bootKind
		mode     bootMode
		stop     string // part of the error that ends the start
		commit   string
		fail     string
		event    string // the reason of the one event
		disarm   bool
		trial    bool   // a trial record is kept
		failure  string // part of the failed trial's reason
		turnGone bool
	}
	for _, tc := range []struct {
		name   string
		st     *diskState
		bi     BootInfo
		loader boot.State
		err    error
		slot   slots.Info
		want   want
	}{
		{name: "trial boot armed by the turn: the trial timer starts",
			st: record(nil), bi: trialB, loader: provenA, slot: stagedB,
			want: want{kind: bootTrial, mode: modeTrial, trial: true}},
		{name: "liken-node restarts during the trial",
			st: record(func(tr *trialRecord) { tr.StartedAt = armedAt.Add(20 * time.Second) }), bi: trialB, loader: provenA, slot: stagedB,
			want: want{kind: bootTrial, mode: modeTrial, trial: true}},
		{name: "liken-node cannot start in the trial boot: boot loader I/O",
			st: record(nil), bi: trialB, err: ioErr, slot: stagedB,
			want: want{kind: bootTrialUnreadable, mode: modeTrial, stop: "reading the boot state in a trial boot: input/output error", trial: true}},
		{name: "the boot state cannot be read on the proven slot: runs on, confused",
			st: noTrial, bi: onA, err: ioErr, slot: activeA,
			want: want{kind: bootUnreadable, mode: modeConfused}},
		{name: "trial kernel panics, or power cut during the trial: liken-node never ran",
			st: record(nil), bi: onA, loader: provenA, slot: activeA,
			want: want{kind: bootTrialFailed, mode: modeNormal, fail: "B", disarm: true, failure: "never came back to commit", turnGone: true}},
		{name: "trial hangs after liken-node started: the watchdog resets",
			st: record(func(tr *trialRecord) { tr.StartedAt = armedAt.Add(20 * time.Second) }), bi: onA, loader: provenA, slot: activeA,
			want: want{kind: bootTrialFailed, mode: modeNormal, fail: "B", disarm: true, failure: "never came back to commit", turnGone: true}},
		{name: "trial never rejoins: the trial timer rebooted",
			st: record(func(tr *trialRecord) { tr.Failure = "did not rejoin the cluster within the trial timeout" }), bi: onA, loader: provenA, slot: activeA,
			want: want{kind: bootTrialFailed, mode: modeNormal, fail: "B", disarm: true, failure: "did not rejoin the cluster", turnGone: true}},
		{name: "power cut after Commit wrote the boot loader",
			st: record(func(tr *trialRecord) { tr.StartedAt = armedAt.Add(20 * time.Second) }), bi: onB, loader: provenB, slot: stagedB,
			want: want{kind: bootCommitUnfinished, mode: modeNormal, commit: "B", event: ReasonTrialSucceeded, disarm: true, turnGone: true}},
		{name: "the trial timer fired after the boot loader's commit and a failed write",
			st: record(func(tr *trialRecord) {
				tr.StartedAt = armedAt.Add(20 * time.Second)
				tr.Failure = "did not rejoin the cluster within the trial timeout"
			}), bi: onB, loader: provenB, slot: stagedB,
			want: want{kind: bootCommitUnfinished, mode: modeNormal, commit: "B", event: ReasonTrialSucceeded, disarm: true, turnGone: true}},
		{name: "power cut between the trial record and ArmTrial",
			st: record(func(tr *trialRecord) { tr.Arming = true }), bi: onA, loader: provenA, slot: activeA,
			want: want{kind: bootNeverArmed, mode: modeNormal, disarm: true, turnGone: true}},
		{name: "a trial flag left armed that no turn armed",
			st: noTrial, bi: onA, loader: boot.State{Proven: boot.SlotA, Trial: boot.SlotB}, slot: activeA,
			want: want{kind: bootNormal, mode: modeNormal, disarm: true}},
		{name: "liken-node restarts after arming, before the turn's reboot",
			st: armedHere, bi: onA, loader: boot.State{Proven: boot.SlotA, Trial: boot.SlotB}, slot: activeA,
			want: want{kind: bootArmedHere, mode: modeNormal, trial: true}},
		{name: "trial boot whose record is gone: the staged slot is tried",
			st: noTrial, bi: trialB, loader: provenA, slot: stagedB,
			want: want{kind: bootTrialUnrecorded, mode: modeTrial, trial: true}},
		{name: "trial boot of a slot nothing staged: it gives up at once",
			st: noTrial, bi: trialB, loader: provenA, slot: slots.Info{Name: "B", State: likenv1.SlotFailed, Version: v2},
			want: want{kind: bootTrialUnvouched, mode: modeTrial, trial: true}},
		{name: "the booted slot is neither proven nor on trial",
			st: noTrial, bi: onB, loader: provenA, slot: stagedB,
			want: want{kind: bootStray, mode: modeConfused}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.st.clone()
			p := classifyBoot(bootFacts{State: tc.st, Boot: tc.bi, Loader: tc.loader, LoaderErr: tc.err, Slot: tc.slot, Now: now})
			assert.DeepEqual(t, tc.st, before) // it only decides

			w := tc.want
			assert.Equal(t, p.Kind, w.kind)
			assert.Equal(t, p.Mode, w.mode)
			if w.stop != "" {
				assert.ErrorContains(t, p.Stop, w.stop)
				return
			}
			assert.NilError(t, p.Stop)
			assert.Equal(t, p.Confusion != "", w.mode == modeConfused, p.Confusion)
			assert.Equal(t, p.CommitSlot, w.commit)
			assert.Equal(t, p.FailSlot, w.fail)
			var reasons []string
			for _, e := range p.Events {
				reasons = append(reasons, e.reason)
			}
			if w.event == "" {
				assert.Assert(t, is.Len(reasons, 0))
			} else {
				assert.DeepEqual(t, reasons, []string{w.event})
			}
			assert.Equal(t, p.DisarmLeftovers, w.disarm)

			st := p.State
			assert.Equal(t, st.BootID, "b-2")
			assert.Equal(t, st.Trial != nil, w.trial, "trial record %+v", st.Trial)
			if st.Trial != nil && w.mode == modeTrial {
				assert.Equal(t, st.Trial.Slot, "B")
				assert.Assert(t, !st.Trial.StartedAt.IsZero(), "a trial boot records when it started")
				if tc.st.Trial != nil && !tc.st.Trial.StartedAt.IsZero() {
					assert.Equal(t, st.Trial.StartedAt, tc.st.Trial.StartedAt, "a restart keeps the trial's start")
				}
			}
			if w.kind == bootTrialUnvouched {
				assert.Assert(t, is.Contains(st.Trial.Failure, "holds no staged release"))
			}
			if w.failure == "" {
				assert.Assert(t, st.TrialFailure == nil, "%+v", st.TrialFailure)
			} else {
				assert.Assert(t, st.TrialFailure != nil)
				assert.Assert(t, is.Contains(st.TrialFailure.Reason, w.failure))
				assert.Assert(t, is.Contains(p.FailMessage, w.failure))
				assert.Equal(t, st.TrialFailure.Version, v2)
				assert.Equal(t, st.TrialFailure.Resume, "r1")
				assert.Assert(t, st.TrialFailure.ResumeUnseen)
			}
			assert.Equal(t, st.Turn == nil, w.turnGone || tc.st.Turn == nil, "turn %+v", st.Turn)
		})
	}
}

// TestClassifyBootKeepsTheBootedKernelArgs: a new boot applies the staged
// NextBoot and Reboot values, but records as applied the kernel arguments
// the boot loader passed, not the staged ones: a reboot that was not the
// turn's leaves them pending.
func TestClassifyBootKeepsTheBootedKernelArgs(t *testing.T) {
	staged := []string{"quiet"}
	for _, tc := range []struct {
		name   string
		booted []string
		want   []string
	}{
		{name: "a reboot that was not the turn's: the staged arguments stay pending", booted: nil, want: nil},
		{name: "the turn's reboot: the arguments it wrote are applied", booted: staged, want: staged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			applied := changes.Config{Settings: likenv1.SharedSettings{Banner: "old"}}
			next := changes.Config{Settings: likenv1.SharedSettings{Banner: "new", KernelArgs: staged}}
			st := &diskState{FormatVersion: stateFormat, BootID: "b-1", Applied: &applied, NextBoot: &next}
			p := classifyBoot(bootFacts{State: st, Boot: BootInfo{Slot: boot.SlotA, BootID: "b-2"}, Loader: boot.State{Proven: boot.SlotA},
				Slot: slots.Info{Name: "A", State: likenv1.SlotActive}, KernelArgs: tc.booted, Now: time.Now()})
			assert.Equal(t, p.Kind, bootNormal)
			assert.Equal(t, p.State.Applied.Settings.Banner, "new", "the NextBoot value was not applied")
			assert.DeepEqual(t, p.State.Applied.Settings.KernelArgs, tc.want)
			assert.DeepEqual(t, p.ApplyAtBoot, p.State.Applied)
		})
	}
}
