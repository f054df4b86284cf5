package boot

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ExitReboot is the exit code of the lab's liken-node for a reboot: the
// lab's simulated firmware boots the machine again when it sees it.
const ExitReboot = 100

// Source says which copy a boot decision came from.
type Source string

// Sources of a boot decision.
const (
	SourcePrimary  Source = "primary"  // grubenv was valid
	SourceBackup   Source = "backup"   // grubenv was not, grubenv.bak was
	SourceFallback Source = "fallback" // neither was valid as a whole
)

// decision is what liken's boot script concludes from the two copies
// before it touches anything.
type decision struct {
	// state is the state acted on; state.Trial is set when a trial is armed
	// in the copy the decision came from.
	state  State
	source Source
}

// decide applies the boot script's reading rules to the two copies: the
// primary when valid, else the backup when valid, else the proven slot the
// primary still names, else the one the backup names, else slot A.
func decide(primary, backup []byte) decision {
	pv := readView(primary)
	if pv.valid() {
		return decision{state: pv.state(), source: SourcePrimary}
	}
	bv := readView(backup)
	if bv.valid() {
		return decision{state: bv.state(), source: SourceBackup}
	}
	st := State{Proven: SlotA}
	if s := pv.provenSlot(); s != "" {
		st.Proven = s
	} else if s := bv.provenSlot(); s != "" {
		st.Proven = s
	}
	return decision{state: st, source: SourceFallback}
}

// Selection is the outcome of one simulated power-on.
type Selection struct {
	// Slot is the slot to boot.
	Slot Slot
	// Trial is true on a trial boot (kernel argument liken.trial=1).
	Trial bool
	// Source is the copy the decision came from.
	Source Source
	// Note explains a boot that is not what the environment asked for
	// (a copy was corrupt, or the trial flag could not be cleared).
	Note string
}

// SelectBoot does at power-on exactly what liken's grub.cfg does, on the
// same files: it is the lab's simulated firmware. See SelectBootDetail.
func SelectBoot(dir string) (slot Slot, trial bool, err error) {
	sel, err := SelectBootDetail(dir)
	if err != nil {
		return "", false, err
	}
	return sel.Slot, sel.Trial, nil
}

// SelectBootDetail chooses the slot as grub.cfg does, clearing a trial flag
// before it boots the trial (docs/design/boot.md#reading-the-state-every-power-on);
// it fails only when dir itself cannot be read.
func SelectBootDetail(dir string) (Selection, error) {
	if _, err := os.ReadDir(dir); err != nil {
		return Selection{}, fmt.Errorf("simulated firmware: boot folder: %w", err)
	}
	return selectBoot(osFiles(dir)), nil
}

// envFiles is the firmware's view of the boot folder: read a whole file,
// and rewrite an existing file's bytes in place.
type envFiles interface {
	read(name string) ([]byte, error)
	rewrite(name string, b []byte) error
}

// osFiles is a boot folder on disk.
type osFiles string

func (d osFiles) read(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}

func (d osFiles) rewrite(name string, b []byte) error {
	f, err := os.OpenFile(filepath.Join(string(d), name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func selectBoot(files envFiles) Selection {
	primary, _ := files.read(EnvFile) // unreadable is invalid, as in GRUB
	backup, _ := files.read(BackupFile)

	d := decide(primary, backup)
	sel := Selection{Slot: d.state.Proven, Source: d.source}
	switch d.source {
	case SourceBackup:
		sel.Note = fmt.Sprintf("%s is not valid; used %s", EnvFile, BackupFile)
	case SourceFallback:
		sel.Note = fmt.Sprintf("neither %s nor %s is valid; booting slot %s", EnvFile, BackupFile, sel.Slot)
	}
	if d.state.Trial == "" {
		return sel
	}

	from := EnvFile
	if d.source == SourceBackup {
		from = BackupFile
	} else {
		_ = saveEnvVar(files, BackupFile, VarTrial, "0") // best effort, as in grub.cfg
	}
	if err := saveEnvVar(files, from, VarTrial, "0"); err != nil {
		sel.Note = fmt.Sprintf("could not clear the trial flag (%v); booting the proven slot %s", err, sel.Slot)
		return sel
	}
	after, _ := files.read(from)
	if v := readView(after); !v.valid() || v.provenSlot() != d.state.Proven || v.trial != "0" {
		sel.Note = fmt.Sprintf("trial flag still reads %q after clearing it; booting the proven slot %s", v.trial, sel.Slot)
		return sel
	}
	sel.Slot, sel.Trial = d.state.Trial, true
	return sel
}

// saveEnvVar does what GRUB's `save_env -f file name` does with name set to
// value: it edits the existing block in memory and writes it back over the
// same bytes. It cannot create a file, and fails on a block without the
// signature or without room.
func saveEnvVar(files envFiles, file, name, value string) error {
	b, err := files.read(file)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s does not exist", file)
	}
	if err != nil {
		return err
	}
	if !envOpen(b) {
		return fmt.Errorf("%s: %w", file, errNoSignature(b))
	}
	nb := bytes.Clone(b)
	if !envSet(nb, name, value) {
		return fmt.Errorf("%s: environment block is broken or too small to set %s", file, name)
	}
	return files.rewrite(file, nb)
}
