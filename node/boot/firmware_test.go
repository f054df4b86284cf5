package boot

import (
	"bytes"
	"errors"
	"fmt"
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

// TestSelectBootTornWrite cuts every write of a change at every byte, with
// the old bytes or zeros after the cut: the primary's (the backup already
// new), the backup's (the primary still old), and, when the primary was
// damaged and is written first, the primary's and then the backup's. The
// boot is the old state, the new one, or the old proven slot without a
// trial (the flag is written before the proven slot).
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

// cutFiles is a boot folder whose power fails during the n-th rewrite
// (counting from 1): that write keeps only its first cut bytes (the rest
// is the old bytes, or zeros when zero is set: a lost page), and no later
// write reaches the disk.
type cutFiles struct {
	memFiles
	n, cut int
	zero   bool
	writes int
}

func (c *cutFiles) rewrite(name string, b []byte) error {
	c.writes++
	switch {
	case c.writes < c.n:
		return c.memFiles.rewrite(name, b)
	case c.writes > c.n:
		return nil // the power is off: nothing reaches the disk
	}
	old, err := c.memFiles.read(name)
	if err != nil {
		return err
	}
	torn := bytes.Clone(b[:c.cut])
	if c.zero {
		torn = append(torn, make([]byte, len(b)-c.cut)...)
	} else {
		torn = append(torn, old[c.cut:]...)
	}
	return c.memFiles.rewrite(name, torn)
}

// TestSelectBootPowerCutWhileClearingTheFlag: the power fails while the
// boot script clears the trial flag (the backup copy first, then the
// primary), at every byte of either write, before the trial kernel starts.
// The next power-on boots the proven slot, or the trial once more (the
// trial kernel never started), with its flag cleared: never a trial from
// a torn copy, never a trial that repeats.
func TestSelectBootPowerCutWhileClearingTheFlag(t *testing.T) {
	aTryB := State{Proven: SlotA, Trial: SlotB}
	armed := mustEncode(t, aTryB)
	outcomes := map[string]int{}
	for n := 1; n <= 2; n++ { // 1: the backup's write, 2: the primary's
		for cut := 0; cut <= EnvBlockSize; cut++ {
			for _, zero := range []bool{false, true} {
				files := &cutFiles{memFiles: memFiles{EnvFile: bytes.Clone(armed), BackupFile: bytes.Clone(armed)}, n: n, cut: cut, zero: zero}
				selectBoot(files) // the power fails: no kernel starts
				after := memFiles{EnvFile: files.memFiles[EnvFile], BackupFile: files.memFiles[BackupFile]}

				// The backup is cleared first, so the trial can come back
				// only from a primary the cut left armed as a whole.
				st, err := Decode(after[EnvFile])
				again := err == nil && st == aTryB
				sel := selectBoot(after)
				what := fmt.Sprintf("write %d cut at %d (zeros %v): %+v", n, cut, zero, sel)
				switch {
				case sel.Slot == SlotA && !sel.Trial && !again:
					outcomes["proven"]++
				case sel.Slot == SlotB && sel.Trial && again && sel.Source == SourcePrimary:
					outcomes["trial again"]++
				default:
					t.Fatalf("%s: want the trial again (%v) from an armed primary, else the proven slot", what, again)
				}
				// One shot: the boot after is the proven slot, whatever
				// this one did.
				next := selectBoot(after)
				assert.Assert(t, next.Slot == SlotA && !next.Trial, "%s, then %+v", what, next)
				for _, f := range []string{EnvFile, BackupFile} {
					if st, err := Decode(after[f]); err == nil {
						assert.Assert(t, st == State{Proven: SlotA}, "%s: %s reads %s", what, f, st)
					}
				}
			}
		}
	}
	t.Logf("next boots: %v", outcomes)
	// Both outcomes the failure table names happen.
	assert.Assert(t, outcomes["proven"] > 0 && outcomes["trial again"] > 0, "%v", outcomes)
}
