package watchdog

import "sync"

// Fake is a Watchdog that records what is done with it, for tests.
type Fake struct {
	mu         sync.Mutex
	keepalives int
	disarmed   bool
	closed     bool
}

var _ Watchdog = (*Fake)(nil)

// Keepalive counts a feeding.
func (f *Fake) Keepalive() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keepalives++
	return nil
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
