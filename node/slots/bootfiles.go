package slots

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"liken.sh/liken/internal/diskread"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/release"
)

// bootFile is a release artifact GRUB loads, and its name in the slot's
// folder on the boot partition (the names grub.cfg loads).
type bootFile struct {
	artifact, name string
}

var bootFiles = []bootFile{
	{release.KernelPath, "vmlinuz"},
	{release.InitrdPath, "initrd.img"},
}

// powerCut, set by tests, is called after each durable write to the boot
// partition with a name for that point; a test stops the process's work
// there (as a power cut would) and looks at what the next boot finds.
var powerCut = func(point string) {}

// bootTmpPrefix starts the temporary files a boot file is assembled in
// before it is renamed into place; grub.cfg never loads them.
const bootTmpPrefix = ".liken-tmp-"

// WithBootPartition names the folder the boot partition is mounted on
// (/boot), where the store installs each slot's kernel and initramfs; without
// it the store writes nothing outside its root (docs/design/boot.md#the-kernel-grub-loads).
func WithBootPartition(dir string) Option { return func(s *Store) { s.bootPart = dir } }

// BootDir is the folder on the boot partition that holds a slot's kernel
// and initramfs, or "" when the store has no boot partition.
func (s *Store) BootDir(name string) string {
	if s.bootPart == "" {
		return ""
	}
	return filepath.Join(s.bootPart, name)
}

// clearBootFiles removes a slot's kernel and initramfs (and leftover
// temporary files) from the boot partition, so that GRUB finds nothing to
// load for that slot until installBootFiles puts verified files there.
// Call it only for a slot the store may write.
func (s *Store) clearBootFiles(name string) error {
	dir := s.BootDir(name)
	if dir == "" {
		return nil
	}
	done, err := boot.Writable(s.bootPart)
	if err != nil {
		return fmt.Errorf("clearing slot %s's boot files: %w", name, err)
	}
	defer done()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clearing slot %s's boot files: %w", name, err)
	}
	removed := false
	for _, e := range ents {
		if !isBootName(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clearing slot %s's boot files: %w", name, err)
		}
		removed = true
	}
	if !removed {
		return nil
	}
	if err := syncPath(dir); err != nil {
		return err
	}
	powerCut("cleared " + name)
	return nil
}

func isBootName(n string) bool {
	if strings.HasPrefix(n, bootTmpPrefix) {
		return true
	}
	for _, b := range bootFiles {
		if n == b.name {
			return true
		}
	}
	return false
}

// installBootFiles copies the verified slot's kernel and initramfs to the
// boot partition so that GRUB's path names nothing or bytes that verified
// (docs/design/boot.md#the-kernel-grub-loads).
func (s *Store) installBootFiles(ctx context.Context, name string, doc *release.Document) error {
	dir := s.BootDir(name)
	if dir == "" {
		return nil
	}
	done, err := boot.Writable(s.bootPart)
	if err != nil {
		return bootIOError(doc.Version, "the boot partition", err)
	}
	defer done()
	if err := s.clearBootFiles(name); err != nil {
		return &release.Error{Reason: release.ReasonWriteFailed, Version: doc.Version, Err: err}
	}
	for _, b := range bootFiles {
		a := doc.Artifact(b.artifact)
		if a == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return bootIOError(doc.Version, b.artifact, err)
		}
		if err := s.installBootFile(ctx, name, doc.Version, *a, filepath.Join(dir, b.name)); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) installBootFile(ctx context.Context, name, version string, a release.Artifact, dst string) (err error) {
	in, err := os.Open(filepath.Join(s.Dir(name), filepath.FromSlash(a.Path)))
	if err != nil {
		return bootIOError(version, a.Path, err)
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dst), bootTmpPrefix+filepath.Base(dst)+"-")
	if err != nil {
		return bootIOError(version, a.Path, err)
	}
	tmp := out.Name()
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := copyCtx(ctx, io.MultiWriter(out, h), io.LimitReader(in, a.Size+1))
	if err != nil {
		return bootIOError(version, a.Path, err)
	}
	if n != a.Size {
		return &release.Error{Reason: release.ReasonSizeMismatch, Version: version, File: a.Path,
			Err: fmt.Errorf("copying it to %s read %d bytes, but the release document says %d", dst, n, a.Size)}
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != a.SHA256 {
		return &release.Error{Reason: release.ReasonChecksumMismatch, Version: version, File: a.Path,
			Err: fmt.Errorf("the bytes copied to %s have sha256 %s, but the release document says %s", dst, sum, a.SHA256)}
	}
	if err := out.Chmod(0o644); err != nil {
		return bootIOError(version, a.Path, err)
	}
	if err := out.Sync(); err != nil {
		return bootIOError(version, a.Path, err)
	}
	if err := out.Close(); err != nil {
		return bootIOError(version, a.Path, err)
	}
	powerCut("written " + dst)
	if err := os.Rename(tmp, dst); err != nil {
		return bootIOError(version, a.Path, err)
	}
	if err := syncPath(filepath.Dir(dst)); err != nil {
		return bootIOError(version, a.Path, err)
	}
	powerCut("renamed " + dst)
	return nil
}

