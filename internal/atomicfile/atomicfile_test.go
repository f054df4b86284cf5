package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestWriteFunc(t *testing.T) {
	failed := errors.New("the stream broke")
	for _, tc := range []struct {
		name    string
		old     string // "" for no file before
		write   func(io.Writer) error
		want    string
		wantErr error
	}{
		{name: "a new file", write: stream("new"), want: "new"},
		{name: "replaces a file", old: "old", write: stream("new"), want: "new"},
		{name: "a failed stream leaves the old file", old: "old", write: func(w io.Writer) error {
			_, _ = io.WriteString(w, "half")
			return failed
		}, want: "old", wantErr: failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "layer.tgz")
			if tc.old != "" {
				assert.NilError(t, os.WriteFile(path, []byte(tc.old), 0o644))
			}
			err := WriteFunc(path, 0o600, tc.write)
			assert.Check(t, errors.Is(err, tc.wantErr), "error %v", err)
			b, err := os.ReadFile(path)
			assert.NilError(t, err)
			assert.Equal(t, string(b), tc.want)
			if tc.wantErr == nil {
				st, err := os.Stat(path)
				assert.NilError(t, err)
				assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
			}
			entries, err := os.ReadDir(dir)
			assert.NilError(t, err)
			assert.Equal(t, len(entries), 1, "a temporary file is left: %v", entries)
		})
	}
}

func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	assert.NilError(t, Write(path, []byte("one"), 0o644))
	assert.NilError(t, Write(path, []byte("two"), 0o644))
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "two")
}

// TestWriteNew: WriteNew creates a file with its mode, and refuses any
// existing path, leaving it as it was and no temporary file behind.
func TestWriteNew(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string // the file's content afterwards
		err   error
	}{
		{name: "a new file", want: "new"},
		{name: "an existing file", setup: func(t *testing.T, path string) {
			assert.NilError(t, os.WriteFile(path, []byte("old"), 0o644))
		}, want: "old", err: fs.ErrExist},
		{name: "a dangling link", setup: func(t *testing.T, path string) {
			assert.NilError(t, os.Symlink(filepath.Join(filepath.Dir(path), "nowhere"), path))
		}, err: fs.ErrExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "admin.kubeconfig")
			if tc.setup != nil {
				tc.setup(t, path)
			}
			err := WriteNew(path, []byte("new"), 0o600)
			if tc.err != nil {
				assert.Check(t, errors.Is(err, tc.err), "error %v", err)
			} else {
				assert.NilError(t, err)
				st, err := os.Stat(path)
				assert.NilError(t, err)
				assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
			}
			if tc.want != "" {
				b, err := os.ReadFile(path)
				assert.NilError(t, err)
				assert.Equal(t, string(b), tc.want)
			}
			entries, err := os.ReadDir(dir)
			assert.NilError(t, err)
			assert.Equal(t, len(entries), 1, "a temporary file is left: %v", entries)
		})
	}
}

func stream(s string) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := io.WriteString(w, s)
		return err
	}
}
