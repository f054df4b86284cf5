package layer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
)

// run runs liken layer with args in dir and returns stdout, stderr and the
// error.
func run(t *testing.T, dir string, args ...string) (string, string, error) {
	t.Helper()
	t.Chdir(dir)
	cmd := NewCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

// workdir is a temporary directory holding the fixture documents and
// identity, as a person would have them.
func workdir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"cluster.yaml", "machines.yaml"} {
		b, err := os.ReadFile(filepath.Join(testdata, f))
		assert.NilError(t, err)
		assert.NilError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	id := fixtureIdentity(t)
	assert.NilError(t, os.Rename(id, filepath.Join(dir, "identity")))
	return dir
}

func TestPackCommandGolden(t *testing.T) {
	dir := workdir(t)
	out, stderr, err := run(t, dir, "pack", "-f", "cluster.yaml", "-f", "machines.yaml", "--identity", "identity", "-o", "layer.tgz")
	assert.NilError(t, err)
	assert.Equal(t, stderr, "")
	golden.Assert(t, out, gold("pack.golden"))
	st, err := os.Stat(filepath.Join(dir, "layer.tgz"))
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	out, _, err = run(t, dir, "inspect", "layer.tgz")
	assert.NilError(t, err)
	golden.Assert(t, out, gold("inspect-summary.golden"))

	_, _, err = run(t, dir, "pack", "-f", ".", "--identity", "identity", "-o", "layer.tgz")
	assert.ErrorContains(t, err, "layer.tgz already exists")
	_, _, err = run(t, dir, "pack", "-f", ".", "--identity", "identity", "-o", "layer.tgz", "--force")
	assert.NilError(t, err)
}

func TestPackWarnsAboutExposedKeys(t *testing.T) {
	dir := workdir(t)
	assert.NilError(t, os.Chmod(filepath.Join(dir, "identity", "server-ca.key"), 0o644))
	_, stderr, err := run(t, dir, "pack", "-f", ".", "--identity", "identity", "-o", "layer.tgz")
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(stderr, "identity/server-ca.key is readable by others (mode 0644): chmod 600"))
}

// A bad document stops the pack with every problem named, and nothing is
// written.
func TestPackCommandRefusesBadDocuments(t *testing.T) {
	dir := workdir(t)
	b, err := os.ReadFile(filepath.Join(dir, "machines.yaml"))
	assert.NilError(t, err)
	bad := strings.Replace(string(b), "role: Worker", "role: worker", 1)
	bad = strings.Replace(bad, "cluster: mycluster", "cluster: yourcluster", 1)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "machines.yaml"), []byte(bad), 0o644))

	_, _, err = run(t, dir, "pack", "-f", "cluster.yaml", "-f", "machines.yaml", "--identity", "identity", "-o", "layer.tgz")
	assert.Assert(t, err != nil)
	golden.Assert(t, err.Error(), gold("pack-errors.golden"))
	_, err = os.Stat(filepath.Join(dir, "layer.tgz"))
	assert.Assert(t, os.IsNotExist(err), "a layer was written")
}

func TestPackCommandArguments(t *testing.T) {
	dir := workdir(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"pack", "-f", "cluster.yaml", "--identity", "identity"}, "no output file: pass -o FILE"},
		{[]string{"pack", "--identity", "identity", "-o", "x.tgz"}, "no documents given"},
		{[]string{"pack", "-f", "cluster.yaml", "-f", "machines.yaml", "-o", "x.tgz"}, "no identity given"},
		{[]string{"pack", "-f", "nope.yaml", "--identity", "identity", "-o", "x.tgz"}, "nope.yaml: no such file"},
		{[]string{"pack", "-f", "identity", "--identity", "identity", "-o", "x.tgz"}, "holds no .yaml, .yml or .json files"},
		{[]string{"inspect"}, "FILE is missing"},
		{[]string{"inspect", "a", "b"}, "too many arguments (b)"},
		{[]string{"inspect", "cluster.yaml"}, "cluster.yaml: not a gzip-compressed layer archive"},
		{[]string{"generate"}, "DIR is missing"},
		{[]string{"generate", "identity"}, "identity already holds an identity"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := run(t, dir, tc.args...)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestGenerateCommand(t *testing.T) {
	dir := t.TempDir()
	out, _, err := run(t, dir, "generate", "ident", "--cluster", "lab")
	assert.NilError(t, err)
	golden.Assert(t, out, gold("generate.golden"))
	st, err := os.Stat(filepath.Join(dir, "ident"))
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
	id, err := LoadIdentity(filepath.Join(dir, "ident"))
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(out, strings.TrimSpace(string(id.Files[TokenFile]))))
}
