package boot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"liken.sh/liken/internal/atomicfile"
)

// Bootloader reads and writes the persistent boot state.
type Bootloader interface {
	// State returns the state the firmware acts on at the next power-on
	// (without the effect of that boot clearing the trial flag).
	State() (State, error)
	// ArmTrial makes the next boot, and only the next one, try slot. slot
	// must be the slot other than the proven one.
	ArmTrial(slot Slot) error
	// DisarmTrial withdraws an armed trial; the next boot is the proven slot.
	DisarmTrial() error
	// Commit makes slot the proven slot and clears the trial.
	Commit(slot Slot) error
	// Check reports a copy of the state that is corrupt, missing, or
	// different from the other (an interrupted write); any write repairs it.
	Check() error
	// KernelArgs returns the extra kernel arguments the next boot passes
	// (none when none are set), or why they cannot be read.
	KernelArgs() ([]string, error)
	// SetKernelArgs makes every boot from the next one pass args; a value
	// GRUB cannot pass unchanged is refused and nothing is written.
	SetKernelArgs(args []string) error
}

// The files in a boot directory (/boot/grub on a machine).
const (
	// EnvFile is the environment block GRUB's load_env reads by default.
	EnvFile = "grubenv"
	// BackupFile is the backup copy, written before EnvFile.
	BackupFile = "grubenv.bak"
)

// GRUB keeps the boot state in dir/grubenv and dir/grubenv.bak, the files
// liken's grub.cfg reads. Every write goes to the backup first and then to
// the primary, each rewritten in place (same file, same blocks) and synced,
// so that at any instant at least one copy holds a whole state, and GRUB,
// which can only rewrite existing blocks, can keep clearing the trial flag.
type GRUB struct {
	dir string
	mu  sync.Mutex
	// write replaces writeInPlace in tests.
	write func(path string, blk []byte) error
}

var _ Bootloader = (*GRUB)(nil)

// NewGRUB returns the GRUB bootloader whose files are in dir (/boot/grub on
// a machine). The files are created by the first write when missing.
func NewGRUB(dir string) Bootloader {
	return &GRUB{dir: dir, write: writeInPlace}
}

// Dir is the folder that holds the environment files.
func (g *GRUB) Dir() string { return g.dir }

// readEnvFile reads one copy. A missing file reads as nil (the firmware sees
// an invalid block); other errors are returned.
func readEnvFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading boot state %s: %w", path, err)
	}
	return b, nil
}

func (g *GRUB) read() (primary, backup []byte, err error) {
	primary, err = readEnvFile(filepath.Join(g.dir, EnvFile))
	if err != nil {
		return nil, nil, err
	}
	backup, err = readEnvFile(filepath.Join(g.dir, BackupFile))
	if err != nil {
		return nil, nil, err
	}
	return primary, backup, nil
}

// State returns the state the firmware acts on, with the firmware's rules:
// the primary copy when it is valid, else the backup, else the proven slot
// either copy still names (no trial), else slot A. A corrupt copy is not an
// error here (Check reports it); an unreadable file is.
func (g *GRUB) State() (State, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, b, err := g.read()
	if err != nil {
		return State{}, err
	}
	return decide(p, b).state, nil
}

// Check reports a corrupt or missing copy, or copies that disagree (a write
// that was interrupted). Any write (Commit of the proven slot, for one)
// repairs both copies.
func (g *GRUB) Check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, b, err := g.read()
	if err != nil {
		return err
	}
	var errs []error
	ps, perr := Decode(p)
	if perr != nil {
		errs = append(errs, fmt.Errorf("%s: %w", filepath.Join(g.dir, EnvFile), perr))
	}
	bs, berr := Decode(b)
	if berr != nil {
		errs = append(errs, fmt.Errorf("%s: %w", filepath.Join(g.dir, BackupFile), berr))
	}
	if perr == nil && berr == nil && ps != bs {
		errs = append(errs, fmt.Errorf("boot state copies disagree: %s holds %s, %s holds %s (a write was interrupted; the next write repairs it)", EnvFile, ps, BackupFile, bs))
	}
	return errors.Join(errs...)
}

