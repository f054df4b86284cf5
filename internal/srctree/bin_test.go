package srctree

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestBinDir(t *testing.T) {
	exe, err := os.Executable()
	assert.NilError(t, err)
	exeDir := filepath.Dir(exe)
	tree := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(tree, "go.mod"), []byte("module liken.sh/liken\n"), 0o644))
	treeBin := filepath.Join(tree, "_output", "bin")
	assert.NilError(t, os.MkdirAll(filepath.Join(treeBin, "kube"), 0o755)) // a folder is no program
	for _, n := range []string{"liken", "liken-node"} {
		assert.NilError(t, os.WriteFile(filepath.Join(treeBin, n), nil, 0o755))
	}
	env := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(env, "liken"), nil, 0o755))
	outside := t.TempDir()

	for _, tc := range []struct {
		name, env, wd, exeProgram string
		names                     []string
		want, err                 string
	}{
		{name: "the source tree's _output/bin", wd: tree, names: []string{"liken", "liken-node"}, want: treeBin},
		{name: "next to the executable first", wd: tree, exeProgram: "liken-node", names: []string{"liken-node"}, want: exeDir},
		{name: "every program in one folder", wd: tree, exeProgram: "liken-node", names: []string{"liken", "liken-node"}, want: treeBin},
		{name: "$LIKEN_BIN", env: env, wd: tree, names: []string{"liken"}, want: env},
		{name: "$LIKEN_BIN is the only folder looked at", env: env, wd: tree, names: []string{"liken-node"}, err: "liken-node not found (looked in " + env + "): run make build"},
		{name: "a folder is no program", wd: tree, names: []string{"kube"}, err: "kube not found"},
		{name: "outside a source tree", wd: outside, names: []string{"liken"}, err: "looked in " + exeDir + "): run make build in the liken source tree, or set LIKEN_BIN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(BinEnv, tc.env)
			t.Chdir(tc.wd)
			if tc.exeProgram != "" {
				p := filepath.Join(exeDir, tc.exeProgram)
				assert.NilError(t, os.WriteFile(p, nil, 0o755))
				t.Cleanup(func() { os.Remove(p) })
			}
			got, err := BinDir(tc.names...)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
			p, err := Binary(tc.names[0])
			assert.NilError(t, err)
			assert.Equal(t, p, filepath.Join(tc.want, tc.names[0]))
		})
	}
}
