package srctree

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestFind(t *testing.T) {
	tree := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(tree, "go.mod"), []byte("module liken.sh/liken\n\ngo 1.25\n"), 0o644))
	// A nested module of its own, as hack/kube is.
	nested := filepath.Join(tree, "hack", "kube", "deep")
	assert.NilError(t, os.MkdirAll(nested, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(tree, "hack", "kube", "go.mod"), []byte("module liken.sh/kube\n"), 0o644))
	outside := t.TempDir()

	for _, tc := range []struct {
		name, wd, want, err string
	}{
		{name: "the tree's root", wd: tree, want: tree},
		{name: "under a nested module", wd: nested, want: tree},
		{name: "outside any tree", wd: outside, err: "no liken source tree"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(tc.wd)
			got, err := Find()
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}
