// Package slots keeps a machine's two boot slots and their states on disk.
//
// Layout under the store's root directory:
//
//	slots/A/, slots/B/   release.yaml and the artifacts of the slot's release
//	state/slots.json     the state of each slot and the progress of the
//	                     download under way, replaced atomically with fsync
//
// and, with WithBootPartition, on the boot partition GRUB reads:
//
//	A/, B/               vmlinuz and initrd.img: the slot's kernel and
//	                     initramfs, from a Staged or Active slot's release
//
// The store enforces the rules that keep a machine bootable: the slot the
// machine runs from and a proven (Active) slot are never written, a slot
// is marked Downloading before any byte of a new release is written into
// it, and a slot becomes Staged only through Stage, which re-reads and
// re-hashes its whole content against the release digest. A slot's boot
// files are removed as soon as a download into it begins, and installed,
// verified, only by Stage.
package slots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/release"
)

// Slot names.
const (
	A = "A"
	B = "B"
)

// Names of the store's directories and state file.
const (
	slotsDir  = "slots"
	stateDir  = "state"
	stateFile = "slots.json"
	// maxStateBytes bounds the state file read at open.
	maxStateBytes = 1 << 20
	stateVersion  = 1
)

// Errors the store refuses an operation with.
var (
	// ErrBootedSlot: the operation would write or clear the slot the
	// machine runs from.
	ErrBootedSlot = errors.New("the machine runs from this slot; liken never writes or clears it")
	// ErrActiveSlot: the operation would write or clear the proven slot.
	ErrActiveSlot = errors.New("this slot holds the proven release (Active); liken never writes or clears it until another slot is committed")
	// ErrWithdrawn: the download was withdrawn, staged or replaced; its
	// handle no longer writes.
	ErrWithdrawn = errors.New("this download was withdrawn or replaced; it may no longer write to the slot")
	// ErrAlreadyStaged: the slot already holds this release, verified.
	ErrAlreadyStaged = errors.New("the slot already holds this release, staged")
	// ErrWrongState: the slot is not in a state that allows the operation.
	ErrWrongState = errors.New("the slot is not in a state that allows this")
)

// Info is the state of one slot.
type Info struct {
	// Name is A or B.
	Name string `json:"name"`
	// State is Active, Staged, Downloading, Previous, Empty or Failed.
	State v1alpha1.SlotState `json:"state"`
	// Version and Digest name the release in the slot (or being
	// downloaded into it).
	Version string `json:"version,omitempty"`
	Digest  string `json:"digest,omitempty"`
	// Message says why the slot is Failed.
	Message string `json:"message,omitempty"`
	// Since is when the slot entered its state.
	Since time.Time `json:"since"`
}

// Target returns the slot's release as a release.Target.
func (i Info) Target() release.Target {
	return release.Target{Version: i.Version, Digest: i.Digest}
}

// diskState is the content of state/slots.json.
type diskState struct {
	FormatVersion int    `json:"formatVersion"`
	Slots         []Info `json:"slots"`
	// Download is the progress of the download into a slot, if any.
	Download *downloadState `json:"download,omitempty"`
}

type downloadState struct {
	Slot       string              `json:"slot"`
	Checkpoint *release.Checkpoint `json:"checkpoint,omitempty"`
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock that stamps state changes.
func WithClock(c clock.PassiveClock) Option { return func(s *Store) { s.clock = c } }

// Store is the on-disk store of a machine's boot slots. Its methods are
// safe for concurrent use. Every change is on disk before the method
// returns, so a Store opened after a crash sees the last state.
type Store struct {
	root     string
	booted   string
	bootPart string // the boot partition's folder, or ""
	clock    clock.PassiveClock

	mu  sync.Mutex
	st  diskState // the state as last written to disk
	gen uint64    // bumped whenever a download handle is invalidated
	dl  *Download // the download handle that may write, if any
}

// Open opens (creating it if needed) the store under root for a machine
// that booted from slot booted. A missing or unreadable state file is
// replaced by the safe state: the booted slot Active (with the release its
// release.yaml names, if any) and the other slot Empty.
func Open(ctx context.Context, root, booted string, opts ...Option) (*Store, error) {
	log := klog.FromContext(ctx)
	if err := validSlot(booted); err != nil {
		return nil, fmt.Errorf("booted slot: %w", err)
	}
	s := &Store{root: root, booted: booted, clock: realClock()}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{filepath.Join(root, slotsDir, A), filepath.Join(root, slotsDir, B), filepath.Join(root, stateDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("slot store: %w", err)
		}
	}
	st, err := s.read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		log.Info("Slot store has no state yet; starting from the booted slot", "root", root, "booted", booted)
		st = s.initial()
	case err != nil:
		log.Error(err, "Slot state unreadable; starting again from the booted slot, the other slot is treated as empty", "root", root, "booted", booted)
		st = s.initial()
	default:
		s.repair(ctx, &st)
	}
	if err := s.write(st); err != nil {
		return nil, err
	}
	return s, nil
}

