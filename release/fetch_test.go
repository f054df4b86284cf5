package release_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

func TestFetchAndStage(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	s := openStore(t, t.TempDir())

	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()
	in, _ := s.Get(slots.B)
	assert.Check(t, is.Equal(in.State, v1alpha1.SlotDownloading))

	f := fetcher(c)
	var last, calls int64
	f.Progress = func(done, total int64) {
		assert.Check(t, done >= last && done <= total, "progress %d of %d after %d", done, total, last)
		last = done
		calls++
	}
	res, err := f.Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	total := int64(standard[0].size + standard[1].size)
	doc, err := os.ReadFile(c.file(v1, "release.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(res.Total, total))
	assert.Check(t, is.Equal(res.Done, total))
	assert.Check(t, is.Equal(res.Transferred, total+int64(len(doc))))
	assert.Check(t, is.Equal(res.Reused, int64(0)))
	assert.Check(t, is.Equal(last, total))
	assert.Check(t, calls > 0)
	assertNotStaged(t, s) // downloaded, not yet re-verified

	d, err := s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(d.Version, v1))
	assertStaged(t, s, c, target)

	// The handle stops writing once the slot is staged.
	assert.Check(t, isWithdrawn(dl.SaveCheckpoint(release.Checkpoint{Version: target.Version, Digest: target.Digest})))
	_, err = dl.OpenArtifact("rootfs.squashfs")
	assert.Check(t, isWithdrawn(err))
	// Staging the same release again is refused, and so is the booted slot.
	_, err = s.BeginDownload(slots.B, target)
	assert.Check(t, is.ErrorIs(err, slots.ErrAlreadyStaged))
	_, err = s.BeginDownload(slots.A, target)
	assert.Check(t, is.ErrorIs(err, slots.ErrBootedSlot))

	// A restart sees the same state.
	assertStaged(t, openStore(t, s.Root()), c, target)
}

// TestFetchRefuses: every way a channel can serve bad bytes is refused
// with the reason and the file, and the slot is never staged.
func TestFetchRefuses(t *testing.T) {
	type setup struct {
		c      *testChannel
		target release.Target
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, s *setup)
		sink    func(release.Sink) release.Sink
		reason  release.Reason
		file    string
		want    string
		// staged: what Stage says afterwards (the slot holds a partial
		// or wrong download, so it must fail verification).
		stageReason release.Reason
	}{
		{
			name: "digest mismatch on release.yaml",
			prepare: func(t *testing.T, s *setup) {
				s.target.Digest = release.Digest([]byte("another document"))
			},
			reason: release.ReasonDigestMismatch, file: "release.yaml", want: "but the catalog pins",
		},
		{
			name: "release.yaml changed on the channel",
			prepare: func(t *testing.T, s *setup) {
				p := s.c.file(v1, "release.yaml")
				b, err := os.ReadFile(p)
				assert.NilError(t, err)
				assert.NilError(t, os.WriteFile(p, append(b, "# harmless?\n"...), 0o644))
			},
			reason: release.ReasonDigestMismatch, file: "release.yaml", want: "but the catalog pins",
		},
		{
			name: "version differs from the catalog entry",
			prepare: func(t *testing.T, s *setup) {
				// The channel serves release v2's document under v1.
				other := s.c.publish(v2, standard...)
				assert.NilError(t, os.Rename(s.c.file(v1, ""), s.c.file(v1, "")+".old"))
				assert.NilError(t, os.Rename(s.c.file(v2, ""), s.c.file(v1, "")))
				s.target.Digest = other.Digest
			},
			reason: release.ReasonVersionMismatch, file: "release.yaml", want: "is release 2026.07.21-001, but the catalog entry is for 2026.07.20-001",
		},
		{
			name: "corrupt artifact",
			prepare: func(t *testing.T, s *setup) {
				p := s.c.file(v1, "rootfs.squashfs")
				b, err := os.ReadFile(p)
				assert.NilError(t, err)
				b[len(b)/2] ^= 0x01
				assert.NilError(t, os.WriteFile(p, b, 0o644))
			},
			reason: release.ReasonChecksumMismatch, file: "rootfs.squashfs", want: "but the release document says", stageReason: release.ReasonSizeMismatch,
		},
		{
			name: "oversized artifact, announced",
			prepare: func(t *testing.T, s *setup) {
				f, err := os.OpenFile(s.c.file(v1, "boot/vmlinuz"), os.O_APPEND|os.O_WRONLY, 0)
				assert.NilError(t, err)
				_, err = f.Write([]byte("more bytes than declared"))
				assert.NilError(t, err)
				assert.NilError(t, f.Close())
			},
			reason: release.ReasonOversize, file: "boot/vmlinuz", want: "is 307224 bytes, but the release document says 307200", stageReason: release.ReasonSizeMismatch,
		},
		{
			name: "oversized artifact, streamed without a length",
			prepare: func(t *testing.T, s *setup) {
				p := s.c.file(v1, "boot/vmlinuz")
				s.c.override[urlPath(v1, "boot/vmlinuz")] = func(w http.ResponseWriter, r *http.Request) {
					b, err := os.ReadFile(p)
					if err != nil {
						panic(err)
					}
					w.(http.Flusher).Flush() // no Content-Length: chunked
					w.Write(b)
					w.Write([]byte("and then some"))
				}
			},
			reason: release.ReasonOversize, file: "boot/vmlinuz", want: "sends more than the 307200 bytes", stageReason: release.ReasonSizeMismatch,
		},
		{
			name: "short artifact",
			prepare: func(t *testing.T, s *setup) {
				assert.NilError(t, os.Truncate(s.c.file(v1, "rootfs.squashfs"), 1000))
			},
			reason: release.ReasonSizeMismatch, file: "rootfs.squashfs", want: "is 1000 bytes, but the release document says", stageReason: release.ReasonSizeMismatch,
		},
		{
			name: "missing artifact",
			prepare: func(t *testing.T, s *setup) {
				assert.NilError(t, os.Remove(s.c.file(v1, "boot/vmlinuz")))
			},
			reason: release.ReasonNotFound, file: "boot/vmlinuz", want: "404 Not Found", stageReason: release.ReasonSizeMismatch,
		},
		{
			name: "path traversal",
			prepare: func(t *testing.T, s *setup) {
				// A hostile document, pinned by its own digest.
				doc := fmt.Sprintf("apiVersion: liken.sh/v1alpha1\nkind: Release\nversion: %s\nartifacts:\n- path: rootfs.squashfs\n  size: 1\n  sha256: %s\n- path: ../../state/slots.json\n  size: 2\n  sha256: %s\n",
					v1, strings.Repeat("a", 64), strings.Repeat("b", 64))
				assert.NilError(t, os.WriteFile(s.c.file(v1, "release.yaml"), []byte(doc), 0o644))
				s.target.Digest = release.Digest([]byte(doc))
			},
			reason: release.ReasonPathTraversal, file: "../../state/slots.json", want: "must not contain . or .. elements",
		},
		{
			name: "release.yaml too large",
			prepare: func(t *testing.T, s *setup) {
				big := strings.Repeat("#", release.MaxDocumentBytes+10)
				assert.NilError(t, os.WriteFile(s.c.file(v1, "release.yaml"), []byte(big), 0o644))
				s.target.Digest = release.Digest([]byte(big))
			},
			reason: release.ReasonInvalidDocument, file: "release.yaml", want: "(MaxDocumentBytes)",
		},
		{
			name: "channel unreachable",
			prepare: func(t *testing.T, s *setup) {
				s.c.srv.Close()
			},
			reason: release.ReasonUnreachable, file: "release.yaml", want: "connect: connection refused",
		},
		{
			name: "server error",
			prepare: func(t *testing.T, s *setup) {
				s.c.override[urlPath(v1, "rootfs.squashfs")] = func(w http.ResponseWriter, r *http.Request) {
					http.Error(w, "overloaded", http.StatusServiceUnavailable)
				}
			},
			reason: release.ReasonUnreachable, file: "rootfs.squashfs", want: "503 Service Unavailable", stageReason: release.ReasonSizeMismatch,
		},
		{
			name:   "disk full",
			sink:   func(s release.Sink) release.Sink { return &diskFullSink{Sink: s, left: 1 << 20} },
			reason: release.ReasonDiskFull, file: "rootfs.squashfs", want: "no space left on device", stageReason: release.ReasonSizeMismatch,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := &setup{c: newChannel(t)}
			st.target = st.c.publish(v1, standard...)
			if tc.prepare != nil {
				st.c.set(func(*testChannel) { tc.prepare(t, st) })
			}
			s := openStore(t, t.TempDir())
			dl, err := s.BeginDownload(slots.B, st.target)
			assert.NilError(t, err)
			defer dl.Close()
			var sink release.Sink = dl
			if tc.sink != nil {
				sink = tc.sink(dl)
			}
			_, err = fetcher(st.c).Fetch(ctx, st.c.srv.URL, st.target, sink)
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, is.Equal(release.ReasonOf(err), tc.reason), "%v", err)
			assert.Check(t, is.Equal(release.FileOf(err), tc.file))
			assertNotStaged(t, s)

			// Nothing outside the slot was written.
			entries, err := os.ReadDir(s.Root())
			assert.NilError(t, err)
			assert.Check(t, is.Len(entries, 2)) // slots, state

			// Staging what is there fails and marks the slot Failed.
			_, err = s.Stage(ctx, slots.B)
			assert.Check(t, err != nil)
			if tc.stageReason != "" {
				assert.Check(t, is.Equal(release.ReasonOf(err), tc.stageReason), "%v", err)
			}
			in, _ := s.Get(slots.B)
			assert.Check(t, is.Equal(in.State, v1alpha1.SlotFailed))
			assert.Check(t, in.Message != "")
			assertNotStaged(t, openStore(t, s.Root()))
		})
	}
}

