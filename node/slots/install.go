package slots

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/release"
)

// Install copies and verifies the release in releaseDir into slot name of a
// new store under root (Active, the other slot Empty), as liken install and
// the lab do; it refuses a root that has a state, so an installed machine is never overwritten.
func Install(ctx context.Context, root, name, releaseDir string, target release.Target, opts ...Option) error {
	if err := validSlot(name); err != nil {
		return err
	}
	if err := target.Validate(); err != nil {
		return err
	}
	statePath := filepath.Join(root, stateDir, stateFile)
	if _, err := os.Stat(statePath); err == nil {
		return fmt.Errorf("%s already holds an installed machine (%s exists); install into an empty directory", root, statePath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	digest, doc, err := release.DigestOf(ctx, nil, releaseDir)
	if err != nil {
		return err
	}
	if digest != target.Digest || doc.Version != target.Version {
		return fmt.Errorf("%s holds release %s with digest %s, not %s", releaseDir, doc.Version, digest, target)
	}
	dir := filepath.Join(root, slotsDir, name)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, p := range append([]string{release.DocumentName}, artifactPaths(doc)...) {
		if err := copyInto(dir, releaseDir, p); err != nil {
			return fmt.Errorf("installing release %s into slot %s: %w", target.Version, name, err)
		}
	}
	s := &Store{root: root, booted: name, clock: realClock()}
	for _, o := range opts {
		o(s)
	}
	for _, d := range []string{filepath.Join(root, slotsDir, Other(name)), filepath.Join(root, stateDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	doc, err = s.verify(ctx, name, target)
	if err != nil {
		return err
	}
	if err := s.installBootFiles(ctx, name, doc); err != nil {
		return err
	}
	st := s.initial()
	s.set(&st, name, v1alpha1.SlotActive, target, "")
	return s.write(st)
}

func artifactPaths(doc *release.Document) []string {
	var out []string
	for _, a := range doc.Artifacts {
		out = append(out, a.Path)
	}
	return out
}

// copyInto copies the file p (a validated relative path) from src to dst.
func copyInto(dst, src, p string) error {
	in, err := os.Open(filepath.Join(src, filepath.FromSlash(p)))
	if err != nil {
		return err
	}
	defer in.Close()
	target := filepath.Join(dst, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(out, in, make([]byte, 1<<20)); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
