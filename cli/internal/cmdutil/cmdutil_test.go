package cmdutil

import (
	"os/exec"
	"testing"

	"github.com/spf13/cobra"
	"gotest.tools/v3/assert"
	_ "gotest.tools/v3/golden" // go test ./cli/... -update reaches every package
)

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 400 << 20: "400.0 MiB", 3 << 30: "3.0 GiB"} {
		assert.Equal(t, HumanBytes(n), want)
	}
}

func TestArgs(t *testing.T) {
	cmd := &cobra.Command{Use: "approve-reboot CLUSTER MACHINE"}
	check := ExactArgs("CLUSTER", "MACHINE")
	assert.ErrorContains(t, check(cmd, nil), "CLUSTER and MACHINE are missing; usage: approve-reboot CLUSTER MACHINE")
	assert.ErrorContains(t, check(cmd, []string{"c"}), "MACHINE is missing")
	assert.ErrorContains(t, check(cmd, []string{"c", "m", "x", "y"}), "too many arguments (x y)")
	assert.NilError(t, check(cmd, []string{"c", "m"}))
	assert.NilError(t, MaxArgs("CLUSTER")(cmd, nil))
	assert.ErrorContains(t, MaxArgs("CLUSTER")(cmd, []string{"a", "b"}), "too many arguments (b)")
	assert.Equal(t, Plural(1, "machine", "machines"), "1 machine")
	assert.Equal(t, Plural(2, "machine", "machines"), "2 machines")
}

// TestShellQuote: the shell reads back every path as it was.
func TestShellQuote(t *testing.T) {
	for _, path := range []string{
		"/home/ops/.local/state/liken/labs/lab/controlplane/kubeconfigs/admin.kubeconfig",
		"/home/o ps/labs/a b",
		"/tmp/$(touch /tmp/pwned)/`id`/x",
		"/tmp/it's/here",
	} {
		out, err := exec.Command("sh", "-c", "eval \"$1\"; printf %s \"$KUBECONFIG\"", "sh", "export KUBECONFIG="+ShellQuote(path)).Output()
		assert.NilError(t, err)
		assert.Equal(t, string(out), path, "the shell read back another path")
	}
}
