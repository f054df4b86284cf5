package boote2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/boot"
)

// TestTrialCommitted: the trial boots B once, the slot commits B, and the
// next boot is B without a trial.
func TestTrialCommitted(t *testing.T) {
	t.Parallel()
	primary, backup := armed(t, boot.SlotA, boot.SlotB)
	m := newMachine(t, DiskSpec{Scenario: map[boot.Slot]string{boot.SlotB: "commit"}, Primary: primary, Backup: backup})
	sel, _, _ := m.simulate()
	assert.Equal(t, sel, boot.Selection{Slot: boot.SlotB, Trial: true, Source: boot.SourcePrimary})

	m.powerOn()
	f := m.expectBoot(boot.SlotB, true)
	// GRUB cleared the flag in both copies before it loaded this kernel.
	assert.Equal(t, f["state"], "A/-")
	assert.Equal(t, f["primary"], "A/-")
	assert.Equal(t, f["backup"], "A/-")
	f = m.expect("LIKEN-COMMIT ")
	assert.Equal(t, f["state"], "B/-")
	m.expectBoot(boot.SlotB, false)
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotB})
}

// TestTrialPanics: the trial kernel's init dies, the kernel panics and
// reboots (panic=N), and GRUB boots the proven slot without help.
func TestTrialPanics(t *testing.T) {
	t.Parallel()
	primary, backup := armed(t, boot.SlotA, boot.SlotB)
	m := newMachine(t, DiskSpec{Scenario: map[boot.Slot]string{boot.SlotB: "panic"}, Primary: primary, Backup: backup})
	_, simPrimary, simBackup := m.simulate()

	m.powerOn()
	m.expectBoot(boot.SlotB, true)
	m.expect("LIKEN-PANIC")
	f := m.expectBoot(boot.SlotA, false)
	assert.Equal(t, f["state"], "A/-")
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotA})
	m.assertSameAsFirmware(simPrimary, simBackup)
}

// TestTrialHangs: the trial's init arms the hardware watchdog and hangs;
// the watchdog resets the machine, which boots the proven slot.
func TestTrialHangs(t *testing.T) {
	t.Parallel()
	primary, backup := armed(t, boot.SlotB, boot.SlotA)
	m := newMachine(t, DiskSpec{Scenario: map[boot.Slot]string{boot.SlotA: "hang"}, Primary: primary, Backup: backup})

	m.powerOn()
	m.expectBoot(boot.SlotA, true)
	m.expect("LIKEN-HANG")
	hung := time.Now()
	m.expectBoot(boot.SlotB, false)
	t.Logf("the watchdog reset the machine and it booted the proven slot %.1fs after the hang", time.Since(hung).Seconds())
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotB})
}

// TestPowerCutDuringTrial: QEMU is killed while the trial runs; the next
// power-on boots the proven slot.
func TestPowerCutDuringTrial(t *testing.T) {
	t.Parallel()
	primary, backup := armed(t, boot.SlotA, boot.SlotB)
	m := newMachine(t, DiskSpec{Scenario: map[boot.Slot]string{boot.SlotB: "wait"}, Primary: primary, Backup: backup})
	_, simPrimary, simBackup := m.simulate()

	m.powerOn()
	m.expectBoot(boot.SlotB, true)
	m.expect("LIKEN-WAIT")
	m.vm.Kill()
	m.assertSameAsFirmware(simPrimary, simBackup)

	m.powerOn()
	m.expectBoot(boot.SlotA, false)
	m.waitPowerOff()
	m.assertStates(boot.State{Proven: boot.SlotA})
}

// TestCorruptEnvironment: damaged copies boot the proven slot, exactly as
// the simulated firmware decides.
func TestCorruptEnvironment(t *testing.T) {
	t.Parallel()
	garbage := bytes.Repeat([]byte("\xffliken"), boot.EnvBlockSize/6+1)[:boot.EnvBlockSize]
	provenB, _ := armed(t, boot.SlotB, "")
	aTryB, _ := armed(t, boot.SlotA, boot.SlotB)
	badFlag := bytes.Replace(bytes.Clone(provenB), []byte("liken_trial=0"), []byte("liken_trial=7"), 1)
	zeroSig := bytes.Clone(aTryB)
	zeroSig[2] = 'g' // "# gRUB Environment Block": not a block for GRUB
	// The flag twice: save_env clears the first entry, load_env still reads
	// the second as 1, so the trial must not happen.
	twice := bytes.Replace(bytes.Clone(aTryB), []byte("liken_trial=1\n"), []byte("liken_trial=1\nliken_trial=1\n"), 1)[:boot.EnvBlockSize]
	tests := []struct {
		name            string
		primary, backup []byte
		slot            boot.Slot
		trial           bool
	}{
		{"primary garbage: backup proven B", garbage, provenB, boot.SlotB, false},
		{"primary names B with a bad flag and backup garbage: B", badFlag, garbage, boot.SlotB, false},
		{"both garbage: A", garbage, garbage, boot.SlotA, false},
		{"primary signature broken and backup arms B: trial B", zeroSig, aTryB, boot.SlotB, true},
		{"flag that cannot be cleared: A", twice, aTryB, boot.SlotA, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newMachine(t, DiskSpec{Primary: tc.primary, Backup: tc.backup})
			sel, simPrimary, simBackup := m.simulate()
			assert.Equal(t, sel.Slot, tc.slot, "simulated firmware")
			assert.Equal(t, sel.Trial, tc.trial, "simulated firmware")
			m.powerOn()
			m.expectBoot(tc.slot, tc.trial)
			m.waitPowerOff()
			m.assertSameAsFirmware(simPrimary, simBackup)
		})
	}
}

