package controlplane

import (
	"context"
	"testing"
	"time"
)

// StartForTest starts a control plane for one test in a temporary folder
// and stops it when the test ends. A failed test gets the tail of every
// component's log. A missing binary fails the test: it never skips.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
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
	cp, err := Start(ctx, opts)
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
