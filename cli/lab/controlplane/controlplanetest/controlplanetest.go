// Package controlplanetest starts a real control plane for one test; it is kept out of package controlplane so that the liken binary does not link the test framework.
package controlplanetest

import (
	"context"
	"testing"
	"time"

	"liken.sh/liken/cli/lab/controlplane"
)

// Start starts a control plane for one test in a temporary folder
// and stops it when the test ends. A failed test gets the tail of every
// component's log. A missing binary fails the test: it never skips.
func Start(t testing.TB, opts controlplane.Options) *controlplane.ControlPlane {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := controlplane.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Logf("control plane ready in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control-plane logs:\n%s", cp.Logs(3000))
		}
		cp.Stop()
	})
	return cp
}