func realClock() clock.PassiveClock { return clock.RealClock{} }

func validSlot(name string) error {
	if name != A && name != B {
		return fmt.Errorf("slot %q: a slot is named A or B", name)
	}
	return nil
}

// read reads the state file.
func (s *Store) read() (diskState, error) {
	var st diskState
	f, err := os.Open(s.statePath())
	if err != nil {
		return st, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return st, err
	}
	if len(b) > maxStateBytes {
		return st, fmt.Errorf("%s is larger than %d bytes", s.statePath(), maxStateBytes)
	}
	// Not strict: the store of a newer release (whose trial may fail and
	// leave the file to the proven slot's older daemon) may hold fields
	// this one does not know. Fields are only ever added.
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", s.statePath(), err)
	}
	if st.FormatVersion < 1 {
		return st, fmt.Errorf("%s: no format version", s.statePath())
	}
	st.FormatVersion = stateVersion
	if len(st.Slots) != 2 || st.Slots[0].Name != A || st.Slots[1].Name != B {
		return st, fmt.Errorf("%s: expected the slots A and B", s.statePath())
	}
	for _, in := range st.Slots {
		if !knownState(in.State) {
			return st, fmt.Errorf("%s: slot %s has unknown state %q", s.statePath(), in.Name, in.State)
		}
	}
	return st, nil
}

func knownState(s v1alpha1.SlotState) bool {
	switch s {
	case v1alpha1.SlotActive, v1alpha1.SlotStaged, v1alpha1.SlotDownloading, v1alpha1.SlotPrevious, v1alpha1.SlotEmpty, v1alpha1.SlotFailed:
		return true
	}
	return false
}

// initial is the safe state: the booted slot Active, the other Empty.
func (s *Store) initial() diskState {
	now := s.clock.Now().UTC()
	st := diskState{FormatVersion: stateVersion, Slots: []Info{{Name: A, State: v1alpha1.SlotEmpty, Since: now}, {Name: B, State: v1alpha1.SlotEmpty, Since: now}}}
	booted := &st.Slots[slotIndex(s.booted)]
	booted.State = v1alpha1.SlotActive
	if b, err := os.ReadFile(filepath.Join(s.Dir(s.booted), release.DocumentName)); err == nil {
		if doc, err := release.ParseDocument(b); err == nil {
			booted.Version, booted.Digest = doc.Version, release.Digest(b)
		}
	}
	return st
}

// repair makes a state read from disk consistent: a download record only
// for a slot being downloaded (or failed) with the same release.
func (s *Store) repair(ctx context.Context, st *diskState) {
	log := klog.FromContext(ctx)
	if d := st.Download; d != nil {
		if validSlot(d.Slot) != nil || d.Slot == s.booted {
			st.Download = nil
		} else {
			in := st.Slots[slotIndex(d.Slot)]
			if (in.State != v1alpha1.SlotDownloading && in.State != v1alpha1.SlotFailed) ||
				(d.Checkpoint != nil && (d.Checkpoint.Version != in.Version || d.Checkpoint.Digest != in.Digest)) {
				st.Download = nil
			}
		}
	}
	switch b := st.Slots[slotIndex(s.booted)]; b.State {
	case v1alpha1.SlotActive, v1alpha1.SlotStaged:
	default:
		log.Info("Warning: the machine booted a slot that is neither proven nor staged", "slot", s.booted, "state", b.State, "version", b.Version)
	}
}

func slotIndex(name string) int {
	if name == B {
		return 1
	}
	return 0
}

func (s *Store) statePath() string { return filepath.Join(s.root, stateDir, stateFile) }

