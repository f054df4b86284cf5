package release_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// testChannel is a real channel directory built by release.Build, shared
// by an httptest server that counts what it serves and injects faults.
type testChannel struct {
	t   testing.TB
	dir string
	srv *httptest.Server

	mu     sync.Mutex
	served map[string]int64 // bytes served per URL path
	reqs   map[string]int   // requests per URL path
	// cut: the first cut[path].n responses for path are cut after .after bytes.
	cut map[string]*cutRule
	// block: the first response for path stops after that many bytes and
	// waits until the client goes away; reached is closed then.
	block map[string]*blockRule
	// ignoreRange makes the server answer every request with the whole file.
	ignoreRange bool
	// override serves a path with a custom handler.
	override map[string]http.HandlerFunc
}

type cutRule struct {
	after int64
	n     int
}

type blockRule struct {
	after   int64
	used    bool
	reached chan struct{}
}

func newChannel(t testing.TB) *testChannel {
	c := &testChannel{t: t, dir: t.TempDir(), served: map[string]int64{}, reqs: map[string]int{}, cut: map[string]*cutRule{}, block: map[string]*blockRule{}, override: map[string]http.HandlerFunc{}}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *testChannel) serve(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.reqs[r.URL.Path]++
	if c.ignoreRange {
		r.Header.Del("Range")
	}
	h := c.override[r.URL.Path]
	var limit int64 = -1
	var blk *blockRule
	if rule := c.cut[r.URL.Path]; rule != nil && rule.n > 0 {
		rule.n--
		limit = rule.after
	}
	if rule := c.block[r.URL.Path]; rule != nil && !rule.used {
		rule.used = true
		limit, blk = rule.after, rule
	}
	c.mu.Unlock()
	cw := &countingWriter{ResponseWriter: w, c: c, path: r.URL.Path, limit: limit, block: blk, ctx: r.Context()}
	if h != nil {
		h(cw, r)
		return
	}
	http.FileServer(http.Dir(c.dir)).ServeHTTP(cw, r)
}

// countingWriter counts the body bytes served, and cuts or stalls the
// response after limit bytes.
type countingWriter struct {
	http.ResponseWriter
	c     *testChannel
	path  string
	limit int64
	block *blockRule
	ctx   context.Context
}

func (w *countingWriter) Write(p []byte) (int, error) {
	stop := false
	if w.limit >= 0 && int64(len(p)) >= w.limit {
		p, stop = p[:w.limit], true
	}
	n, err := w.ResponseWriter.Write(p)
	w.c.mu.Lock()
	w.c.served[w.path] += int64(n)
	w.c.mu.Unlock()
	if w.limit >= 0 {
		w.limit -= int64(n)
	}
	if stop {
		w.Flush()
		if w.block != nil {
			close(w.block.reached)
			<-w.ctx.Done()
		}
		panic(http.ErrAbortHandler) // the connection is cut
	}
	return n, err
}

func (w *countingWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

func (c *testChannel) servedBytes(path string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.served[path]
}

func (c *testChannel) requests(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reqs[path]
}

func (c *testChannel) set(f func(c *testChannel)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

// artifact is a file to publish: its path and size; content is random.
type artifact struct {
	path string
	size int
}

// publish builds a release with random artifacts into the channel and
// returns its catalog entry.
func (c *testChannel) publish(version string, arts ...artifact) release.Target {
	c.t.Helper()
	src := c.t.TempDir()
	rng := rand.NewChaCha8([32]byte([]byte(strings.Repeat(version, 3))[:32]))
	var sources []release.Source
	for i, a := range arts {
		b := make([]byte, a.size)
		_, _ = rng.Read(b)
		file := filepath.Join(src, string(rune('a'+i)))
		assert.NilError(c.t, os.WriteFile(file, b, 0o644))
		sources = append(sources, release.Source{Path: a.path, File: file})
	}
	digest, err := release.Build(c.dir, version, sources, time.Date(2026, 7, 20, 10, 0, 0, 0, time.UTC))
	assert.NilError(c.t, err)
	return release.Target{Version: version, Digest: digest}
}

// file is the path of a channel file on disk.
func (c *testChannel) file(version, path string) string {
	return filepath.Join(c.dir, version, filepath.FromSlash(path))
}

// urlPath is the URL path a file of a release is served at.
func urlPath(version, path string) string { return "/" + version + "/" + path }

var standard = []artifact{{"rootfs.squashfs", 3<<20 + 12345}, {"boot/vmlinuz", 300 << 10}}

const v1, v2 = "2026.07.20-001", "2026.07.21-001"

// openStore opens a slot store for a machine booted from A.
func openStore(t *testing.T, root string) *slots.Store {
	t.Helper()
	s, err := slots.Open(context.Background(), root, slots.A)
	assert.NilError(t, err)
	return s
}

func fetcher(c *testChannel) *release.Fetcher {
	return &release.Fetcher{Client: c.srv.Client(), CheckpointBytes: 256 << 10, IdleTimeout: 10 * time.Second}
}

// assertNotStaged checks that slot B is not Staged, and that a fresh
// store on the same root (the state on disk) agrees.
func assertNotStaged(t *testing.T, s *slots.Store) {
	t.Helper()
	in, err := s.Get(slots.B)
	assert.NilError(t, err)
	assert.Check(t, in.State != v1alpha1.SlotStaged, "slot B must not be staged")
	b, err := os.ReadFile(filepath.Join(s.Root(), "state", "slots.json"))
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(b), `"Staged"`), "state on disk must not say Staged: %s", b)
}

// assertStaged checks that slot B is staged with target and that its
// files equal the channel's.
func assertStaged(t *testing.T, s *slots.Store, c *testChannel, target release.Target) {
	t.Helper()
	in, err := s.Get(slots.B)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(in.State, v1alpha1.SlotStaged))
	assert.Check(t, is.Equal(in.Target(), target))
	_, d, err := release.DigestOf(context.Background(), nil, c.file(target.Version, "release.yaml"))
	assert.NilError(t, err)
	for _, a := range d.Artifacts {
		want, err := os.ReadFile(c.file(target.Version, a.Path))
		assert.NilError(t, err)
		got, err := os.ReadFile(filepath.Join(s.Dir(slots.B), filepath.FromSlash(a.Path)))
		assert.NilError(t, err)
		assert.Check(t, string(got) == string(want), "slot file %s differs from the channel", a.Path)
	}
}

// diskFullSink fails writes with ENOSPC once left bytes are written.
type diskFullSink struct {
	release.Sink
	left int64
}

func (s *diskFullSink) OpenArtifact(p string) (release.File, error) {
	f, err := s.Sink.OpenArtifact(p)
	if err != nil {
		return nil, err
	}
	return &diskFullFile{File: f, s: s}, nil
}

type diskFullFile struct {
	release.File
	s *diskFullSink
}

func (f *diskFullFile) Write(b []byte) (int, error) {
	if int64(len(b)) > f.s.left {
		return 0, &os.PathError{Op: "write", Path: "slot", Err: syscall.ENOSPC}
	}
	f.s.left -= int64(len(b))
	return f.File.Write(b)
}

func isWithdrawn(err error) bool { return errors.Is(err, slots.ErrWithdrawn) }
