package boot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

func TestGRUBLifecycle(t *testing.T) {
	dir := t.TempDir()
	bl := NewGRUB(dir)

	st, err := bl.State()
	assert.NilError(t, err)
	assert.Equal(t, st, State{Proven: SlotA}, "no files: the firmware boots A")

	// Installation.
	assert.NilError(t, bl.Commit(SlotA))
	for _, f := range []string{EnvFile, BackupFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		assert.NilError(t, err)
		assert.Equal(t, fi.Size(), int64(EnvBlockSize))
	}
	assert.NilError(t, bl.(*GRUB).Check())

	// Upgrade to B: arm, the firmware tries B once, commit.
	assert.ErrorContains(t, bl.ArmTrial(SlotA), "already the proven slot")
	assert.ErrorContains(t, bl.ArmTrial("C"), "invalid boot slot")
	assert.NilError(t, bl.ArmTrial(SlotB))
	st, err = bl.State()
	assert.NilError(t, err)
	assert.Equal(t, st, State{Proven: SlotA, Trial: SlotB})
	slot, trial, err := SelectBoot(dir)
	assert.NilError(t, err)
	assert.Equal(t, slot, SlotB)
	assert.Assert(t, trial)
	st, err = bl.State()
	assert.NilError(t, err)
	assert.Equal(t, st, State{Proven: SlotA}, "the firmware cleared the flag")
	assert.NilError(t, bl.Commit(SlotB))
	slot, trial, err = SelectBoot(dir)
	assert.NilError(t, err)
	assert.Equal(t, slot, SlotB)
	assert.Assert(t, !trial)

	// Arm, then withdraw.
	assert.NilError(t, bl.ArmTrial(SlotA))
	assert.NilError(t, bl.DisarmTrial())
	slot, trial, err = SelectBoot(dir)
	assert.NilError(t, err)
	assert.Equal(t, slot, SlotB)
	assert.Assert(t, !trial)
	assert.ErrorContains(t, bl.Commit(""), "invalid boot slot")
}

func TestGRUBKeepsOtherVariables(t *testing.T) {
	blk, err := NewEnvBlock([]EnvVar{{"saved_entry", "x"}, {VarTrial, "0"}, {VarProven, "B"}})
	assert.NilError(t, err)
	dir := bootDir(t, blk, blk)
	assert.NilError(t, NewGRUB(dir).ArmTrial(SlotA))
	for _, f := range []string{EnvFile, BackupFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		assert.NilError(t, err)
		vars, err := ParseEnvBlock(b)
		assert.NilError(t, err)
		assert.DeepEqual(t, vars, []EnvVar{{"saved_entry", "x"}, {VarTrial, "1"}, {VarProven, "B"}})
	}

	// Others that do not fit with liken's state are dropped, not liken's.
	big := bytes.Clone(blk)
	assert.Assert(t, envSet(big, "big", strings.Repeat("v", 850)))
	dir = bootDir(t, big, big)
	assert.NilError(t, NewGRUB(dir).Commit(SlotA))
	st, err := readState(t, filepath.Join(dir, EnvFile))
	assert.NilError(t, err)
	assert.Equal(t, st, State{Proven: SlotA})
}

// TestGRUBWriteOrder: the backup is written first; an interrupted write
// leaves the primary with the old state, which the firmware still boots.
func TestGRUBWriteOrder(t *testing.T) {
	dir := bootDir(t, mustEncode(t, State{Proven: SlotA}), mustEncode(t, State{Proven: SlotA}))
	g := NewGRUB(dir).(*GRUB)
	var order []string
	g.write = func(path string, blk []byte) error {
		order = append(order, filepath.Base(path))
		if filepath.Base(path) == EnvFile {
			return errors.New("power lost")
		}
		return writeInPlace(path, blk)
	}
	assert.ErrorContains(t, g.ArmTrial(SlotB), "writing boot state proven=A trial=B: power lost")
	assert.DeepEqual(t, order, []string{BackupFile, EnvFile})
	slot, trial, err := SelectBoot(dir)
	assert.NilError(t, err)
	assert.Equal(t, slot, SlotA)
	assert.Assert(t, !trial)
	assert.ErrorContains(t, g.Check(), "copies disagree")
	// The next complete write repairs both.
	g.write = writeInPlace
	assert.NilError(t, g.Commit(SlotA))
	assert.NilError(t, g.Check())
}