// TestSaveEnvReadByGo: GRUB's save_env rewrites a block grub-editenv made
// (other variables, escapes); the Go codec reads the result, inside the
// machine and on the host, and the bytes are what grub-editenv and the
// simulated firmware produce for the same change.
func TestSaveEnvReadByGo(t *testing.T) {
	t.Parallel()
	k := kit(t)
	env := filepath.Join(t.TempDir(), "grubenv")
	editenv := func(args ...string) {
		t.Helper()
		cmd := exec.Command(k.Tool("grub-editenv"), append([]string{env}, args...)...)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+k.LibraryPath())
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "grub-editenv: %s", out)
	}
	editenv("create")
	editenv("set", `saved_entry=a\b`, "liken_trial=1", "liken_proven=B", "note=two\nlines")
	original, err := os.ReadFile(env)
	assert.NilError(t, err)
	editenv("set", "liken_trial=0")
	cleared, err := os.ReadFile(env)
	assert.NilError(t, err)

	m := newMachine(t, DiskSpec{Primary: original, Backup: original})
	_, simPrimary, simBackup := m.simulate()
	assert.Assert(t, bytes.Equal(simPrimary, cleared), "the simulated firmware's save_env differs from grub-editenv's")
	assert.Assert(t, bytes.Equal(simBackup, cleared))

	m.powerOn()
	f := m.expectBoot(boot.SlotA, true)
	assert.Equal(t, f["primary"], "B/-", "the Go codec in the machine reads GRUB's write")
	assert.Equal(t, f["backup"], "B/-")
	m.waitPowerOff()
	m.assertSameAsFirmware(cleared, cleared)
	got, err := m.disk.ReadEnv(boot.EnvFile)
	assert.NilError(t, err)
	vars, err := boot.ParseEnvBlock(got)
	assert.NilError(t, err)
	assert.DeepEqual(t, vars, []boot.EnvVar{{Name: "saved_entry", Value: `a\b`}, {Name: "liken_trial", Value: "0"}, {Name: "liken_proven", Value: "B"}, {Name: "note", Value: "two\nlines"}})
}

// TestBootFilesMissing: a slot whose kernel or initramfs is missing from
// the boot partition, or is not one. A trial of it ends on the proven slot
// at once (GRUB cleared the flag before it tried): directly when a file is
// missing, through a restart when GRUB began to load it. The proven slot's
// own kernel missing is not papered over with the other slot: GRUB says
// so, waits, and restarts into the same choice.
func TestBootFilesMissing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		trial boot.Slot // armed over proven A, or none
		omit  []string
		files map[string][]byte
		// restart: GRUB restarts the machine before it boots the proven slot.
		restart bool
	}{
		{name: "trial kernel missing: the proven slot boots", trial: boot.SlotB, omit: []string{"B/vmlinuz"}},
		{name: "trial initramfs missing: the proven slot boots", trial: boot.SlotB, omit: []string{"B/initrd.img"}},
		{name: "trial kernel not a kernel: a restart, then the proven slot", trial: boot.SlotB,
			files: map[string][]byte{"B/vmlinuz": bytes.Repeat([]byte("not a kernel\n"), 1000)}, restart: true},
		{name: "proven kernel missing: GRUB restarts, never the other slot", omit: []string{"A/vmlinuz"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			primary, backup := armed(t, boot.SlotA, tc.trial)
			m := newMachine(t, DiskSpec{Primary: primary, Backup: backup, Omit: tc.omit, Files: tc.files})
			m.powerOn()
			if tc.trial != "" {
				m.expectLine("liken: booting slot B (trial 1)")
				m.expectLine("liken: slot B could not be loaded")
				if tc.restart {
					m.expectLine("liken: restarting to boot the proven slot A")
				}
				m.expectLine("liken: booting slot A (trial 0)")
				f := m.expectBoot(boot.SlotA, false)
				assert.Equal(t, f["state"], "A/-", "GRUB cleared the flag before it tried B")
				m.waitPowerOff()
				m.assertStates(boot.State{Proven: boot.SlotA})
				return
			}
			m.expectLine("liken: booting slot A (trial 0)")
			m.expectLine("liken: slot A could not be loaded")
			m.expectLine("liken: no slot could be loaded; rebooting in 30 seconds")
			// The restart: GRUB starts again and makes the same choice.
			m.expectLine("liken: booting slot A (trial 0)")
			m.expectLine("liken: slot A could not be loaded")
			assert.Assert(t, !strings.Contains(m.vm.Output(), "LIKEN-INIT"), "a slot booted although the proven slot has no kernel")
			m.vm.Kill()
			m.assertSameAsFirmware(primary, backup)
		})
	}
}
