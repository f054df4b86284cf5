package turns

import (
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	tu "liken.sh/liken/controllers/internal/testutil"
)

// TestProgressingMessageFitsAtScale: with 5,000 machines waiting and
// 500 holding turns, the Progressing message still fits in a condition
// (32768 bytes), or the API server refuses the ledger write and nothing
// is ever granted (found by e2e/bench at 5,000 machines).
func TestProgressingMessageFitsAtScale(t *testing.T) {
	var machines []*likenv1.Machine
	for i := range 5500 {
		machines = append(machines, tu.Machine(fmt.Sprintf("machine-with-a-long-name-%05d", i), tu.WantsRelease))
	}
	d := Decide(input(tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("500")), machines, nil))
	assert.Equal(t, len(d.Granted), 500)
	msg := progressing(t, d.Status).Message
	assert.Assert(t, len(msg) <= 32768, "the Progressing message is %d bytes", len(msg))
	assert.Assert(t, strings.Contains(msg, "Holding a turn: machine-with-a-long-name-00000,"), msg)
	assert.Assert(t, strings.Contains(msg, "and 490 more (maxUnavailable 500)."), msg)
	assert.Assert(t, strings.Contains(msg, "Waiting for a turn: machine-with-a-long-name-00500,"), msg)
	assert.Assert(t, strings.HasSuffix(msg, "machine-with-a-long-name-00509 and 4990 more."), msg)
}
