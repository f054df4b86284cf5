package main

import (
	"testing"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/daemon"
)

// TestReadsLikenNodesTrialRecord: the init reads the trial record where
// liken-node writes it (the init cannot link the daemon, so it names the
// file itself).
func TestReadsLikenNodesTrialRecord(t *testing.T) {
	assert.Equal(t, daemonState, daemon.StateFile)
}