// write puts st on disk atomically and then makes it the store's state.
func (s *Store) write(st diskState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.statePath(), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the slot state %s: %w", s.statePath(), err)
	}
	s.st = st
	return nil
}

// clone returns a deep copy of the state, to modify and write.
func (s *Store) clone() diskState {
	st := s.st
	st.Slots = append([]Info(nil), s.st.Slots...)
	if s.st.Download != nil {
		d := *s.st.Download
		if d.Checkpoint != nil {
			cp := *d.Checkpoint
			cp.HashState = append([]byte(nil), cp.HashState...)
			d.Checkpoint = &cp
		}
		st.Download = &d
	}
	return st
}

// Root is the store's root directory.
func (s *Store) Root() string { return s.root }

// Booted is the slot the machine runs from.
func (s *Store) Booted() string { return s.booted }

// Other is the slot the machine does not run from: the only one that may
// receive a release.
func (s *Store) Other() string { return Other(s.booted) }

// Other returns the slot that is not name.
func Other(name string) string {
	if name == A {
		return B
	}
	return A
}

// Dir is the directory of a slot.
func (s *Store) Dir(name string) string { return filepath.Join(s.root, slotsDir, name) }

// Slots returns the state of A and B, in that order.
func (s *Store) Slots() []Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Info(nil), s.st.Slots...)
}

// Get returns the state of one slot.
func (s *Store) Get(name string) (Info, error) {
	if err := validSlot(name); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Slots[slotIndex(name)], nil
}

// Checkpoint returns the persisted progress of the download into a slot,
// or nil.
func (s *Store) Checkpoint(name string) *release.Checkpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.st.Download; d != nil && d.Slot == name && d.Checkpoint != nil {
		cp := *d.Checkpoint
		return &cp
	}
	return nil
}

// writable refuses the booted and the proven slot. Call with s.mu held.
func (s *Store) writable(name string) error {
	if err := validSlot(name); err != nil {
		return err
	}
	if name == s.booted {
		return fmt.Errorf("slot %s: %w", name, ErrBootedSlot)
	}
	if s.st.Slots[slotIndex(name)].State == v1alpha1.SlotActive {
		return fmt.Errorf("slot %s: %w", name, ErrActiveSlot)
	}
	return nil
}

// invalidate stops the current download handle. Call with s.mu held.
func (s *Store) invalidate() {
	s.gen++
	if s.dl != nil {
		s.dl.cancel()
		s.dl = nil
	}
}

func (s *Store) set(st *diskState, name string, state v1alpha1.SlotState, target release.Target, message string) {
	st.Slots[slotIndex(name)] = Info{Name: name, State: state, Version: target.Version, Digest: target.Digest, Message: message, Since: s.clock.Now().UTC()}
}

