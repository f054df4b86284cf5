package boote2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
)

// stagedArgsFile writes args with the node's boot loader, as liken-node
// does right before its turn's reboot, and returns the file it wrote on
// the boot partition.
func stagedArgsFile(t *testing.T, args []string) []byte {
	t.Helper()
	dir := t.TempDir()
	assert.NilError(t, boot.NewGRUB(dir).SetKernelArgs(args))
	b, err := os.ReadFile(filepath.Join(dir, boot.KernelArgsFile))
	assert.NilError(t, err)
	return b
}

// expectCmdline waits for the init's report of /proc/cmdline, checks that
// liken's boot script started the slot, and returns the arguments.
func (m *machine) expectCmdline(slot boot.Slot, trial bool) []string {
	m.t.Helper()
	line := strings.TrimPrefix(m.expectLine("LIKEN-CMDLINE "), "LIKEN-CMDLINE ")
	s, tr, err := boot.ParseCmdline(line)
	assert.NilError(m.t, err, "the kernel command line %q", line)
	assert.Equal(m.t, s, slot)
	assert.Equal(m.t, tr, trial)
	return strings.Fields(line)
}

// TestKernelArgs: liken-node writes settings.kernelArgs on the boot
// partition, GRUB passes them unchanged (every character an argument may
// hold) to the trial slot's kernel, after liken's own, the trial's guard
// (boot.TrialGuardArgs) among them; the trial fails, and the proven slot
// boots with the same arguments (the written arguments apply to whichever
// slot boots next), without the guard.
func TestKernelArgs(t *testing.T) {
	t.Parallel()
	args := []string{
		"likentest.first=1",
		"likentest.punct=!#$%&()+,-./:;<=>@^_`{|}~",
		"likentest.var=${prefix}$liken_panic",
		"likentest_flag",
		"mitigations=auto",
	}
	primary, backup := armed(t, boot.SlotA, boot.SlotB)
	m := newMachine(t, DiskSpec{
		Scenario: map[boot.Slot]string{boot.SlotB: "panic"},
		Primary:  primary, Backup: backup,
		Files: map[string][]byte{changes.KernelArgsFile: stagedArgsFile(t, args)},
	})

	m.powerOn()
	got := m.expectCmdline(boot.SlotB, true)
	assert.DeepEqual(t, got[len(got)-len(args):], args)
	assert.Assert(t, slices.Index(got, "liken.slot=B") < len(got)-len(args), "liken's arguments come first: %q", got)
	for _, g := range boot.TrialGuardArgs {
		assert.Assert(t, slices.Index(got, g) >= 0 && slices.Index(got, g) < len(got)-len(args), "the trial's guard %s among liken's arguments: %q", g, got)
	}
	m.expectBoot(boot.SlotB, true)
	m.expect("LIKEN-PANIC")

	got = m.expectCmdline(boot.SlotA, false)
	assert.DeepEqual(t, got[len(got)-len(args):], args)
	for _, g := range boot.TrialGuardArgs {
		assert.Assert(t, !slices.Contains(got, g), "the proven slot boots with the trial's guard %s: %q", g, got)
	}
	m.expectBoot(boot.SlotA, false)
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotA})
}

// TestKernelArgsFileDamaged: an arguments file that is cut short (GRUB
// reports a syntax error and goes on), empty, or too long for the kernel
// still boots, a trial included, with liken's own arguments whole.
func TestKernelArgsFileDamaged(t *testing.T) {
	t.Parallel()
	staged := stagedArgsFile(t, []string{"likentest.a=1", "likentest.b=2"})
	cut := staged[:len(staged)-len("b=2'\n")]
	long := "# more than the kernel's 2048 bytes, written by hand\nset liken_kernel_args='likentest.first=1" +
		strings.Repeat(" likentest.long=0123456789", 100) + " likentest.last=1'\n"
	tests := []struct {
		name  string
		file  []byte
		check func(t *testing.T, extra []string)
	}{
		{"cut short: no extra arguments", cut, func(t *testing.T, extra []string) {
			assert.DeepEqual(t, extra, []string(nil))
		}},
		{"empty: no extra arguments", []byte{}, func(t *testing.T, extra []string) {
			assert.DeepEqual(t, extra, []string(nil))
		}},
		{"too long: GRUB drops the extra arguments that do not fit", []byte(long), func(t *testing.T, extra []string) {
			assert.Assert(t, len(extra) > 1 && extra[0] == "likentest.first=1", "%q", extra)
			assert.Assert(t, !slices.Contains(extra, "likentest.last=1"), "the line was not cut")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, backup := armed(t, boot.SlotA, boot.SlotB)
			m := newMachine(t, DiskSpec{Primary: primary, Backup: backup,
				Files: map[string][]byte{changes.KernelArgsFile: tc.file}})
			m.powerOn()
			got := m.expectCmdline(boot.SlotB, true)
			var extra []string
			for _, a := range got {
				if strings.HasPrefix(a, "likentest.") {
					extra = append(extra, a)
				}
			}
			tc.check(t, extra)
			f := m.expectBoot(boot.SlotB, true)
			assert.Equal(t, f["state"], "A/-", "GRUB cleared the trial flag")
			m.waitPowerOff()
		})
	}
}
