package lab

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
)

// TestSuperviseRestartsAnExitedCopy: a cluster-operator copy that exits
// (as one that loses the lease does) is started again, and the PID file
// follows the running copy; cancelling stops the copy.
func TestSuperviseRestartsAnExitedCopy(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervise(ctx, dir, "copy", []string{"sleep", "600"}, io.Discard) }()

	pid := func() int {
		b, err := os.ReadFile(filepath.Join(dir, "copy.pid"))
		if err != nil {
			return 0
		}
		p, _ := strconv.Atoi(string(b))
		return p
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if pid() > 0 {
			return poll.Success()
		}
		return poll.Continue("no PID yet")
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	first := pid()
	assert.NilError(t, syscall.Kill(first, syscall.SIGKILL))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if p := pid(); p > 0 && p != first {
			return poll.Success()
		}
		return poll.Continue("still the first copy (pid %d)", first)
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(50*time.Millisecond))
	second := pid()

	cancel()
	assert.NilError(t, <-done)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if syscall.Kill(second, 0) != nil {
			return poll.Success()
		}
		return poll.Continue("copy %d still runs", second)
	}, poll.WithTimeout(15*time.Second), poll.WithDelay(50*time.Millisecond))
}