// TestGRUBWriteOrderDamagedPrimary: with a damaged primary the backup is
// the only whole copy, so the primary is written first; a power cut that
// loses the page being written (zeros) still boots the proven slot.
func TestGRUBWriteOrderDamagedPrimary(t *testing.T) {
	dir := bootDir(t, []byte("garbage"), mustEncode(t, State{Proven: SlotB}))
	g := NewGRUB(dir).(*GRUB)
	var order []string
	g.write = func(path string, blk []byte) error {
		order = append(order, filepath.Base(path))
		if err := os.WriteFile(path, make([]byte, EnvBlockSize), 0o644); err != nil {
			return err
		}
		return errors.New("power lost")
	}
	assert.ErrorContains(t, g.ArmTrial(SlotA), "power lost")
	assert.DeepEqual(t, order, []string{EnvFile})
	slot, trial, err := SelectBoot(dir)
	assert.NilError(t, err)
	assert.Equal(t, slot, SlotB)
	assert.Assert(t, !trial)
}

func TestGRUBRepairsCorruptCopies(t *testing.T) {
	dir := bootDir(t, []byte("garbage"), mustEncode(t, State{Proven: SlotB}))
	g := NewGRUB(dir).(*GRUB)
	st, err := g.State()
	assert.NilError(t, err)
	assert.Equal(t, st, State{Proven: SlotB})
	assert.ErrorContains(t, g.Check(), "grubenv: boot state is corrupt")
	assert.NilError(t, g.ArmTrial(SlotA))
	assert.NilError(t, g.Check())
	fi, err := os.Stat(filepath.Join(dir, EnvFile))
	assert.NilError(t, err)
	assert.Equal(t, fi.Size(), int64(EnvBlockSize))

	// A longer file is cut to one block.
	long := append(mustEncode(t, State{Proven: SlotB}), bytes.Repeat([]byte("x"), 3000)...)
	dir = bootDir(t, long, long)
	assert.NilError(t, NewGRUB(dir).Commit(SlotB))
	fi, err = os.Stat(filepath.Join(dir, BackupFile))
	assert.NilError(t, err)
	assert.Equal(t, fi.Size(), int64(EnvBlockSize))
}

func TestGRUBUnreadable(t *testing.T) {
	dir := t.TempDir()
	// A folder where the file should be cannot be read: that is an error,
	// not a silent fallback to slot A.
	assert.NilError(t, os.Mkdir(filepath.Join(dir, EnvFile), 0o755))
	g := NewGRUB(dir)
	_, err := g.State()
	assert.ErrorContains(t, err, "reading boot state")
	assert.ErrorContains(t, g.Commit(SlotB), "reading boot state")
}

func TestGrubConfig(t *testing.T) {
	cfg := string(GrubConfig())
	// The order that makes the trial one-shot: the flag is saved as 0
	// before the trial kernel is loaded.
	save := strings.Index(cfg, `save_env -f "${liken_from}" liken_trial`)
	boot := strings.LastIndex(cfg, `liken_boot "${liken_slot}" "${liken_try}"`)
	assert.Assert(t, save > 0 && boot > save, "save_env must come before the kernel is loaded")
	for _, want := range []string{"load_env -f \"$1\" " + VarProven + " " + VarTrial, CmdlineSlot + "=$1", CmdlineTrial + "=1", "panic=${liken_panic}", BackupFile, EnvFile} {
		assert.Assert(t, strings.Contains(cfg, want), "grub.cfg lacks %q", want)
	}
	// A trial boot, and only a trial boot, panics when it hangs: the guard
	// is TrialGuardArgs, added with liken.trial=1.
	assert.Assert(t, strings.Contains(cfg, "\nset liken_trial_guard=\""+strings.Join(TrialGuardArgs, " ")+"\"\n"), "grub.cfg's guard is not TrialGuardArgs")
	assert.Equal(t, strings.Count(cfg, "${liken_trial_guard}"), 1)
	assert.Assert(t, strings.Contains(cfg, `set liken_args="${liken_args} `+CmdlineTrial+`=1 ${liken_trial_guard}"`))
	// The extra kernel arguments: cleared, then read from the file only
	// when it exists, before any slot is booted.
	clear := strings.Index(cfg, "\nset "+VarKernelArgs+"=\n")
	source := strings.Index(cfg, `if [ -f "${prefix}/`+KernelArgsFile+`" ]; then
  source "${prefix}/`+KernelArgsFile+`"
fi`)
	firstBoot := strings.Index(cfg, "\nliken_boot ")
	assert.Assert(t, clear > 0 && source > clear && firstBoot > source, "clear %d, source %d, first boot %d", clear, source, firstBoot)

	// Every kernel line is in liken_boot, which boots the slot it is given
	// (the trial, and the proven slot after it), and carries the extra
	// arguments after liken's own, so that a line too long loses only
	// extra arguments.
	var linux []string
	for _, l := range strings.Split(cfg, "\n") {
		if l = strings.TrimSpace(l); strings.Contains(l, "linux ") && !strings.HasPrefix(l, "#") {
			linux = append(linux, l)
		}
	}
	assert.DeepEqual(t, linux, []string{
		`if linux "/$1/vmlinuz" ${liken_args} ${liken_cmdline} ${` + VarKernelArgs + `}; then`,
	})
	fn := cfg[strings.Index(cfg, "function liken_boot {"):]
	fn = fn[:strings.Index(fn, "\n}\n")]
	for _, l := range linux {
		assert.Assert(t, strings.Contains(fn, l), "%q is not in liken_boot", l)
	}
	assert.Assert(t, strings.Contains(cfg, `liken_boot "${liken_slot}" "${liken_try}"`))
	assert.Assert(t, strings.Contains(cfg, `liken_boot "${liken_proven}" 0`))

	// Callers get their own copy.
	GrubConfig()[0] = 'x'
	assert.Assert(t, GrubConfig()[0] == '#')
}

