// Package endpoint forwards one TCP port to whichever of several Kubernetes API servers is ready: the VM lab's API endpoint.
package endpoint

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Defaults of a Forwarder made by New: a leader that stops answering is
// out of the turn within DefaultInterval plus DefaultTimeout.
const (
	// DefaultInterval is how often each backend's /readyz is checked.
	DefaultInterval = time.Second
	// DefaultTimeout bounds each check and each connection attempt.
	DefaultTimeout = 2 * time.Second
)

// Forwarder sends each TCP connection it accepts, unchanged, to one of its
// backends (API servers, as host:port): the next ready one in turn, or,
// when none is ready, the first that accepts the connection. A backend is
// ready while its GET /readyz answers 200 over TLS verified against the
// CA.
type Forwarder struct {
	// Interval is how often each backend's /readyz is checked; New sets
	// DefaultInterval.
	Interval time.Duration
	// Timeout bounds each check and each connection attempt to a backend;
	// New sets DefaultTimeout.
	Timeout time.Duration
	// Dial connects to a backend, for a check or a forwarded connection;
	// New sets a net.Dialer's. The namespace lab's dials in the lab's
	// network namespace.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)

	backends []string
	client   *http.Client

	mu     sync.Mutex
	health []health // by backend
	next   int      // where the turn of the ready backends starts
}

// health is what the last check of a backend found.
type health struct {
	ready  bool
	reason string // why it is not ready
}

// New returns a Forwarder over backends, each host:port of an API server,
// whose serving certificates ca verifies.
func New(backends []string, ca *x509.CertPool) (*Forwarder, error) {
	if len(backends) == 0 {
		return nil, errors.New("no backend: give at least one API server as host:port")
	}
	seen := map[string]bool{}
	for _, b := range backends {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			return nil, fmt.Errorf("backend %q is not host:port: %w", b, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || n == 0 {
			return nil, fmt.Errorf("backend %q is not host:port: give a host and a port from 1 to 65535", b)
		}
		if seen[b] {
			return nil, fmt.Errorf("backend %q is listed twice: list each API server once", b)
		}
		seen[b] = true
	}
	if ca == nil {
		return nil, errors.New("no CA: give the CA that signs the API servers' certificates")
	}
	f := &Forwarder{
		Interval: DefaultInterval,
		Timeout:  DefaultTimeout,
		Dial:     (&net.Dialer{}).DialContext,
		backends: append([]string(nil), backends...),
		health:   make([]health, len(backends)),
	}
	f.client = &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true, // each check connects afresh, as clients do
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return f.Dial(ctx, network, address)
		},
	}}
	return f, nil
}

// Ready returns the backends whose last check found them ready, in the
// order New was given them.
func (f *Forwarder) Ready() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for i, h := range f.health {
		if h.ready {
			out = append(out, f.backends[i])
		}
	}
	return out
}

// Serve checks the backends and forwards the connections each listener
// accepts until ctx ends; then it closes the listeners and every
// connection, and returns nil once they are closed. It returns an error
// only when a listener is closed under it.
func (f *Forwarder) Serve(ctx context.Context, ls ...net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, l := range ls {
		context.AfterFunc(ctx, func() { l.Close() })
	}
	for i := range f.backends {
		wg.Go(func() { f.watch(ctx, i) })
	}
	errs := make(chan error, len(ls))
	for _, l := range ls {
		wg.Go(func() { errs <- f.accept(ctx, l, &wg) })
	}
	var first error
	for range ls {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// accept forwards the connections l accepts until ctx ends or l is
// closed under it, each in a goroutine of wg.
func (f *Forwarder) accept(ctx context.Context, l net.Listener, wg *sync.WaitGroup) error {
	log := klog.FromContext(ctx)
	for {
		c, err := l.Accept()
		switch {
		case ctx.Err() != nil:
			if c != nil {
				c.Close()
			}
			return nil
		case errors.Is(err, net.ErrClosed):
			return fmt.Errorf("accepting connections: %w", err)
		case err != nil:
			// Out of file descriptors, say: wait, as net/http does.
			log.Error(err, "Accepting a connection failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		wg.Go(func() { f.forward(ctx, c) })
	}
}

// watch checks backend i every Interval until ctx ends, and logs each
// change of its state.
func (f *Forwarder) watch(ctx context.Context, i int) {
	log := klog.FromContext(ctx).WithValues("backend", f.backends[i])
	tick := time.NewTicker(f.Interval)
	defer tick.Stop()
	for {
		h := f.check(ctx, f.backends[i])
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		old := f.health[i]
		f.health[i] = h
		f.mu.Unlock()
		if h != old {
			if h.ready {
				log.Info("API server is ready")
			} else {
				log.Info("API server is not ready", "reason", h.reason)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// check asks backend's /readyz once, within Timeout.
func (f *Forwarder) check(ctx context.Context, backend string) health {
	ctx, cancel := context.WithTimeout(ctx, f.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+backend+"/readyz", nil)
	if err != nil {
		return health{reason: err.Error()}
	}
	resp, err := f.client.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return health{reason: fmt.Sprintf("/readyz did not answer within %s", f.Timeout)}
	}
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err // without the URL, which names the backend again
	}
	if err != nil {
		return health{reason: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if resp.StatusCode == http.StatusOK {
		return health{ready: true}
	}
	// The API server lists its failing checks as "[-]etcd failed: ...".
	reason := "/readyz answered " + resp.Status
	var failed []string
	for _, line := range strings.Split(string(body), "\n") {
		if s, ok := strings.CutPrefix(line, "[-]"); ok {
			failed = append(failed, s)
		}
	}
	if len(failed) > 0 {
		reason += ": " + strings.Join(failed, "; ")
	}
	return health{reason: reason}
}

// forward connects client to a backend and copies bytes both ways until
// either side closes or ctx ends; then it closes both.
func (f *Forwarder) forward(ctx context.Context, client net.Conn) {
	defer client.Close()
	backend, err := f.dial(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("No API server accepted a connection; closing the client's", "client", client.RemoteAddr(), "err", err)
		return
	}
	defer backend.Close()
	stop := context.AfterFunc(ctx, func() {
		client.Close()
		backend.Close()
	})
	defer stop()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(backend, client)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, backend)
		done <- struct{}{}
	}()
	<-done
	client.Close()
	backend.Close()
	<-done
}

// dial connects to the first backend that accepts, of the ready ones in
// turn and then the others in order.
func (f *Forwarder) dial(ctx context.Context) (net.Conn, error) {
	var errs []error
	for _, i := range f.candidates() {
		dctx, cancel := context.WithTimeout(ctx, f.Timeout)
		c, err := f.Dial(dctx, "tcp", f.backends[i])
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// candidates lists the backends to try for a new connection: the ready
// ones, starting after the one chosen last, then the others in order.
func (f *Forwarder) candidates() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.backends)
	var ready, rest []int
	for k := range n {
		if i := (f.next + k) % n; f.health[i].ready {
			ready = append(ready, i)
		}
	}
	for i := range n {
		if !f.health[i].ready {
			rest = append(rest, i)
		}
	}
	if len(ready) > 0 {
		f.next = ready[0] + 1
	}
	return append(ready, rest...)
}