// TestFetchResumesAfterCut: a connection cut mid-artifact resumes with a
// range request from the persisted offset and hash state.
func TestFetchResumesAfterCut(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	rootfs := urlPath(v1, "rootfs.squashfs")
	size := int64(standard[0].size)
	c.set(func(c *testChannel) { c.cut[rootfs] = &cutRule{after: 2<<20 + 777, n: 1} })
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()

	res1, err := fetcher(c).Fetch(ctx, c.srv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.Check(t, is.Equal(release.FileOf(err), "rootfs.squashfs"))
	assert.ErrorContains(t, err, "cut after byte")
	assertNotStaged(t, s)
	cp := s.Checkpoint(slots.B)
	assert.Assert(t, cp != nil)
	assert.Check(t, is.Equal(cp.Path, "rootfs.squashfs"))
	assert.Check(t, cp.Offset > 1<<20 && cp.Offset <= 2<<20+777, "offset %d", cp.Offset)

	f := fetcher(c)
	var progress []int64
	f.Progress = func(done, total int64) { progress = append(progress, done) }
	res2, err := f.Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(res2.Reused, cp.Offset))
	assert.Check(t, is.Equal(progress[0], cp.Offset), "progress starts with the bytes already in the slot")
	assert.Check(t, is.Equal(progress[len(progress)-1], res2.Total))
	served := c.servedBytes(rootfs)
	t.Logf("rootfs %d bytes: served %d in total (first attempt %d, then resumed from %d)", size, served, res1.Transferred, cp.Offset)
	assert.Check(t, served < 2*size, "served %d bytes of a %d-byte artifact", served, size)
	assert.Check(t, is.Equal(served, cp.Offset+(size-cp.Offset)+(2<<20+777-cp.Offset)))
	assert.Check(t, is.Equal(c.requests(rootfs), 2))

	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assertStaged(t, s, c, target)
}

