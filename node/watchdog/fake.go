package watchdog

import (
	"sync"
	"time"
)

// Fake is a Watchdog that records what is done with it, for tests.
type Fake struct {
	mu         sync.Mutex
	keepalives int
	last       time.Time
	disarmed   bool
	closed     bool
}

var _ Watchdog = (*Fake)(nil)

// Keepalive counts a feeding.
func (f *Fake) Keepalive() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keepalives++
	f.last = time.Now()
	return nil
}

// LastKeepalive is when it was last fed (zero: never).
func (f *Fake) LastKeepalive() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Disarm records the magic close.
func (f *Fake) Disarm() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disarmed = true
	return nil
}

// Close records a close that leaves the watchdog armed.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// State returns how often it was fed and whether it was disarmed.
func (f *Fake) State() (keepalives int, disarmed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keepalives, f.disarmed
}
