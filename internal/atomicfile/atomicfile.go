// Package atomicfile replaces files so that a reader or a power cut sees the old content or the new, never a mix.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with data: it writes a temporary file in
// the same directory, syncs it, renames it over path and syncs the
// directory, so a reader or a crash sees the old or the new content, never
// a mix.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFunc(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc replaces path, as Write does, with what write streams; when
// write fails, path is left as it was and no temporary file remains.
func WriteFunc(path string, perm os.FileMode, write func(io.Writer) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(tmp))
}

// WriteNew creates path with data, as Write does, but never replaces
// anything: when path exists (a file, a folder, a link) it returns an
// error matching fs.ErrExist and leaves path as it was.
func WriteNew(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	// A hard link, unlike a rename, fails when path exists.
	err = os.Link(tmp, path)
	os.Remove(tmp)
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(tmp))
}

// writeTemp writes what write streams to a synced temporary file next to
// path, with mode perm, and returns its name; on failure none remains.
func writeTemp(path string, perm os.FileMode, write func(io.Writer) error) (string, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return "", err
	}
	if err := write(f); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	ok = true
	return tmp, nil
}

// SyncDir flushes a folder's entries (a file created, renamed or removed
// in it) to the disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
