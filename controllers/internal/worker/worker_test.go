package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestQueueRequeues(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	results := map[string]struct {
		after time.Duration
		err   error
	}{
		"later":    {after: 5 * time.Second},
		"done":     {},
		"failed":   {err: errors.New("boom")},
		"conflict": {err: apierrors.NewConflict(schema.GroupResource{Group: "liken.sh", Resource: "clusters"}, "lab", errors.New("modified"))},
	}
	synced := map[string]int{}
	q := New("test", clk, func(_ context.Context, key string) (time.Duration, error) {
		synced[key]++
		return results[key].after, results[key].err
	})
	ctx := context.Background()
	for k := range results {
		q.Add(k)
	}
	for range results {
		assert.Assert(t, q.processNext(ctx))
	}
	assert.Equal(t, len(synced), 4)
	// Failures come back after the first backoff (5 ms); "later" after 5 s.
	clk.Step(10 * time.Millisecond)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if q.Len() == 2 {
			return poll.Success()
		}
		return poll.Continue("%d keys queued", q.Len())
	})
	q.processNext(ctx)
	q.processNext(ctx)
	assert.Equal(t, synced["failed"], 2)
	assert.Equal(t, synced["conflict"], 2)
	assert.Equal(t, synced["later"], 1)
	// After 5 s: "later", and both failures again (second backoff 10 ms).
	clk.Step(5 * time.Second)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if q.Len() == 3 {
			return poll.Success()
		}
		return poll.Continue("%d keys queued", q.Len())
	})
	for q.Len() > 0 {
		q.processNext(ctx)
	}
	assert.Equal(t, synced["later"], 2)
	assert.Equal(t, synced["done"], 1)
}

func TestKeyOf(t *testing.T) {
	k, ok := KeyOf(cache.DeletedFinalStateUnknown{Key: "lab"})
	assert.Assert(t, ok)
	assert.Equal(t, k, "lab")
	_, ok = KeyOf(42)
	assert.Assert(t, !ok)
}
