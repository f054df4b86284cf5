package main

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestExitCodes: the exit codes docs/reference/operator.md promises for
// what goes wrong before the copy campaigns.
func TestExitCodes(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("HOME", t.TempDir())
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"the version", []string{"--version"}, 0},
		{"an argument", []string{"extra"}, 2},
		{"an unknown flag", []string{"--bogus"}, 2},
		{"a bad duration", []string{"--startup-grace=soon"}, 2},
		{"no API server to reach", []string{"--metrics-bind-address=0"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, run(tc.args), tc.want)
		})
	}
}