// ArmTrial makes the next boot try slot once.
func (g *GRUB) ArmTrial(slot Slot) error {
	if _, err := ParseSlot(string(slot)); err != nil {
		return fmt.Errorf("arming a trial: %w", err)
	}
	return g.update(func(st State) (State, error) {
		if slot == st.Proven {
			return State{}, fmt.Errorf("arming a trial of slot %s: it is already the proven slot; a trial boots the other slot", slot)
		}
		return State{Proven: st.Proven, Trial: slot}, nil
	})
}

// KernelArgs reads dir/KernelArgsFile, the arguments grub.cfg passes to
// the kernel of whichever slot it boots.
func (g *GRUB) KernelArgs() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, KernelArgsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the kernel arguments: %w", err)
	}
	return ParseKernelArgsConfig(b)
}

// SetKernelArgs replaces dir/KernelArgsFile atomically (WriteKernelArgs),
// or leaves it alone when it already holds args.
func (g *GRUB) SetKernelArgs(args []string) error {
	if err := ValidateKernelArgs(args); err != nil {
		return err
	}
	if have, err := g.KernelArgs(); err == nil && slices.Equal(have, args) {
		return nil
	}
	release, err := Writable(g.dir)
	if err != nil {
		return err
	}
	defer release()
	g.mu.Lock()
	defer g.mu.Unlock()
	return WriteKernelArgs(g.dir, args)
}

// DisarmTrial clears an armed trial.
func (g *GRUB) DisarmTrial() error {
	return g.update(func(st State) (State, error) {
		return State{Proven: st.Proven}, nil
	})
}

// Commit makes slot the proven slot and clears the trial.
func (g *GRUB) Commit(slot Slot) error {
	if _, err := ParseSlot(string(slot)); err != nil {
		return fmt.Errorf("committing a slot: %w", err)
	}
	return g.update(func(State) (State, error) {
		return State{Proven: slot}, nil
	})
}

func (g *GRUB) update(change func(State) (State, error)) error {
	release, err := Writable(g.dir)
	if err != nil {
		return err
	}
	defer release()
	g.mu.Lock()
	defer g.mu.Unlock()
	p, b, err := g.read()
	if err != nil {
		return err
	}
	next, err := change(decide(p, b).state)
	if err != nil {
		return err
	}
	// Keep other variables (set with grub-editenv, say) from the copy the
	// firmware would read.
	base := b
	if envOpen(p) {
		base = p
	}
	blk, err := Encode(next, keepVars(base))
	if err != nil {
		// Other variables do not fit: liken's state matters more.
		if blk, err = Encode(next, nil); err != nil {
			return err
		}
	}
	// The backup first, so the primary GRUB reads stays whole until the
	// backup holds the new state. But when the primary is damaged, it is
	// written first: the backup is then the only whole copy and must stay
	// so until the primary holds the new state.
	order := []string{BackupFile, EnvFile}
	if _, err := Decode(p); err != nil {
		if _, berr := Decode(b); berr == nil {
			order = []string{EnvFile, BackupFile}
		}
	}
	for _, name := range order {
		if err := g.write(filepath.Join(g.dir, name), blk); err != nil {
			return fmt.Errorf("writing boot state %s: %w", next, err)
		}
	}
	return nil
}

// writeInPlace overwrites path from its first byte with blk, cuts anything
// after it, and syncs. It creates a missing file (and syncs the folder).
func writeInPlace(path string, blk []byte) error {
	created := false
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		created = true
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(blk, 0); err != nil {
		f.Close()
		return err
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(blk)) {
		if err := f.Truncate(int64(len(blk))); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if created {
		return atomicfile.SyncDir(filepath.Dir(path))
	}
	return nil
}