// TestFetchServerIgnoresRange: a server that answers a range request with
// the whole file restarts that artifact cleanly.
func TestFetchServerIgnoresRange(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	rootfs := urlPath(v1, "rootfs.squashfs")
	size := int64(standard[0].size)
	c.set(func(c *testChannel) {
		c.cut[rootfs] = &cutRule{after: 1<<20 + 5, n: 1}
		c.ignoreRange = true
	})
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()

	_, err = fetcher(c).Fetch(ctx, c.srv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.Assert(t, s.Checkpoint(slots.B).Offset > 0)

	res, err := fetcher(c).Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(c.servedBytes(rootfs), 1<<20+5+size))
	assert.Check(t, res.Transferred > size)
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assertStaged(t, s, c, target)
}

// TestFetchStalled: a server that stops sending is cut after IdleTimeout,
// and the download resumes from where it stopped.
func TestFetchStalled(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	rootfs := urlPath(v1, "rootfs.squashfs")
	c.set(func(c *testChannel) { c.block[rootfs] = &blockRule{after: 1 << 20, reached: make(chan struct{})} })
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()

	f := fetcher(c)
	f.IdleTimeout = 200 * time.Millisecond
	_, err = f.Fetch(ctx, c.srv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.ErrorContains(t, err, "sent nothing for 200ms after byte 1048576")
	assert.Check(t, is.Equal(s.Checkpoint(slots.B).Offset, int64(1<<20)))

	_, err = f.Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assertStaged(t, s, c, target)
}

// TestRetarget: a new target while a download runs stops it promptly and
// downloads the new release into the same slot.
func TestRetarget(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first := c.publish(v1, standard...)
	second := c.publish(v2, standard...)
	blk := &blockRule{after: 1 << 20, reached: make(chan struct{})}
	c.set(func(c *testChannel) { c.block[urlPath(v1, "rootfs.squashfs")] = blk })
	s := openStore(t, t.TempDir())

	dl1, err := s.BeginDownload(slots.B, first)
	assert.NilError(t, err)
	defer dl1.Close()
	done := make(chan error, 1)
	go func() {
		_, err := fetcher(c).Fetch(ctx, c.srv.URL, first, dl1)
		done <- err
	}()
	<-blk.reached // the first download is under way

	dl2, err := s.BeginDownload(slots.B, second)
	assert.NilError(t, err)
	defer dl2.Close()
	select {
	case err := <-done:
		assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonCanceled), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the withdrawn download did not stop")
	}
	assert.Check(t, is.Nil(s.Checkpoint(slots.B)), "the old download's progress is gone")
	_, err = dl1.OpenArtifact("rootfs.squashfs")
	assert.Check(t, isWithdrawn(err))

	_, err = fetcher(c).Fetch(ctx, c.srv.URL, second, dl2)
	assert.NilError(t, err)
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assertStaged(t, s, c, second)

	// Retarget again, once staged: Withdraw empties the slot.
	assert.NilError(t, s.Withdraw(slots.B))
	in, _ := s.Get(slots.B)
	assert.Check(t, is.Equal(in.State, v1alpha1.SlotEmpty))
	assertNotStaged(t, openStore(t, s.Root()))
}

