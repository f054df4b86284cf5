package boot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// bootDir writes the two copies (nil: no file) into a new folder.
func bootDir(t *testing.T, primary, backup []byte) string {
	t.Helper()
	dir := t.TempDir()
	if primary != nil {
		assert.NilError(t, os.WriteFile(filepath.Join(dir, EnvFile), primary, 0o644))
	}
	if backup != nil {
		assert.NilError(t, os.WriteFile(filepath.Join(dir, BackupFile), backup, 0o644))
	}
	return dir
}

func mustEncode(t *testing.T, st State) []byte {
	t.Helper()
	b, err := Encode(st, nil)
	assert.NilError(t, err)
	return b
}

func readState(t *testing.T, path string) (State, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	return Decode(b)
}

func TestSelectBoot(t *testing.T) {
	a := State{Proven: SlotA}
	b := State{Proven: SlotB}
	aTryB := State{Proven: SlotA, Trial: SlotB}
	bTryA := State{Proven: SlotB, Trial: SlotA}
	garbage := bytes.Repeat([]byte{0xff}, EnvBlockSize)
	tests := []struct {
		name            string
		primary, backup []byte
		slot            Slot
		trial           bool
		source          Source
		// After the boot (nil: file unchanged).
		primaryAfter, backupAfter *State
	}{
		{name: "proven A", primary: mustEncode(t, a), backup: mustEncode(t, a), slot: SlotA, source: SourcePrimary},
		{name: "proven B", primary: mustEncode(t, b), backup: mustEncode(t, b), slot: SlotB, source: SourcePrimary},
		{name: "trial from primary clears both", primary: mustEncode(t, aTryB), backup: mustEncode(t, aTryB),
			slot: SlotB, trial: true, source: SourcePrimary, primaryAfter: &a, backupAfter: &a},
		{name: "trial of A", primary: mustEncode(t, bTryA), backup: mustEncode(t, b),
			slot: SlotA, trial: true, source: SourcePrimary, primaryAfter: &b, backupAfter: &b},
		{name: "trial with a garbage backup still clears the primary", primary: mustEncode(t, aTryB), backup: garbage,
			slot: SlotB, trial: true, source: SourcePrimary, primaryAfter: &a},
		{name: "trial with no backup file", primary: mustEncode(t, aTryB),
			slot: SlotB, trial: true, source: SourcePrimary, primaryAfter: &a},
		{name: "corrupt primary uses backup", primary: garbage, backup: mustEncode(t, b), slot: SlotB, source: SourceBackup},
		{name: "missing primary uses backup", backup: mustEncode(t, b), slot: SlotB, source: SourceBackup},
		{name: "trial from backup clears the backup", primary: garbage, backup: mustEncode(t, aTryB),
			slot: SlotB, trial: true, source: SourceBackup, backupAfter: &a},
		{name: "primary with bad trial value uses backup", primary: block("liken_proven=B\nliken_trial=2\n"), backup: mustEncode(t, b),
			slot: SlotB, source: SourceBackup},
		{name: "both corrupt: proven the primary names, never a trial", primary: block("liken_proven=B\nliken_trial=2\n"), backup: garbage,
			slot: SlotB, source: SourceFallback},
		{name: "both corrupt: proven the backup names", primary: garbage, backup: block("liken_proven=B\nliken_trial=x\n"),
			slot: SlotB, source: SourceFallback},
		{name: "nothing usable: A", primary: garbage, backup: garbage, slot: SlotA, source: SourceFallback},
		{name: "no files: A", slot: SlotA, source: SourceFallback},
		{name: "flag cannot be cleared (no newline before the padding): proven", primary: []byte(envSignature + "liken_proven=A\nliken_trial=1\nx"),
			backup: mustEncode(t, a), slot: SlotA, source: SourcePrimary, backupAfter: &a},
		{name: "flag reads 1 after clearing (duplicate entry): proven", primary: block("liken_proven=A\nliken_trial=1\nliken_trial=1\n"),
			backup: mustEncode(t, aTryB), slot: SlotA, source: SourcePrimary, primaryAfter: &aTryB, backupAfter: &a},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := bootDir(t, tc.primary, tc.backup)
			sel, err := SelectBootDetail(dir)
			assert.NilError(t, err)
			assert.Equal(t, sel.Slot, tc.slot)
			assert.Equal(t, sel.Trial, tc.trial)
			assert.Equal(t, sel.Source, tc.source)
			if tc.source != SourcePrimary || tc.trial != (tc.primaryAfter != nil) {
				// Unusual boots explain themselves.
				assert.Check(t, sel.Note != "" || tc.trial, "no note for %+v", sel)
			}
			for _, f := range []struct {
				name   string
				before []byte
				after  *State
			}{{EnvFile, tc.primary, tc.primaryAfter}, {BackupFile, tc.backup, tc.backupAfter}} {
				path := filepath.Join(dir, f.name)
				if f.after == nil {
					got, err := os.ReadFile(path)
					if f.before == nil {
						assert.Assert(t, errors.Is(err, os.ErrNotExist), "%s was created", f.name)
						continue
					}
					assert.NilError(t, err)
					assert.Check(t, bytes.Equal(got, f.before), "%s changed", f.name)
					continue
				}
				st, err := readState(t, path)
				assert.NilError(t, err)
				assert.Check(t, is.Equal(st, *f.after), f.name)
			}

			// One shot: the next power-on is never a trial.
			slot, trial, err := SelectBoot(dir)
			assert.NilError(t, err)
			assert.Check(t, !trial)
			if tc.trial {
				assert.Check(t, is.Equal(slot, tc.slot.Other()), "after the trial, the proven slot")
			} else {
				assert.Check(t, is.Equal(slot, tc.slot))
			}
		})
	}
}