// TestGRUBKernelArgs: the arguments land in the file liken's grub.cfg
// sources (${prefix}/liken-args.cfg) in the form it reads back; refused
// arguments name themselves and leave the file as it was; writing the
// arguments it already holds writes nothing; no file reads as none.
func TestGRUBKernelArgs(t *testing.T) {
	dir := t.TempDir()
	bl := NewGRUB(dir)
	args, err := bl.KernelArgs()
	assert.NilError(t, err)
	assert.Equal(t, len(args), 0, "no file: no arguments")

	want := []string{"mitigations=off", "memmap=4G$16G", "isolcpus=1-3"}
	assert.NilError(t, bl.SetKernelArgs(want))
	path := filepath.Join(dir, KernelArgsFile)
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(b), "\nset liken_kernel_args='mitigations=off memmap=4G$16G isolcpus=1-3'\n"), "%s", b)
	args, err = bl.KernelArgs()
	assert.NilError(t, err)
	assert.DeepEqual(t, args, want)

	for _, tc := range []struct{ arg, err string }{
		{`init="/bin/sh"`, `kernel argument "init=\"/bin/sh\"" holds the character '"'`},
		{"a=x; reboot", `kernel argument "a=x; reboot" holds white space`},
		{"a=';reboot;'", `kernel argument "a=';reboot;'" holds the character '\''`},
		{"liken.slot=B", `kernel argument "liken.slot=B": parameters named liken.* belong to liken's boot script`},
		{"--", `kernel argument "--" would pass`},
		{"panic=0", `kernel argument "panic=0": liken's boot script sets panic=`},
	} {
		assert.ErrorContains(t, bl.SetKernelArgs([]string{"quiet", tc.arg}), tc.err)
		after, err := os.ReadFile(path)
		assert.NilError(t, err)
		assert.Equal(t, string(after), string(b), "a refused argument changed the file")
	}

	// The same arguments again: the file is not rewritten.
	old := time.Unix(1, 0)
	assert.NilError(t, os.Chtimes(path, old, old))
	assert.NilError(t, bl.SetKernelArgs(want))
	fi, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Assert(t, fi.ModTime().Equal(old), "the same arguments rewrote the file")

	// No arguments: the file says so (the slot boots with none).
	assert.NilError(t, bl.SetKernelArgs(nil))
	b, err = os.ReadFile(path)
	assert.NilError(t, err)
	args, err = ParseKernelArgsConfig(b)
	assert.NilError(t, err)
	assert.Equal(t, len(args), 0)
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 1, "temporary files left: %v", ents)

	// A file that is not the one liken writes (cut short, edited by hand)
	// is an error that names it.
	assert.NilError(t, os.WriteFile(path, b[:len(b)-3], 0o644))
	_, err = bl.KernelArgs()
	assert.ErrorContains(t, err, KernelArgsFile)
}
