package boote2e

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"liken.sh/liken/node/boot"
)

// cutAtFlush powers the machine on behind a volatile write cache and cuts
// the power at the first flush that would make copy (boot.EnvFile or
// boot.BackupFile) read want, before the flush is carried out: every write
// not flushed by then is lost. booted checks the console before the cut.
func (m *machine) cutAtFlush(copy string, want boot.State, booted func()) {
	m.t.Helper()
	off := m.disk.envOffset[copy]
	disk := m.powerOnCached(func(v CacheView) bool {
		if !v.Touch(off, boot.EnvBlockSize) {
			return false
		}
		st, err := boot.Decode(v.Read(off, boot.EnvBlockSize))
		return err == nil && st == want
	})
	booted()
	poll.WaitOn(m.t, func(poll.LogT) poll.Result {
		select {
		case <-disk.Cut():
			return poll.Success()
		default:
		}
		if done, err := m.vm.Exited(); done {
			return poll.Error(err)
		}
		return poll.Continue("waiting for the flush of %s reading %s", copy, want)
	}, poll.WithTimeout(bootTimeout), poll.WithDelay(50*time.Millisecond))
	m.vm.Kill()
	lost := disk.Lost()
	m.t.Logf("%6.1fs the power failed at the flush of %s reading %s: %d writes lost, %d flushes had reached the disk",
		time.Since(m.vm.Started).Seconds(), copy, want, len(lost), disk.Flushes())
	assert.Assert(m.t, len(lost) > 0, "the cut lost no write")
}

// assertOnDisk checks each copy on the disk.
func (m *machine) assertOnDisk(primary, backup boot.State) {
	m.t.Helper()
	for name, want := range map[string]boot.State{boot.EnvFile: primary, boot.BackupFile: backup} {
		st, err := m.state(name)
		assert.NilError(m.t, err, name)
		assert.Equal(m.t, st, want, "%s on disk after the power cut", name)
	}
}

// TestPowerCutLosesUnflushedWrites: the disk has a volatile write cache
// (CacheDisk), and the power fails at a flush, before it is carried out:
// every write the machine had not flushed is lost, GRUB's included (GRUB
// writes through the firmware and never flushes).
//
// A cut at the trial's commit, at the flush of either copy, leaves the
// proven slot in both copies or the old one in the copy GRUB reads first,
// never a trial: the next boot is the proven slot A, its own files. A cut
// before the trial boot's first flush (its mount of the boot partition)
// loses GRUB's clearing of the flag: the next power-on tries the trial
// once more, which clears it again.
func TestPowerCutLosesUnflushedWrites(t *testing.T) {
	t.Parallel()
	provenA := boot.State{Proven: boot.SlotA}
	aTryB := boot.State{Proven: boot.SlotA, Trial: boot.SlotB}
	committed := boot.State{Proven: boot.SlotB}
	trialCommits := func(m *machine) func() {
		return func() { m.expectBoot(boot.SlotB, true) }
	}
	tests := []struct {
		name  string
		steps func(m *machine)
	}{
		{"GRUB's clearing of the flag, then the commit's backup write", func(m *machine) {
			// GRUB's writes stop at the cut, so it never gets to load B.
			m.cutAtFlush(boot.EnvFile, provenA, func() {})
			m.assertOnDisk(aTryB, provenA)
			m.cutAtFlush(boot.BackupFile, committed, trialCommits(m))
			m.assertOnDisk(provenA, provenA)
		}},
		{"the commit's primary write", func(m *machine) {
			m.cutAtFlush(boot.EnvFile, committed, trialCommits(m))
			m.assertOnDisk(provenA, committed)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, backup := armed(t, boot.SlotA, boot.SlotB)
			m := newMachine(t, DiskSpec{Scenario: map[boot.Slot]string{boot.SlotB: "commit"}, Primary: primary, Backup: backup})
			tc.steps(m)
			m.powerOn()
			m.expectBoot(boot.SlotA, false)
			m.waitPowerOff()
		})
	}
}
