package endpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"liken.sh/liken/internal/pki"
)

// interval is the tests' check interval.
const interval = 20 * time.Millisecond

// backend is an API server stand-in: /readyz answers 200 while ready and
// 500 with a failed check otherwise, /name its name, /echo the body it
// was sent.
type backend struct {
	name   string
	srv    *httptest.Server
	ready  atomic.Bool
	checks atomic.Int64 // /readyz requests
}

func (b *backend) addr() string { return b.srv.Listener.Addr().String() }

// fixture is a CA, and a client that trusts it and opens a new connection
// for each request.
type fixture struct {
	ca     *pki.CA
	pool   *x509.CertPool
	client *http.Client
}

func newFixture(t *testing.T) *fixture {
	ca, err := pki.NewCA("liken test server CA", time.Now(), time.Hour)
	assert.NilError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
	}}
	t.Cleanup(client.CloseIdleConnections)
	return &fixture{ca: ca, pool: pool, client: client}
}

func (fx *fixture) backend(t *testing.T, name string, ready bool) *backend {
	leaf, err := fx.ca.Issue(pki.Request{CommonName: name, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		Usage: pki.ServerAuth, Now: time.Now(), Validity: time.Hour})
	assert.NilError(t, err)
	b := &backend{name: name}
	b.ready.Store(ready)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		b.checks.Add(1)
		if b.ready.Load() {
			fmt.Fprint(w, "ok")
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n")
	})
	mux.HandleFunc("GET /name", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) })
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(w, r.Body) })
	b.srv = httptest.NewUnstartedServer(mux)
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: leaf.Key}}}
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	return b
}

// downAddr is the address of a port nothing listens on any more.
func downAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := l.Addr().String()
	assert.NilError(t, l.Close())
	return addr
}

// running is a Forwarder serving on a loopback port.
type running struct {
	*Forwarder
	addr   string
	log    ktesting.Buffer
	cancel context.CancelFunc
	done   chan error
}

func (fx *fixture) start(t *testing.T, backends ...string) *running {
	f, err := New(backends, fx.pool)
	assert.NilError(t, err)
	f.Interval = interval
	f.Timeout = 2 * time.Second
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	r := &running{Forwarder: f, addr: l.Addr().String(), cancel: cancel, done: make(chan error, 1),
		log: logger.GetSink().(ktesting.Underlier).GetBuffer()}
	go func() { r.done <- f.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the context ended")
		}
	})
	return r
}

// name asks through the forwarder which backend answers.
func (fx *fixture) name(t *testing.T, r *running) string {
	t.Helper()
	resp, err := fx.client.Get("https://" + r.addr + "/name")
	assert.NilError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	assert.NilError(t, err)
	return string(b)
}

// names asks n times.
func (fx *fixture) names(t *testing.T, r *running, n int) []string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, fx.name(t, r))
	}
	return out
}

// readyIs waits until exactly want are ready.
func readyIs(r *running, want ...string) poll.Check {
	return func(poll.LogT) poll.Result {
		if got := r.Ready(); !slices.Equal(got, want) {
			return poll.Continue("ready: %v, want %v", got, want)
		}
		return poll.Success()
	}
}

var waitChecks = []poll.SettingOp{poll.WithTimeout(10 * time.Second), poll.WithDelay(5 * time.Millisecond)}

// logLines are the log entries about backend whose message is msg.
func logLines(r *running, backend, msg string) int {
	n := 0
	for _, e := range r.log.Data() {
		if e.Message == msg && slices.Contains(e.WithKVList, any(backend)) {
			n++
		}
	}
	return n
}

// inTurn checks that got cycles through each of want once per turn.
func inTurn(t *testing.T, got []string, want ...string) {
	t.Helper()
	first := slices.Sorted(slices.Values(got[:len(want)]))
	ok := slices.Equal(first, want)
	for i := range got {
		ok = ok && got[i] == got[i%len(want)]
	}
	assert.Check(t, ok, "got %v, want turns of %v", got, want)
}

func TestRoundRobinOverReadyBackends(t *testing.T) {
	fx := newFixture(t)
	a, b, c := fx.backend(t, "a", true), fx.backend(t, "b", true), fx.backend(t, "c", true)
	r := fx.start(t, a.addr(), b.addr(), c.addr())
	poll.WaitOn(t, readyIs(r, a.addr(), b.addr(), c.addr()), waitChecks...)

	assert.DeepEqual(t, fx.names(t, r, 6), []string{"a", "b", "c", "a", "b", "c"})
}

// A backend whose /readyz fails leaves the turn within a few checks, and
// comes back when it passes again; each change is logged once, however
// many checks find the same.
func TestNotReadyBackendLeavesTheTurn(t *testing.T) {
	fx := newFixture(t)
	a, b := fx.backend(t, "a", true), fx.backend(t, "b", true)
	r := fx.start(t, a.addr(), b.addr())
	poll.WaitOn(t, readyIs(r, a.addr(), b.addr()), waitChecks...)

	b.ready.Store(false)
	poll.WaitOn(t, readyIs(r, a.addr()), poll.WithTimeout(50*interval), poll.WithDelay(interval/4))
	assert.DeepEqual(t, fx.names(t, r, 4), []string{"a", "a", "a", "a"})

	// Several checks more find b not ready.
	seen := b.checks.Load()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := b.checks.Load() - seen; n < 3 {
			return poll.Continue("%d more checks of b", n)
		}
		return poll.Success()
	}, waitChecks...)
	b.ready.Store(true)
	poll.WaitOn(t, readyIs(r, a.addr(), b.addr()), waitChecks...)
	inTurn(t, fx.names(t, r, 4), "a", "b")

	assert.Check(t, is.Equal(logLines(r, b.addr(), "API server is ready"), 2))
	assert.Check(t, is.Equal(logLines(r, b.addr(), "API server is not ready"), 1))
	assert.Check(t, is.Contains(r.log.String(), `reason="/readyz answered 500 Internal Server Error: etcd failed: reason withheld"`))
	assert.Check(t, is.Equal(logLines(r, a.addr(), "API server is ready"), 1))
}

