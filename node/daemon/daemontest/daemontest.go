// Package daemontest runs node daemons in tests: a release channel over
// HTTP and simulated machines whose firmware picks the slot from the
// grubenv with the boot script's rules, as the lab does.
package daemontest

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/release"
)

// Channel is a release channel served over HTTP for one test.
type Channel struct {
	// Dir is the channel's folder; URL is where it is served.
	Dir, URL string
	// Delay, when set, is slept before every artifact response (to keep a
	// download running).
	Delay func() time.Duration
	// Requests counts the artifact requests served.
	mu       sync.Mutex
	requests int
	rate     int
	served   int64
}

// SetRate limits every response to about bytesPerSecond (0: no limit).
func (c *Channel) SetRate(bytesPerSecond int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rate = bytesPerSecond
}

// BytesServed is how many response bytes the channel sent.
func (c *Channel) BytesServed() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.served
}

type countingWriter struct {
	http.ResponseWriter
	c *Channel
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.c.mu.Lock()
	w.c.served += int64(n)
	w.c.mu.Unlock()
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// slowWriter writes at most rate bytes per second, in tenths.
type slowWriter struct {
	http.ResponseWriter
	rate int
	ctx  context.Context
}

func (w *slowWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		chunk := min(len(b), max(w.rate/10, 1))
		m, err := w.ResponseWriter.Write(b[:chunk])
		n += m
		if err != nil {
			return n, err
		}
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		b = b[chunk:]
		select {
		case <-time.After(100 * time.Millisecond):
		case <-w.ctx.Done():
			return n, w.ctx.Err()
		}
	}
	return n, nil
}

// NewChannel serves an empty channel until the test ends.
func NewChannel(t testing.TB) *Channel {
	c := &Channel{Dir: t.TempDir()}
	files := http.FileServer(http.Dir(c.Dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if filepath.Base(r.URL.Path) != release.DocumentName && filepath.Base(r.URL.Path) != release.IndexName {
			c.mu.Lock()
			c.requests++
			delay := c.Delay
			c.mu.Unlock()
			if delay != nil {
				select {
				case <-time.After(delay()):
				case <-r.Context().Done():
					return
				}
			}
		}
		c.mu.Lock()
		rate := c.rate
		c.mu.Unlock()
		w = &countingWriter{ResponseWriter: w, c: c}
		if rate > 0 {
			w = &slowWriter{ResponseWriter: w, rate: rate, ctx: r.Context()}
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// SetDelay sets the delay before each artifact response.
func (c *Channel) SetDelay(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Delay = func() time.Duration { return d }
}

// Publish builds release version with a rootfs.squashfs of size random
// bytes and returns its digest.
func (c *Channel) Publish(t testing.TB, version string, size int) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "rootfs.squashfs")
	b := make([]byte, size)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	digest, err := release.Build(c.Dir, version, []release.Source{{Path: release.RootfsPath, File: f}}, time.Now())
	if err != nil {
		t.Fatalf("publishing %s: %v", version, err)
	}
	return digest
}

// Machine is a simulated machine: its disk (Root), its boot folder and its
// boots.
type Machine struct {
	// Name is the Machine's name.
	Name string
	// Root is the daemon's --root; BootDir its --boot-dir.
	Root, BootDir string
	// Recorder is the machine's applier and observer; it survives boots
	// (its log is on disk).
	Recorder *changes.Recorder
	// OnBoot, when set, runs at each power-on before the daemon starts:
	// the test's kubelet, which posts the Node's status for the boot (its
	// boot ID and a Ready heartbeat). A trial commits only on those.
	OnBoot func(daemon.BootInfo)

	mu    sync.Mutex
	boots int
}

// NewMachine installs release version from ch into slot A of a new
// machine and makes A the proven slot, as an installation does.
func NewMachine(t testing.TB, name string, ch *Channel, version string) *Machine {
	t.Helper()
	m := &Machine{Name: name, Root: t.TempDir(), BootDir: t.TempDir()}
	m.Recorder = changes.NewRecorder(filepath.Join(m.Root, "applier.log"))
	slotA := filepath.Join(m.Root, "slots", "A")
	if err := os.CopyFS(slotA, os.DirFS(filepath.Join(ch.Dir, version))); err != nil {
		t.Fatalf("installing %s into slot A: %v", version, err)
	}
	if err := boot.NewGRUB(m.BootDir).Commit(boot.SlotA); err != nil {
		t.Fatal(err)
	}
	return m
}

// Boots is how many times the machine booted.
func (m *Machine) Boots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boots
}

// PowerOn does what the firmware does (pick the slot, clear a trial flag)
// and returns the boot's description: the slot, the trial flag, a new
// boot ID and the version of the release in the slot.
func (m *Machine) PowerOn() (daemon.BootInfo, error) {
	sel, err := boot.SelectBootDetail(m.BootDir)
	if err != nil {
		return daemon.BootInfo{}, err
	}
	b, err := os.ReadFile(filepath.Join(m.Root, "slots", string(sel.Slot), release.DocumentName))
	if err != nil {
		return daemon.BootInfo{}, fmt.Errorf("slot %s holds no release: %w", sel.Slot, err)
	}
	doc, err := release.ParseDocument(b)
	if err != nil {
		return daemon.BootInfo{}, err
	}
	m.mu.Lock()
	m.boots++
	n := m.boots
	m.mu.Unlock()
	return daemon.BootInfo{Slot: sel.Slot, Trial: sel.Trial, BootID: fmt.Sprintf("%s-boot-%d", m.Name, n), Version: doc.Version, BootedAt: time.Now()}, nil
}

// Running is a daemon running in a goroutine.
type Running struct {
	// Boot is the boot it runs in.
	Boot daemon.BootInfo
	// Daemon is the daemon.
	Daemon *daemon.Daemon
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start boots the machine and runs a daemon with o (Machine, Root, Boot,
// Bootloader, Applier, Observer and Rebooter are filled in).
func (m *Machine) Start(t testing.TB, o daemon.Options) *Running {
	t.Helper()
	bi, err := m.PowerOn()
	if err != nil {
		t.Fatalf("powering on %s: %v", m.Name, err)
	}
	if m.OnBoot != nil {
		m.OnBoot(bi)
	}
	return m.StartIn(t, o, bi)
}

// StartIn runs a daemon in an existing boot, as after a restart of the
// daemon alone (SIGTERM, crash). An Applier, Observer or Rebooter set in o is kept
// (a test may wrap the machine's Recorder, or time the reboot); otherwise
// they are the machine's Recorder and daemon.ExitRebooter.
func (m *Machine) StartIn(t testing.TB, o daemon.Options, bi daemon.BootInfo) *Running {
	t.Helper()
	o.Machine, o.Root, o.Boot = m.Name, m.Root, bi
	o.Bootloader = boot.NewGRUB(m.BootDir)
	if o.Applier == nil {
		o.Applier = m.Recorder
	}
	if o.Observer == nil {
		o.Observer = m.Recorder
	}
	if o.Rebooter == nil {
		o.Rebooter = daemon.ExitRebooter{}
	}
	d, err := daemon.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Boot: bi, Daemon: d, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = d.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.Stop() })
	return r
}

// Stop stops the daemon (as SIGTERM does) and returns Run's result.
func (r *Running) Stop() error {
	r.cancel()
	return r.Wait()
}

// Wait waits for Run to return and returns its result.
func (r *Running) Wait() error {
	<-r.done
	return r.err
}

// Exited tells, without waiting, whether Run returned, and its result.
func (r *Running) Exited() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}
