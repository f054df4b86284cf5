// Package worker runs a controller's sync function over a typed,
// rate-limited workqueue of object keys.
package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// SyncFunc reconciles one key. A positive requeueAfter asks for another
// sync after that delay; an error requeues the key with backoff.
type SyncFunc func(ctx context.Context, key string) (requeueAfter time.Duration, err error)

// Queue feeds keys to a SyncFunc: keys are deduplicated, a key is never
// synced by two workers at once, and failures back off exponentially
// (by default 5 ms doubling up to 30 s).
type Queue struct {
	name  string
	queue workqueue.TypedRateLimitingInterface[string]
	sync  SyncFunc
	clock clock.PassiveClock

	mu      sync.Mutex
	running map[uint64]time.Time // syncs under way, by a number of their own
	next    uint64
}

// Option changes how a Queue retries.
type Option func(*options)

type options struct {
	firstRetry, maxRetry time.Duration
}

// WithBackoff makes a failed key wait first before its first retry,
// doubling up to most.
func WithBackoff(first, most time.Duration) Option {
	return func(o *options) { o.firstRetry, o.maxRetry = first, most }
}

// New returns a Queue named name (used in logs) whose delays run on clk.
func New(name string, clk clock.WithTicker, sync SyncFunc, opts ...Option) *Queue {
	o := options{firstRetry: 5 * time.Millisecond, maxRetry: 30 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	limiter := workqueue.NewTypedMaxOfRateLimiter[string](
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.firstRetry, o.maxRetry),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(20), 200)},
	)
	return &Queue{
		name: name,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{
			Name:  name,
			Clock: clk,
		}),
		sync:    sync,
		clock:   clk,
		running: map[uint64]time.Time{},
	}
}

// Busy is how long the oldest sync now under way has been running, 0
// when none is: a sync that never returns (a wedged call) shows here.
func (q *Queue) Busy() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	var oldest time.Time
	for _, at := range q.running {
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return q.clock.Since(oldest)
}

// syncing notes a sync starting and returns the function that notes its end.
func (q *Queue) syncing() func() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.next++
	id := q.next
	q.running[id] = q.clock.Now()
	return func() {
		q.mu.Lock()
		delete(q.running, id)
		q.mu.Unlock()
	}
}

// Add queues key for a sync now.
func (q *Queue) Add(key string) { q.queue.Add(key) }

// AddAfter queues key for a sync after d.
func (q *Queue) AddAfter(key string, d time.Duration) { q.queue.AddAfter(key, d) }

// Len is the number of keys waiting.
func (q *Queue) Len() int { return q.queue.Len() }

// ShutDown stops the queue: no key is synced after the syncs running
// now. Run shuts the queue down itself when ctx ends; call ShutDown for a
// queue that Run never ran.
func (q *Queue) ShutDown() { q.queue.ShutDown() }

// Run waits for the informers' caches (it is woken as soon as they are
// synced), then runs workers until ctx ends, and returns once the syncs
// they were running have returned.
func (q *Queue) Run(ctx context.Context, workers int, synced ...cache.DoneChecker) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer q.queue.ShutDown()
	logger := klog.FromContext(ctx).WithValues("controller", q.name)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Waiting for informer caches")
	if !cache.WaitFor(ctx, "", synced...) {
		return fmt.Errorf("%s: informer caches did not sync before shutdown", q.name)
	}
	logger.Info("Starting workers", "count", workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { wait.UntilWithContext(ctx, q.runWorker, time.Second) })
	}
	<-ctx.Done()
	logger.Info("Stopping workers")
	q.queue.ShutDown()
	wg.Wait()
	return nil
}

func (q *Queue) runWorker(ctx context.Context) {
	for q.processNext(ctx) {
	}
}

func (q *Queue) processNext(ctx context.Context) bool {
	key, shutdown := q.queue.Get()
	if shutdown {
		return false
	}
	defer q.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down: the keys still queued are not synced.
		return false
	}
	logger := klog.FromContext(ctx).WithValues("key", key)
	done := q.syncing()
	after, err := q.sync(klog.NewContext(ctx, logger), key)
	done()
	switch {
	case err != nil && ctx.Err() != nil:
		// Cut short by the shutdown: not a failure, and nothing retries.
		q.queue.Forget(key)
	case err != nil && apierrors.IsConflict(err):
		// Another writer changed the object since it was read: normal
		// between controllers; the key is synced again from the newer one.
		logger.V(2).Info("Object changed since it was read; syncing again", "err", err)
		q.queue.AddRateLimited(key)
	case err != nil:
		logger.Error(err, "Sync failed, will retry", "retries", q.queue.NumRequeues(key))
		q.queue.AddRateLimited(key)
	case after > 0:
		q.queue.Forget(key)
		q.queue.AddAfter(key, after)
	default:
		q.queue.Forget(key)
	}
	return true
}

// KeyOf is the queue key of a cluster-scoped object from an informer
// event, including deletion tombstones; ok is false for anything else.
func KeyOf(obj any) (key string, ok bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", false
	}
	return k, true
}
