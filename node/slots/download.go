package slots

import (
	"context"
	"fmt"
	"os"
	"path"

	"liken.sh/liken/release"
)

// tmpDocument is where WriteDocument assembles release.yaml before it
// renames it into place (hidden names are never artifacts).
const tmpDocument = ".release.yaml.tmp"

// Download is the handle through which a release is written into a slot.
// It implements release.Sink. It stops writing (ErrWithdrawn) once the
// store withdraws, stages, fails or replaces the download.
type Download struct {
	s      *Store
	slot   string
	target release.Target
	gen    uint64
	root   *os.Root
	ctx    context.Context
	cancel context.CancelFunc
}

var _ release.Sink = (*Download)(nil)

// Slot is the slot being written.
func (d *Download) Slot() string { return d.slot }

// Target is the release being downloaded.
func (d *Download) Target() release.Target { return d.target }

// Context is canceled when the download is withdrawn or replaced.
func (d *Download) Context() context.Context { return d.ctx }

// Close releases the handle's resources; the slot keeps its state.
func (d *Download) Close() error {
	d.cancel()
	return d.root.Close()
}

// live returns ErrWithdrawn unless the handle may write. Call with d.s.mu held.
func (d *Download) live() error {
	if d.s.gen != d.gen || d.s.dl != d {
		return fmt.Errorf("slot %s, release %s: %w", d.slot, d.target.Version, ErrWithdrawn)
	}
	return nil
}

// Checkpoint returns the persisted progress of this download, or nil.
func (d *Download) Checkpoint() *release.Checkpoint {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if d.live() != nil {
		return nil
	}
	if ds := d.s.st.Download; ds != nil && ds.Slot == d.slot && ds.Checkpoint != nil &&
		ds.Checkpoint.Version == d.target.Version && ds.Checkpoint.Digest == d.target.Digest {
		cp := *ds.Checkpoint
		cp.HashState = append([]byte(nil), cp.HashState...)
		return &cp
	}
	return nil
}

// SaveCheckpoint durably records progress in the store's state file.
func (d *Download) SaveCheckpoint(cp release.Checkpoint) error {
	if cp.Version != d.target.Version || cp.Digest != d.target.Digest {
		return fmt.Errorf("checkpoint for release %s does not belong to the download of %s", cp.Version, d.target.Version)
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.live(); err != nil {
		return err
	}
	st := d.s.clone()
	cp.HashState = append([]byte(nil), cp.HashState...)
	st.Download = &downloadState{Slot: d.slot, Checkpoint: &cp}
	return d.s.write(st)
}

// WriteDocument durably stores release.yaml in the slot.
func (d *Download) WriteDocument(b []byte) error {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.live(); err != nil {
		return err
	}
	f, err := d.root.OpenFile(tmpDocument, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := d.root.Rename(tmpDocument, release.DocumentName); err != nil {
		return err
	}
	return d.syncDir(".")
}

// OpenArtifact opens an artifact file of the slot for writing, creating it
// and its directories. The os.Root of the slot refuses any path that
// would leave it.
func (d *Download) OpenArtifact(p string) (release.File, error) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if err := d.live(); err != nil {
		return nil, err
	}
	dir := path.Dir(p)
	if dir != "." {
		if err := d.root.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	f, err := d.root.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	// Make the new name durable, so a checkpoint never outlives its file.
	if err := d.syncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (d *Download) syncDir(name string) error {
	f, err := d.root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
