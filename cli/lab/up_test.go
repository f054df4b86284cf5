package lab

import (
	"os/exec"
	"testing"

	"gotest.tools/v3/assert"
)

// TestStartupGraceArgs: LIKEN_LAB_STARTUP_GRACE becomes the operator's
// --startup-grace; unset or empty keeps the operator's default; anything
// but a duration of zero or more is refused, naming the variable.
func TestStartupGraceArgs(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
		err   string
	}{
		{value: "", want: nil},
		{value: "5s", want: []string{"--startup-grace=5s"}},
		{value: "1m30s", want: []string{"--startup-grace=1m30s"}},
		{value: "0", want: []string{"--startup-grace=0s"}},
		{value: "5", err: `LIKEN_LAB_STARTUP_GRACE="5" is not a duration`},
		{value: "-1s", err: `LIKEN_LAB_STARTUP_GRACE="-1s" is not a duration`},
		{value: "soon", err: `LIKEN_LAB_STARTUP_GRACE="soon" is not a duration`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv(startupGraceEnv, tc.value)
			got, err := startupGraceArgs()
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestShellQuote(t *testing.T) {
	for _, path := range []string{
		"/home/ops/.local/state/liken/labs/lab/controlplane/kubeconfigs/admin.kubeconfig",
		"/home/o ps/labs/a b",
		"/tmp/$(touch /tmp/pwned)/`id`/x",
		"/tmp/it's/here",
	} {
		out, err := exec.Command("sh", "-c", "eval \"$1\"; printf %s \"$KUBECONFIG\"", "sh", "export KUBECONFIG="+shellQuote(path)).Output()
		assert.NilError(t, err)
		assert.Equal(t, string(out), path, "the shell read back another path")
	}
}