// With no backend ready, each connection goes to the first that accepts:
// the down one is skipped.
func TestNoneReadyFallsBackToOneThatAccepts(t *testing.T) {
	fx := newFixture(t)
	down := downAddr(t)
	b, c := fx.backend(t, "b", false), fx.backend(t, "c", false)
	r := fx.start(t, down, b.addr(), c.addr())
	// Every backend checked, and found not ready.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, addr := range []string{down, b.addr(), c.addr()} {
			if logLines(r, addr, "API server is not ready") == 0 {
				return poll.Continue("%s not checked yet", addr)
			}
		}
		return poll.Success()
	}, waitChecks...)

	assert.DeepEqual(t, fx.names(t, r, 3), []string{"b", "b", "b"})
	assert.Check(t, is.Len(r.Ready(), 0))
	assert.Check(t, is.Contains(r.log.String(), "connection refused"))
}

// A backend that is down is never ready and gets no connection, even in
// the moment after its listener closed and before a check saw it.
func TestDownBackendIsSkipped(t *testing.T) {
	fx := newFixture(t)
	a, b, c := fx.backend(t, "a", true), fx.backend(t, "b", true), fx.backend(t, "c", true)
	down := downAddr(t)
	r := fx.start(t, down, a.addr(), b.addr(), c.addr())
	poll.WaitOn(t, readyIs(r, a.addr(), b.addr(), c.addr()), waitChecks...)
	assert.DeepEqual(t, fx.names(t, r, 3), []string{"a", "b", "c"})

	// b's listener closes: connections go on to the next backend that
	// accepts until the checks drop b.
	b.srv.Close()
	for _, n := range fx.names(t, r, 4) {
		assert.Check(t, n == "a" || n == "c", "got %s", n)
	}
	poll.WaitOn(t, readyIs(r, a.addr(), c.addr()), waitChecks...)
	inTurn(t, fx.names(t, r, 4), "a", "c")
}

// An HTTPS request through the forwarder reaches the backend and its
// answer comes back unchanged: the client verifies the backend's own
// certificate, and a large random body makes the round trip intact.
func TestProxiesBytesBothWays(t *testing.T) {
	fx := newFixture(t)
	a := fx.backend(t, "a", true)
	r := fx.start(t, a.addr())
	poll.WaitOn(t, readyIs(r, a.addr()), waitChecks...)

	body := make([]byte, 4<<20)
	_, _ = rand.Read(body)
	resp, err := fx.client.Post("https://"+r.addr+"/echo", "application/octet-stream", bytes.NewReader(body))
	assert.NilError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(resp.StatusCode, http.StatusOK))
	assert.Check(t, bytes.Equal(got, body), "the echo differs: %d bytes sent, %d back", len(body), len(got))
	assert.Check(t, is.Equal(resp.TLS.PeerCertificates[0].Subject.CommonName, "a"), "TLS ends at the backend")
}

// Cancelling the context closes the listener and the open connections,
// and Serve returns nil.
func TestCancelClosesListenerAndConnections(t *testing.T) {
	fx := newFixture(t)
	a := fx.backend(t, "a", true)
	r := fx.start(t, a.addr())
	poll.WaitOn(t, readyIs(r, a.addr()), waitChecks...)

	// An open connection: TLS through to the backend, then idle.
	conn, err := tls.Dial("tcp", r.addr, &tls.Config{RootCAs: fx.pool, ServerName: "127.0.0.1"})
	assert.NilError(t, err)
	defer conn.Close()

	r.cancel()
	select {
	case err := <-r.done:
		assert.NilError(t, err)
		r.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the context ended")
	}
	_, err = net.DialTimeout("tcp", r.addr, time.Second)
	assert.Check(t, err != nil, "the listener still accepts")
	assert.NilError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	assert.Check(t, err != nil && !(errors.As(err, &ne) && ne.Timeout()), "the open connection was not closed: %v", err)
}

func TestNewRefuses(t *testing.T) {
	pool := x509.NewCertPool()
	for _, tc := range []struct {
		backends []string
		pool     *x509.CertPool
		err      string
	}{
		{backends: nil, pool: pool, err: "no backend"},
		{backends: []string{"leader-1"}, pool: pool, err: `backend "leader-1" is not host:port`},
		{backends: []string{":6443"}, pool: pool, err: `backend ":6443" is not host:port`},
		{backends: []string{"127.0.0.1:0"}, pool: pool, err: `backend "127.0.0.1:0" is not host:port: give a host and a port from 1 to 65535`},
		{backends: []string{"127.0.0.1:https"}, pool: pool, err: `backend "127.0.0.1:https" is not host:port`},
		{backends: []string{"127.0.0.1:7001", "127.0.0.1:7001"}, pool: pool, err: `backend "127.0.0.1:7001" is listed twice`},
		{backends: []string{"127.0.0.1:7001"}, pool: nil, err: "no CA"},
	} {
		t.Run(tc.err, func(t *testing.T) {
			_, err := New(tc.backends, tc.pool)
			assert.ErrorContains(t, err, tc.err)
		})
	}
}