// BeginDownload marks slot name Downloading for target, resuming a download
// of the same release, and returns the handle release.Fetcher writes
// through (docs/design/boot.md#the-kernel-grub-loads). It refuses the
// booted and the Active slot, and with ErrAlreadyStaged a slot that holds target staged.
func (s *Store) BeginDownload(name string, target release.Target) (*Download, error) {
	if err := target.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(name); err != nil {
		return nil, err
	}
	cur := s.st.Slots[slotIndex(name)]
	if cur.State == v1alpha1.SlotStaged && cur.Target() == target {
		return nil, fmt.Errorf("slot %s, release %s: %w", name, target.Version, ErrAlreadyStaged)
	}
	s.invalidate()
	resume := cur.Target() == target &&
		(cur.State == v1alpha1.SlotDownloading || (cur.State == v1alpha1.SlotFailed && s.st.Download != nil && s.st.Download.Slot == name))
	st := s.clone()
	s.set(&st, name, v1alpha1.SlotDownloading, target, "")
	if !resume || st.Download == nil || st.Download.Slot != name {
		st.Download = &downloadState{Slot: name}
		resume = false
	}
	if err := s.write(st); err != nil {
		return nil, err
	}
	// Marked Downloading on disk: GRUB is given nothing of this slot to
	// load until Stage installs verified boot files.
	if err := s.clearBootFiles(name); err != nil {
		return nil, err
	}
	dir := s.Dir(name)
	if !resume {
		// Marked Downloading on disk: now the old content may go.
		if err := os.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("emptying slot %s: %w", name, err)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("emptying slot %s: %w", name, err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("slot %s: %w", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Download{s: s, slot: name, target: target, gen: s.gen, root: root, ctx: ctx, cancel: cancel}
	s.dl = d
	return d, nil
}

// Withdraw stops the download into slot name (its handle stops writing and
// its context is canceled) and marks the slot Empty: the staged or
// half-downloaded release is gone, and so are its boot files. It refuses
// the booted and the proven slot; an Empty slot stays Empty.
func (s *Store) Withdraw(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(name); err != nil {
		return err
	}
	if s.dl != nil && s.dl.slot == name {
		s.invalidate()
	}
	st := s.clone()
	s.set(&st, name, v1alpha1.SlotEmpty, release.Target{}, "")
	if st.Download != nil && st.Download.Slot == name {
		st.Download = nil
	}
	if err := s.write(st); err != nil {
		return err
	}
	return s.clearBootFiles(name)
}

// Stage re-reads the Downloading slot name, installs its kernel and
// initramfs, and marks it Staged, or Failed with the *release.Error
// (docs/design/boot.md#the-kernel-grub-loads). Its download handle stops writing.
func (s *Store) Stage(ctx context.Context, name string) (*release.Document, error) {
	s.mu.Lock()
	if err := s.writable(name); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	cur := s.st.Slots[slotIndex(name)]
	if cur.State != v1alpha1.SlotDownloading {
		s.mu.Unlock()
		return nil, fmt.Errorf("slot %s is %s, not Downloading: only a downloaded slot can be staged: %w", name, cur.State, ErrWrongState)
	}
	s.invalidate()
	gen := s.gen
	s.mu.Unlock()

	doc, verr := s.verify(ctx, name, cur.Target())
	if verr == nil {
		// The slot verified: its kernel and initramfs go where GRUB loads
		// them. The slot is still Downloading on disk, so a power cut here
		// leaves a slot no trial is armed for.
		verr = s.installBootFiles(ctx, name, doc)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen || s.st.Slots[slotIndex(name)] != cur {
		// Withdrawn or retargeted meanwhile: the boot files just installed
		// belong to a release the slot no longer holds.
		if verr == nil && s.writable(name) == nil && s.st.Slots[slotIndex(name)].State != v1alpha1.SlotStaged {
			if err := s.clearBootFiles(name); err != nil {
				return nil, errors.Join(fmt.Errorf("slot %s changed while it was verified; nothing staged: %w", name, ErrWithdrawn), err)
			}
		}
		return nil, fmt.Errorf("slot %s changed while it was verified; nothing staged: %w", name, ErrWithdrawn)
	}
	if verr != nil && ctx.Err() != nil {
		return nil, verr
	}
	st := s.clone()
	if st.Download != nil && st.Download.Slot == name {
		st.Download = nil
	}
	if verr != nil {
		s.set(&st, name, v1alpha1.SlotFailed, cur.Target(), verr.Error())
		if err := s.write(st); err != nil {
			return nil, errors.Join(verr, err)
		}
		return nil, verr
	}
	s.set(&st, name, v1alpha1.SlotStaged, cur.Target(), "")
	if err := s.write(st); err != nil {
		return nil, err
	}
	return doc, nil
}

func (s *Store) verify(ctx context.Context, name string, target release.Target) (*release.Document, error) {
	root, err := os.OpenRoot(s.Dir(name))
	if err != nil {
		return nil, &release.Error{Reason: release.ReasonWriteFailed, Version: target.Version, Err: err}
	}
	defer root.Close()
	return release.VerifyDir(ctx, root, target)
}

// Recheck re-reads a Staged or Active slot against its release, as before
// arming a trial boot: the slot's files and, with a boot partition, the
// kernel and initramfs GRUB would load for it. A Staged slot that does not
// verify is marked Failed (an Active slot is only reported: it is never
// cleared).
func (s *Store) Recheck(ctx context.Context, name string) (*release.Document, error) {
	cur, err := s.Get(name)
	if err != nil {
		return nil, err
	}
	if cur.State != v1alpha1.SlotStaged && cur.State != v1alpha1.SlotActive {
		return nil, fmt.Errorf("slot %s is %s: only a Staged or Active slot can be re-checked: %w", name, cur.State, ErrWrongState)
	}
	doc, verr := s.verify(ctx, name, cur.Target())
	if verr == nil {
		verr = s.verifyBootFiles(ctx, name, doc)
	}
	if re := (*release.Error)(nil); errors.As(verr, &re) {
		// These bytes verified before: a mismatch now happened on disk.
		re.Recheck = true
	}
	if verr == nil || ctx.Err() != nil || cur.State != v1alpha1.SlotStaged {
		return doc, verr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Slots[slotIndex(name)] == cur {
		st := s.clone()
		s.set(&st, name, v1alpha1.SlotFailed, cur.Target(), verr.Error())
		if err := s.write(st); err != nil {
			return nil, errors.Join(verr, err)
		}
	}
	return nil, verr
}

// MarkFailed marks slot name Failed with a message that says why (a trial
// that failed, a download that did not verify). It stops a download into
// the slot, but keeps its progress so that a new BeginDownload of the
// same release resumes. It refuses the proven (Active) slot.
func (s *Store) MarkFailed(name, message string) error {
	if err := validSlot(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.st.Slots[slotIndex(name)]
	if cur.State == v1alpha1.SlotActive {
		return fmt.Errorf("slot %s: %w", name, ErrActiveSlot)
	}
	if s.dl != nil && s.dl.slot == name {
		s.invalidate()
	}
	st := s.clone()
	s.set(&st, name, v1alpha1.SlotFailed, cur.Target(), message)
	return s.write(st)
}

// Commit makes the booted slot the proven one after a successful trial:
// it becomes Active and the slot that was Active becomes Previous. The
// booted slot must be Staged (committing an Active slot does nothing).
func (s *Store) Commit(name string) error {
	if err := validSlot(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != s.booted {
		return fmt.Errorf("slot %s: only the slot the machine booted (%s) can be committed: %w", name, s.booted, ErrWrongState)
	}
	cur := s.st.Slots[slotIndex(name)]
	switch cur.State {
	case v1alpha1.SlotActive:
		return nil
	case v1alpha1.SlotStaged:
	default:
		return fmt.Errorf("slot %s is %s: only a Staged slot that booted its trial can be committed: %w", name, cur.State, ErrWrongState)
	}
	st := s.clone()
	s.set(&st, name, v1alpha1.SlotActive, cur.Target(), "")
	other := Other(name)
	if o := st.Slots[slotIndex(other)]; o.State == v1alpha1.SlotActive {
		s.set(&st, other, v1alpha1.SlotPrevious, o.Target(), "")
	}
	return s.write(st)
}

// Reconcile makes the store agree with the boot loader, which decides what
// boots: slot proven is Active, and no other slot is (the booted slot of a
// trial is Staged, anything else the store calls Active is Failed, so that
// it can be written again). It returns what it changed, for the person
// reading the machine's events; nothing when they agreed. A store that
// disagrees came from an unreadable state file, replaced by the safe
// state while a trial ran (docs/design/boot.md).
func (s *Store) Reconcile(proven string) ([]string, error) {
	if err := validSlot(proven); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.clone()
	var changed []string
	p := st.Slots[slotIndex(proven)]
	if p.State != v1alpha1.SlotActive {
		t := p.Target()
		if t.Version == "" {
			if b, err := os.ReadFile(filepath.Join(s.Dir(proven), release.DocumentName)); err == nil {
				if doc, err := release.ParseDocument(b); err == nil {
					t = release.Target{Version: doc.Version, Digest: release.Digest(b)}
				}
			}
		}
		s.set(&st, proven, v1alpha1.SlotActive, t, "")
		changed = append(changed, fmt.Sprintf("slot %s was %s, but the boot loader proves it: now Active", proven, orNone(p.State)))
	}
	other := Other(proven)
	if o := st.Slots[slotIndex(other)]; o.State == v1alpha1.SlotActive {
		if other == s.booted {
			s.set(&st, other, v1alpha1.SlotStaged, o.Target(), "")
			changed = append(changed, fmt.Sprintf("slot %s was Active, but it boots on trial: now Staged", other))
		} else {
			s.set(&st, other, v1alpha1.SlotFailed, o.Target(), "the boot loader does not prove this slot")
			changed = append(changed, fmt.Sprintf("slot %s was Active, but the boot loader proves slot %s: now Failed, and downloaded again when needed", other, proven))
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := s.write(st); err != nil {
		return changed, err
	}
	return changed, nil
}

func orNone(s v1alpha1.SlotState) string {
	if s == "" {
		return "in no state"
	}
	return string(s)
}
