package operator

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"gotest.tools/v3/assert"
)

// TestExitOnLoss: a copy that finds it lost the lease exits with code 3,
// once, however many of its parts find it (the fence, then the elector);
// a copy shutting down, which gives the lease up on purpose, does not.
func TestExitOnLoss(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shutdown bool
		exits    []int
	}{
		{name: "lost while running", exits: []int{ExitLostLease}},
		{name: "shutting down", shutdown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.shutdown {
				cancel()
			}
			var mu sync.Mutex
			var exits []int
			stopped := 0
			var lostLease atomic.Bool
			lost := exitOnLoss(ctx, func() { stopped++ }, &lostLease, func(code int) {
				mu.Lock()
				defer mu.Unlock()
				exits = append(exits, code)
			})
			lost("the fence found the lease held by another copy before granting turns to node-2 in cluster lab")
			lost("the lease could not be renewed")
			assert.DeepEqual(t, exits, tc.exits)
			assert.Equal(t, stopped, 1)
			assert.Equal(t, lostLease.Load(), !tc.shutdown)
		})
	}
}