// TestWithdrawStopsFetch: Withdraw cancels the running fetch through the
// handle's context.
func TestWithdrawStopsFetch(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	blk := &blockRule{after: 1 << 20, reached: make(chan struct{})}
	c.set(func(c *testChannel) { c.block[urlPath(v1, "rootfs.squashfs")] = blk })
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()
	done := make(chan error, 1)
	go func() {
		_, err := fetcher(c).Fetch(ctx, c.srv.URL, target, dl)
		done <- err
	}()
	<-blk.reached
	assert.NilError(t, s.Withdraw(slots.B))
	select {
	case err := <-done:
		assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonCanceled), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the withdrawn download did not stop")
	}
	in, _ := s.Get(slots.B)
	assert.Check(t, is.Equal(in.State, v1alpha1.SlotEmpty))
	_, err = s.Stage(ctx, slots.B)
	assert.Check(t, is.ErrorIs(err, slots.ErrWrongState))
	assertNotStaged(t, s)
}

// TestCrashRecovery: a new Store and Fetcher on the same root (a restarted
// daemon) resume correctly from every point of the pipeline.
func TestCrashRecovery(t *testing.T) {
	type env struct {
		c      *testChannel
		target release.Target
		root   string
	}
	fetchAll := func(t *testing.T, e *env) {
		s := openStore(t, e.root)
		dl, err := s.BeginDownload(slots.B, e.target)
		assert.NilError(t, err)
		defer dl.Close()
		_, err = fetcher(e.c).Fetch(context.Background(), e.c.srv.URL, e.target, dl)
		assert.NilError(t, err)
	}
	for _, tc := range []struct {
		name string
		// crash runs the pipeline up to the crash.
		crash func(t *testing.T, e *env)
		// maxTransfer bounds what the resumed fetch may download.
		maxTransfer int64
		// stageFails: the bytes on disk are bad; Stage must refuse them
		// once, and a fresh download then succeeds.
		stageFails bool
		staged     bool
	}{
		{
			name: "after marking Downloading",
			crash: func(t *testing.T, e *env) {
				_, err := openStore(t, e.root).BeginDownload(slots.B, e.target)
				assert.NilError(t, err)
			},
			maxTransfer: 4 << 20,
		},
		{
			name: "after a checkpoint, with bytes written past it",
			crash: func(t *testing.T, e *env) {
				e.c.set(func(c *testChannel) { c.cut[urlPath(v1, "rootfs.squashfs")] = &cutRule{after: 2 << 20, n: 1} })
				s := openStore(t, e.root)
				dl, err := s.BeginDownload(slots.B, e.target)
				assert.NilError(t, err)
				f := fetcher(e.c)
				f.CheckpointBytes = 1 << 20
				// No checkpoint on the way out, as in a crash.
				_, err = f.Fetch(context.Background(), e.c.srv.URL, e.target, &noFinalCheckpoint{Sink: dl, keep: 1})
				assert.Check(t, err != nil)
				off := s.Checkpoint(slots.B).Offset
				assert.Check(t, off >= 1<<20 && off < 2<<20, "offset %d", off)
			},
			maxTransfer: 3<<20 + 400<<10,
		},
		{
			name: "after a checkpoint, the slot lost the bytes",
			crash: func(t *testing.T, e *env) {
				e.c.set(func(c *testChannel) { c.cut[urlPath(v1, "rootfs.squashfs")] = &cutRule{after: 2 << 20, n: 1} })
				s := openStore(t, e.root)
				dl, err := s.BeginDownload(slots.B, e.target)
				assert.NilError(t, err)
				_, err = fetcher(e.c).Fetch(context.Background(), e.c.srv.URL, e.target, dl)
				assert.Check(t, err != nil)
				assert.NilError(t, os.Truncate(filepath.Join(s.Dir(slots.B), "rootfs.squashfs"), 100))
			},
			maxTransfer: 4 << 20,
		},
		{
			name:        "after every artifact, before staging",
			crash:       fetchAll,
			maxTransfer: 1 << 10, // release.yaml only
		},
		{
			name: "after every artifact, the disk corrupted a byte",
			crash: func(t *testing.T, e *env) {
				fetchAll(t, e)
				p := filepath.Join(e.root, "slots", "B", "boot", "vmlinuz")
				b, err := os.ReadFile(p)
				assert.NilError(t, err)
				b[7] ^= 0x80
				assert.NilError(t, os.WriteFile(p, b, 0o644))
			},
			maxTransfer: 1 << 10,
			stageFails:  true,
		},
		{
			name: "after staging",
			crash: func(t *testing.T, e *env) {
				fetchAll(t, e)
				_, err := openStore(t, e.root).Stage(context.Background(), slots.B)
				assert.NilError(t, err)
			},
			staged: true,
		},
		{
			name: "withdrawn mid-download",
			crash: func(t *testing.T, e *env) {
				e.c.set(func(c *testChannel) { c.cut[urlPath(v1, "rootfs.squashfs")] = &cutRule{after: 2 << 20, n: 1} })
				s := openStore(t, e.root)
				dl, err := s.BeginDownload(slots.B, e.target)
				assert.NilError(t, err)
				_, err = fetcher(e.c).Fetch(context.Background(), e.c.srv.URL, e.target, dl)
				assert.Check(t, err != nil)
				assert.NilError(t, s.Withdraw(slots.B))
			},
			maxTransfer: 4 << 20,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := &env{c: newChannel(t), root: t.TempDir()}
			e.target = e.c.publish(v1, standard...)
			tc.crash(t, e)

			s := openStore(t, e.root) // the restarted daemon
			if tc.staged {
				assertStaged(t, s, e.c, e.target)
				_, err := s.Recheck(ctx, slots.B)
				assert.NilError(t, err)
				return
			}
			assertNotStaged(t, s)
			dl, err := s.BeginDownload(slots.B, e.target)
			assert.NilError(t, err)
			defer dl.Close()
			res, err := fetcher(e.c).Fetch(ctx, e.c.srv.URL, e.target, dl)
			assert.NilError(t, err)
			assert.Check(t, res.Transferred <= tc.maxTransfer, "transferred %d, expected at most %d", res.Transferred, tc.maxTransfer)
			_, err = s.Stage(ctx, slots.B)
			if tc.stageFails {
				assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonChecksumMismatch), "%v", err)
				assert.Check(t, is.Equal(release.FileOf(err), "boot/vmlinuz"))
				assertNotStaged(t, s)
				dl, err = s.BeginDownload(slots.B, e.target)
				assert.NilError(t, err)
				defer dl.Close()
				_, err = fetcher(e.c).Fetch(ctx, e.c.srv.URL, e.target, dl)
				assert.NilError(t, err)
				_, err = s.Stage(ctx, slots.B)
			}
			assert.NilError(t, err)
			assertStaged(t, s, e.c, e.target)
		})
	}
}

