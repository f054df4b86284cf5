package layer

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"liken.sh/liken/cli/internal/cmdutil"
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
	// The tokens are new at every pack: the archive's size varies a little.
	out = regexp.MustCompile(`\([0-9.]+ KiB,`).ReplaceAllString(out, "(SIZE,")
	golden.Assert(t, maskJoinTokens(out), gold("pack.golden"))
	st, err := os.Stat(filepath.Join(dir, "layer.tgz"))
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	out, _, err = run(t, dir, "inspect", "layer.tgz")
	assert.NilError(t, err)
	golden.Assert(t, maskJoinTokens(out), gold("inspect-summary.golden"))

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

// An even number of leaders is packed with a warning that says why: the
// datastore needs a majority, so 2 leaders survive no more failures than
// 1, and 4 no more than 3.
func TestPackWarnsAboutAnEvenNumberOfLeaders(t *testing.T) {
	for _, tc := range []struct {
		leaders int
		want    string // "": no warning
	}{
		{1, ""},
		{2, "Warning: 2 leaders survive no more failures than 1 leader: the datastore needs a majority of its leaders (2 of 2) to answer, " +
			"so it survives no leader down, as 1 leader does, and the extra leader is one more machine that can fail. " +
			"Use 1 or 3 leaders now: a Machine's role cannot change later without installing the machine again\n"},
		{3, ""},
		{4, "Warning: 4 leaders survive no more failures than 3 leaders: the datastore needs a majority of its leaders (3 of 4) to answer, " +
			"so it survives 1 leader down, as 3 leaders do, and the extra leader is one more machine that can fail. " +
			"Use 3 or 5 leaders now: a Machine's role cannot change later without installing the machine again\n"},
	} {
		t.Run(fmt.Sprintf("%d leaders", tc.leaders), func(t *testing.T) {
			dir := workdir(t)
			var docs strings.Builder
			for i := 1; i <= tc.leaders+1; i++ {
				role := "Leader"
				if i > tc.leaders {
					role = "Worker"
				}
				fmt.Fprintf(&docs, "---\napiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata: {name: node-%d}\n"+
					"spec:\n  cluster: mycluster\n  role: %s\n  ports: [{name: eth0, addresses: [10.0.0.%d/24]}]\n", i, role, 10+i)
			}
			assert.NilError(t, os.WriteFile(filepath.Join(dir, "machines.yaml"), []byte(docs.String()), 0o644))
			out, stderr, err := run(t, dir, "pack", "-f", "cluster.yaml", "-f", "machines.yaml", "--identity", "identity", "-o", "layer.tgz")
			assert.NilError(t, err, "a warning does not stop the pack")
			assert.Equal(t, stderr, tc.want)
			assert.Assert(t, is.Contains(out, fmt.Sprintf("(%s, 1 worker)", cmdutil.Plural(tc.leaders, "leader", "leaders"))))
			_, err = os.Stat(filepath.Join(dir, "layer.tgz"))
			assert.NilError(t, err, "the layer is written")
			assert.Equal(t, EvenLeadersWarning(tc.leaders) == "", tc.want == "")
		})
	}
	assert.Equal(t, EvenLeadersWarning(0), "")
}
