package release_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// Environment of the child process TestFetchKilled starts and kills.
const (
	envChildRoot    = "LIKEN_TEST_FETCH_CHILD_ROOT"
	envChildURL     = "LIKEN_TEST_FETCH_CHILD_URL"
	envChildVersion = "LIKEN_TEST_FETCH_CHILD_VERSION"
	envChildDigest  = "LIKEN_TEST_FETCH_CHILD_DIGEST"
)

func TestMain(m *testing.M) {
	if root := os.Getenv(envChildRoot); root != "" {
		os.Exit(fetchChild(root))
	}
	os.Exit(m.Run())
}

// fetchChild is a daemon that downloads a release until it is killed.
func fetchChild(root string) int {
	ctx := context.Background()
	s, err := slots.Open(ctx, root, slots.A)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	target := release.Target{Version: os.Getenv(envChildVersion), Digest: os.Getenv(envChildDigest)}
	dl, err := s.BeginDownload(slots.B, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f := &release.Fetcher{CheckpointBytes: 128 << 10}
	_, err = f.Fetch(ctx, os.Getenv(envChildURL), target, dl)
	fmt.Fprintln(os.Stderr, "fetch ended:", err)
	return 1
}

// TestFetchKilled: the daemon is killed (SIGKILL) in the middle of an
// artifact; a new daemon on the same root resumes from the persisted
// offset and hash state and stages a slot that verifies.
func TestFetchKilled(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	target := c.publish(v1, standard...)
	rootfs := urlPath(v1, "rootfs.squashfs")
	size := int64(standard[0].size)
	blk := &blockRule{after: 2 << 20, reached: make(chan struct{})}
	c.set(func(c *testChannel) { c.block[rootfs] = blk })
	root := t.TempDir()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildRoot+"="+root, envChildURL+"="+c.srv.URL, envChildVersion+"="+target.Version, envChildDigest+"="+target.Digest)
	cmd.Stderr = os.Stderr
	assert.NilError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// Wait until the child persisted progress past the first MiB of rootfs.
	statePath := filepath.Join(root, "state", "slots.json")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-exited:
			return poll.Error(fmt.Errorf("the child exited early: %v", err))
		default:
		}
		var st struct {
			Download *struct {
				Checkpoint *release.Checkpoint `json:"checkpoint"`
			} `json:"download"`
		}
		b, err := os.ReadFile(statePath)
		if err != nil || json.Unmarshal(b, &st) != nil || st.Download == nil || st.Download.Checkpoint == nil {
			return poll.Continue("no checkpoint yet")
		}
		if cp := st.Download.Checkpoint; cp.Path == "rootfs.squashfs" && cp.Offset > 1<<20 {
			return poll.Success()
		}
		return poll.Continue("checkpoint %+v", st.Download.Checkpoint)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(10*time.Millisecond))
	assert.NilError(t, cmd.Process.Kill())
	<-exited

	s := openStore(t, root) // the restarted daemon
	assertNotStaged(t, s)
	cp := s.Checkpoint(slots.B)
	assert.Assert(t, cp != nil)
	dl, err := s.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	defer dl.Close()
	res, err := fetcher(c).Fetch(ctx, c.srv.URL, target, dl)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(res.Reused, cp.Offset))
	served := c.servedBytes(rootfs)
	t.Logf("rootfs %d bytes: served %d in total, resumed from %d after the kill", size, served, cp.Offset)
	assert.Check(t, served < 2*size, "served %d bytes of a %d-byte artifact", served, size)
	assert.Check(t, is.Equal(served, 2<<20+size-cp.Offset))

	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assertStaged(t, s, c, target)
}