// noFinalCheckpoint passes the first keep checkpoints inside an artifact
// and drops every later one, like a daemon that dies before it can save.
type noFinalCheckpoint struct {
	release.Sink
	keep int
}

func (s *noFinalCheckpoint) SaveCheckpoint(cp release.Checkpoint) error {
	if cp.Offset == 0 {
		return s.Sink.SaveCheckpoint(cp)
	}
	if s.keep == 0 {
		return nil
	}
	s.keep--
	return s.Sink.SaveCheckpoint(cp)
}

// TestCheckpointState: a checkpoint on disk is read back by a new store.
func TestCheckpointState(t *testing.T) {
	c := newChannel(t)
	target := c.publish(v1, standard...)
	root := t.TempDir()
	s := openStore(t, root)
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	cp := release.Checkpoint{Version: target.Version, Digest: target.Digest, Artifact: 0, Path: "rootfs.squashfs", Offset: 42, HashState: []byte{1, 2, 3}}
	assert.NilError(t, dl.SaveCheckpoint(cp))
	got := openStore(t, root).Checkpoint(slots.B)
	assert.DeepEqual(t, got, &cp)
}

// TestFetchDocumentDeadline: a server that sends release.yaml's headers
// and then stalls is cut after DocumentTimeout (the idle timeout of the
// artifacts does not cover the document), and the next attempt reads it.
func TestFetchDocumentDeadline(t *testing.T) {
	// The test's own bound: without the deadline, Fetch would wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	c.set(func(c *testChannel) {
		c.block[urlPath(v1, release.DocumentName)] = &blockRule{after: 16, reached: make(chan struct{})}
	})
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()

	f := fetcher(c)
	f.DocumentTimeout = 300 * time.Millisecond
	_, err = f.Fetch(ctx, c.srv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.ErrorContains(t, err, "took longer than 300ms")

	_, err = f.Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
}

