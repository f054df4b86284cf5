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

// syncNext waits for a key to be queued and syncs it.
func syncNext(ctx context.Context, t *testing.T, q *Queue) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if q.Len() > 0 {
			return poll.Success()
		}
		return poll.Continue("no key queued")
	})
	q.processNext(ctx)
}

// A queue made WithBackoff retries a failed key after the first delay
// given, not the default 5 ms.
func TestQueueWithBackoff(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	synced := map[string]int{}
	q := New("test", clk, func(_ context.Context, key string) (time.Duration, error) {
		synced[key]++
		if key == "failing" {
			return 0, errors.New("boom")
		}
		return 0, nil
	}, WithBackoff(200*time.Millisecond, time.Minute))
	ctx := context.Background()
	q.Add("failing")
	q.processNext(ctx)
	// A marker due just before the retry: the queue moves every key due by
	// then in one pass, in order, so a retry due earlier would come first.
	q.AddAfter("marker", 199*time.Millisecond)
	clk.Step(199 * time.Millisecond)
	syncNext(ctx, t, q)
	assert.Equal(t, synced["marker"], 1)
	assert.Equal(t, synced["failing"], 1, "retried before its first backoff")
	clk.Step(time.Millisecond)
	syncNext(ctx, t, q)
	assert.Equal(t, synced["failing"], 2)
}

// When ctx ends, Run returns only once the running sync returned, and the
// keys still queued are not synced: the node daemon relies on it to stop
// before the machine reboots.
func TestRunStopsWithItsSyncs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, release := make(chan struct{}, 1), make(chan struct{})
	var synced []string
	q := New("test", clocktesting.NewFakeClock(time.Now()), func(ctx context.Context, key string) (time.Duration, error) {
		synced = append(synced, key)
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return 0, ctx.Err()
	})
	q.Add("first")
	q.Add("second")
	ran := make(chan error)
	go func() { ran <- q.Run(ctx, 1) }()
	<-started
	cancel()
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) while a sync was running", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	assert.NilError(t, <-ran)
	assert.DeepEqual(t, synced, []string{"first"})
}

// TestBusyShowsASyncThatDoesNotReturn: Busy is how long the sync under
// way has run, and 0 again once it returned.
func TestBusyShowsASyncThatDoesNotReturn(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	started, release := make(chan struct{}), make(chan struct{})
	q := New("test", clk, func(context.Context, string) (time.Duration, error) {
		close(started)
		<-release
		return 0, nil
	})
	assert.Equal(t, q.Busy(), time.Duration(0), "idle")
	q.Add("wedged")
	done := make(chan bool)
	go func() { done <- q.processNext(context.Background()) }()
	<-started
	clk.Step(11 * time.Minute)
	assert.Equal(t, q.Busy(), 11*time.Minute)
	close(release)
	assert.Assert(t, <-done)
	assert.Equal(t, q.Busy(), time.Duration(0), "the sync returned")
}
