package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
)

func run(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Run(context.Background(), NewRootCommand(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// Help reads like kubectl's: description, examples, commands, the
// command's own options, usage, and a pointer to the global options.
func TestHelpGolden(t *testing.T) {
	for _, args := range [][]string{
		{"--help"},
		{"approve-reboot", "--help"},
		{"layer", "pack", "--help"},
		{"rollout", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, stderr := run(args...)
			assert.Equal(t, code, 0, stderr)
			golden.Assert(t, out, "help-"+strings.Join(append([]string{"liken"}, args[:len(args)-1]...), "-")+".golden")
		})
	}
}

// Every command is documented the same way: a short line without a final
// period, a description and at least one example, each example preceded by
// a comment and run as liken.
func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		// cobra writes completion's help; liken lab has its own tests.
		if c.Hidden || c.Name() == "help" || strings.HasPrefix(c.CommandPath(), "liken completion") || strings.HasPrefix(c.CommandPath(), "liken lab") {
			return
		}
		t.Run(c.CommandPath(), func(t *testing.T) {
			assert.Assert(t, c.Short != "", "no Short")
			assert.Assert(t, !strings.HasSuffix(c.Short, "."), "Short ends with a period: %q", c.Short)
			assert.Assert(t, len(c.Short) <= 80, "Short is longer than 80 characters")
			assert.Assert(t, c.Long != "", "no Long")
			assert.Assert(t, c.Example != "", "no Example")
			for _, line := range strings.Split(c.Example, "\n") {
				line = strings.TrimSpace(line)
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				assert.Assert(t, strings.HasPrefix(line, "liken ") || strings.HasPrefix(line, "kubectl ") || strings.HasPrefix(line, "export "), "example line %q", line)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(NewRootCommand())
}

func TestErrorsExitNonZero(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `error: unknown command "frobnicate" for "liken"`},
		{[]string{"approve-reboot", "--nope"}, "error: unknown flag: --nope\nSee 'liken approve-reboot --help' for usage"},
		{[]string{"approve-reboot", "c"}, "error: MACHINE is missing; usage: liken approve-reboot CLUSTER MACHINE [flags]"},
		{[]string{"approve-reboot", "a", "b", "c"}, "error: too many arguments (c); usage: liken approve-reboot CLUSTER MACHINE [flags]"},
		{[]string{"rollout", "status", "a", "b"}, "error: too many arguments (b)"},
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig", "rollout", "status", "lab"}, "error: reading the kubeconfig"},
		{[]string{"--server", "https://127.0.0.1:1", "--insecure-skip-tls-verify", "rollout", "resume", "lab"}, "error: cannot reach the API server"},
		{[]string{"version", "-o", "xml"}, `error: --output "xml" is not supported`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := run(tc.args...)
			assert.Equal(t, code, 1)
			assert.Assert(t, is.Contains(stderr, tc.want))
		})
	}
}

func TestNoKubeconfig(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	code, _, stderr := run("approve-reboot", "lab", "node-1")
	assert.Equal(t, code, 1)
	assert.Equal(t, stderr, "error: no cluster to talk to: set KUBECONFIG or pass --kubeconfig (for a lab, liken lab up prints the export KUBECONFIG=... line)\n")
}

func TestVersion(t *testing.T) {
	code, out, _ := run("version")
	assert.Equal(t, code, 0)
	assert.Assert(t, strings.HasPrefix(out, "liken dev (go"), out)
	code, out, _ = run("version", "-o", "json")
	assert.Equal(t, code, 0)
	var v versionInfo
	assert.NilError(t, json.Unmarshal([]byte(out), &v))
	assert.Equal(t, v.Version, "dev")
}

func TestOptions(t *testing.T) {
	code, out, _ := run("options")
	assert.Equal(t, code, 0)
	for _, f := range []string{"--kubeconfig", "--context", "--server", "--token", "--request-timeout", "--as"} {
		assert.Assert(t, is.Contains(out, f))
	}
	assert.Assert(t, !strings.Contains(out, "--namespace"), "liken's resources are cluster-scoped")
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		code, out, stderr := run("completion", shell)
		assert.Equal(t, code, 0, stderr)
		assert.Assert(t, is.Contains(out, "liken"))
	}
	// Flags and subcommands complete without a cluster.
	code, out, _ := run("__complete", "rollout", "")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(out, "status"))
	assert.Assert(t, is.Contains(out, "resume"))
}