// TestFetchIndexDeadline: a channel that sends index.yaml's headers and
// then stalls is cut after DocumentTimeout, with an error that says so,
// and the next read gets the index.
func TestFetchIndexDeadline(t *testing.T) {
	// The test's own bound: without the deadline, FetchIndex would wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	idx := release.NewIndex()
	idx.Put(release.IndexEntry{Version: v1, Digest: target.Digest, Published: time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)})
	b, err := idx.Marshal()
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(c.dir, release.IndexName), b, 0o644))
	blk := &blockRule{after: 16, reached: make(chan struct{})}
	c.set(func(c *testChannel) { c.block["/"+release.IndexName] = blk })

	f := fetcher(c)
	f.DocumentTimeout = 300 * time.Millisecond
	_, err = f.FetchIndex(ctx, c.srv.URL)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.Check(t, is.Equal(release.FileOf(err), release.IndexName), "%v", err)
	assert.ErrorContains(t, err, "took longer than 300ms")
	select {
	case <-blk.reached:
	default:
		t.Fatal("the channel never stalled: the cut came before the body")
	}

	got, err := f.FetchIndex(ctx, c.srv.URL)
	assert.NilError(t, err)
	assert.Equal(t, got.Newest().Version, v1)
}

// TestRedirectToPlainHTTPRefused: a channel read over https never
// continues over plain http, for release.yaml and index.yaml alike.
func TestRedirectToPlainHTTPRefused(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, c.srv.URL+r.URL.Path, http.StatusFound)
	}))
	defer tlsSrv.Close()
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()

	f := &release.Fetcher{Client: tlsSrv.Client()}
	_, err = f.Fetch(ctx, tlsSrv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnreachable), "%v", err)
	assert.ErrorContains(t, err, "refused the redirect from https://")
	assert.Check(t, is.Equal(c.servedBytes(urlPath(v1, release.DocumentName)), int64(0)))

	_, err = release.FetchIndex(ctx, tlsSrv.Client(), tlsSrv.URL)
	assert.ErrorContains(t, err, "refused the redirect from https://")

	// A redirect that stays on https is followed.
	tlsChannel := httptest.NewTLSServer(http.HandlerFunc(c.serve))
	defer tlsChannel.Close()
	hop := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, tlsChannel.URL+r.URL.Path, http.StatusFound)
	}))
	defer hop.Close()
	_, err = f.Fetch(ctx, hop.URL, target, dl)
	assert.NilError(t, err)
}

// TestFetchAsksForSpaceFirst: before it writes any artifact byte, the
// fetch asks whether the bytes still to come fit; a refusal stops it with
// NotEnoughSpace and nothing but release.yaml in the slot, and a fetch
// that resumes asks only for what is left.
func TestFetchAsksForSpaceFirst(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	s := openStore(t, t.TempDir())
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	f := fetcher(c)
	var asked []int64
	f.Space = func(need int64) error {
		asked = append(asked, need)
		return errors.New("the slot store has 10 MiB free")
	}
	res, err := f.Fetch(ctx, c.srv.URL, target, dl)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonNotEnoughSpace), "%v", err)
	assert.ErrorContains(t, err, "the slot store has 10 MiB free")
	assert.DeepEqual(t, asked, []int64{res.Total})
	entries, err := os.ReadDir(s.Dir(slots.B))
	assert.NilError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.DeepEqual(t, names, []string{"release.yaml"})
	assert.NilError(t, dl.Close())

	// With room, the same download goes through.
	dl, err = s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	f.Space = func(need int64) error { asked = append(asked, need); return nil }
	_, err = f.Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	assert.NilError(t, dl.Close())
	assert.Equal(t, len(asked), 2)
}
