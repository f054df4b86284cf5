// Package lastwrite lets a controller work from its own last write of an
// object until its informer's cache delivers that write.
package lastwrite

import "sync"

// Object is an API object as a pointer (*likenv1.Machine, say).
type Object interface {
	comparable
	GetResourceVersion() string
}

// Writes remembers, per key, the object the last successful write
// returned and every resourceVersion the writes in a row before the cache
// caught up replaced. A controller that decided from a replaced version
// would only write again and be refused as a conflict. It is safe for
// concurrent use.
type Writes[T Object] struct {
	mu   sync.Mutex
	last map[string]*last[T]
}

type last[T Object] struct {
	out      T
	replaced map[string]bool
}

// Latest is the object to work from for key: what the last write
// returned while cached is a version that write, or one before it,
// replaced; otherwise cached, and the writes are forgotten (the cache
// caught up with them, or another writer moved the object on).
func (w *Writes[T]) Latest(key string, cached T) T {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.last[key]
	if l != nil && l.replaced[cached.GetResourceVersion()] {
		return l.out
	}
	delete(w.last, key)
	return cached
}

// Wrote records that a write of key made against resourceVersion from
// succeeded and returned out. An out without a resourceVersion cannot be
// told from the cache's copies: the writes of key are forgotten.
func (w *Writes[T]) Wrote(key, from string, out T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var zero T
	if out == zero || out.GetResourceVersion() == "" {
		delete(w.last, key)
		return
	}
	l := w.last[key]
	if l == nil {
		if w.last == nil {
			w.last = map[string]*last[T]{}
		}
		l = &last[T]{replaced: map[string]bool{}}
		w.last[key] = l
	}
	l.replaced[from] = true
	// A write that changed nothing keeps the version it was made against.
	delete(l.replaced, out.GetResourceVersion())
	l.out = out
}

// Forget drops the writes of key: after a write that failed, or once the
// object is gone.
func (w *Writes[T]) Forget(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}