// verifyBootFiles re-reads a slot's kernel and initramfs on the boot
// partition against the release document: each must have the size and
// sha256 of its artifact, and a file whose artifact the release does not
// have must be absent.
func (s *Store) verifyBootFiles(ctx context.Context, name string, doc *release.Document) error {
	dir := s.BootDir(name)
	if dir == "" {
		return nil
	}
	buf := make([]byte, 1<<20)
	for _, b := range bootFiles {
		p := filepath.Join(dir, b.name)
		a := doc.Artifact(b.artifact)
		fi, err := os.Lstat(p)
		switch {
		case a == nil && errors.Is(err, fs.ErrNotExist):
			continue
		case a == nil && err == nil:
			return &release.Error{Reason: release.ReasonUnexpectedFile, Version: doc.Version, File: b.artifact,
				Err: fmt.Errorf("%s is on the boot partition, but the release has no %s", p, b.artifact)}
		case errors.Is(err, fs.ErrNotExist):
			return &release.Error{Reason: release.ReasonSizeMismatch, Version: doc.Version, File: b.artifact,
				Err: fmt.Errorf("%s, where GRUB loads it from, is missing", p)}
		case err != nil:
			return bootIOError(doc.Version, b.artifact, err)
		case !fi.Mode().IsRegular():
			return &release.Error{Reason: release.ReasonUnexpectedFile, Version: doc.Version, File: b.artifact,
				Err: fmt.Errorf("%s is not a regular file", p)}
		case fi.Size() != a.Size:
			return &release.Error{Reason: release.ReasonSizeMismatch, Version: doc.Version, File: b.artifact,
				Err: fmt.Errorf("%s, where GRUB loads it from, is %d bytes, but the release document says %d", p, fi.Size(), a.Size)}
		}
		sum, err := hashFile(ctx, p, buf)
		if err != nil {
			return bootIOError(doc.Version, b.artifact, err)
		}
		if sum != a.SHA256 {
			return &release.Error{Reason: release.ReasonChecksumMismatch, Version: doc.Version, File: b.artifact,
				Err: fmt.Errorf("%s, where GRUB loads it from, has sha256 %s, but the release document says %s", p, sum, a.SHA256)}
		}
	}
	return nil
}

// hashFile hashes the file at p as the disk holds it (diskread), the bytes
// GRUB loads.
func hashFile(ctx context.Context, p string, buf []byte) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := diskread.Uncached(f); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := copyCtxBuf(ctx, h, f, buf); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyCtx(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	return copyCtxBuf(ctx, w, r, make([]byte, 1<<20))
}

// copyCtxBuf copies r to w, checking ctx between reads.
func copyCtxBuf(ctx context.Context, w io.Writer, r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, err := r.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// bootIOError is a failure to write or read the boot partition.
func bootIOError(version, file string, err error) *release.Error {
	reason := release.ReasonWriteFailed
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		reason = release.ReasonCanceled
	case isNoSpace(err):
		reason = release.ReasonDiskFull
	}
	return &release.Error{Reason: reason, Version: version, File: file, Err: fmt.Errorf("on the boot partition: %w", err)}
}

func syncPath(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