func TestSelectBootMissingFolder(t *testing.T) {
	_, _, err := SelectBoot(filepath.Join(t.TempDir(), "nope"))
	assert.ErrorContains(t, err, "simulated firmware: boot folder")
}

// TestSelectBootTornWrite cuts the primary's write at every byte: the boot
// is the old state, the new one, or the old proven slot without a trial
// (liken writes the backup first, and the flag before the proven slot).
func TestSelectBootTornWrite(t *testing.T) {
	transitions := []struct{ from, to State }{
		{State{Proven: SlotA}, State{Proven: SlotA, Trial: SlotB}}, // arm
		{State{Proven: SlotA, Trial: SlotB}, State{Proven: SlotA}}, // disarm
		{State{Proven: SlotA}, State{Proven: SlotB}},               // commit
		{State{Proven: SlotB, Trial: SlotA}, State{Proven: SlotA}}, // commit after a trial of A
		{State{Proven: SlotB}, State{Proven: SlotB, Trial: SlotA}}, // arm A
	}
	for _, tr := range transitions {
		old := mustEncode(t, tr.from)
		next := mustEncode(t, tr.to)
		for cut := 0; cut <= EnvBlockSize; cut++ {
			torn := append(bytes.Clone(next[:cut]), old[cut:]...)
			safe := func(s State) bool { return s == tr.from || s == tr.to || s == State{Proven: tr.from.Proven} }
			d := decide(torn, next)
			assert.Assert(t, safe(d.state), "%s -> %s cut at %d: decided %s", tr.from, tr.to, cut, d.state)
			// And a torn write that left zeros (a lost page) behaves too.
			zeroed := append(bytes.Clone(next[:cut]), make([]byte, EnvBlockSize-cut)...)
			d = decide(zeroed, next)
			assert.Assert(t, safe(d.state), "%s -> %s zeroed from %d: decided %s", tr.from, tr.to, cut, d.state)
			for _, w := range [][]byte{torn, zeroed} {
				// The backup is written first while the primary holds the
				// old state.
				d = decide(old, w)
				assert.Assert(t, safe(d.state), "%s -> %s, backup cut at %d: decided %s", tr.from, tr.to, cut, d.state)
				// A damaged primary (the write repairs it) is written
				// first, while the backup holds the old state; then the
				// backup, after the primary holds the new one.
				d = decide(w, old)
				assert.Assert(t, safe(d.state), "%s -> %s, damaged primary cut at %d: decided %s", tr.from, tr.to, cut, d.state)
				d = decide(next, w)
				assert.Assert(t, safe(d.state), "%s -> %s, backup cut at %d after the primary's repair: decided %s", tr.from, tr.to, cut, d.state)
			}
		}
	}
}
