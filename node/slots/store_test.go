package slots_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

const v1, v2, v3 = "2026.07.20-001", "2026.07.21-001", "2026.07.22-001"

// channel builds releases into a channel directory.
type channel struct {
	t   *testing.T
	dir string
}

func newChannel(t *testing.T) *channel { return &channel{t: t, dir: t.TempDir()} }

// publish builds a release whose files hold the version's name.
func (c *channel) publish(version string) release.Target {
	c.t.Helper()
	src := c.t.TempDir()
	var sources []release.Source
	for _, p := range []string{"rootfs.squashfs", "boot/vmlinuz"} {
		f := filepath.Join(src, filepath.Base(p))
		assert.NilError(c.t, os.WriteFile(f, []byte(strings.Repeat(version+" "+p+"\n", 1000)), 0o644))
		sources = append(sources, release.Source{Path: p, File: f})
	}
	digest, err := release.Build(c.dir, version, sources, time.Now())
	assert.NilError(c.t, err)
	return release.Target{Version: version, Digest: digest}
}

func (c *channel) releaseDir(version string) string { return filepath.Join(c.dir, version) }

// download writes a release into a slot through the Download handle, as
// release.Fetcher would, reading the files from the channel directory.
func (c *channel) download(t *testing.T, s *slots.Store, slot string, target release.Target) {
	t.Helper()
	dl, err := s.BeginDownload(slot, target)
	assert.NilError(t, err)
	defer dl.Close()
	b, err := os.ReadFile(filepath.Join(c.releaseDir(target.Version), "release.yaml"))
	assert.NilError(t, err)
	assert.NilError(t, dl.WriteDocument(b))
	doc, err := release.ParseDocument(b)
	assert.NilError(t, err)
	for _, a := range doc.Artifacts {
		f, err := dl.OpenArtifact(a.Path)
		assert.NilError(t, err)
		in, err := os.Open(filepath.Join(c.releaseDir(target.Version), a.Path))
		assert.NilError(t, err)
		_, err = io.Copy(f, in)
		assert.NilError(t, err)
		in.Close()
		assert.NilError(t, f.Close())
	}
}

func state(t *testing.T, s *slots.Store, slot string) slots.Info {
	t.Helper()
	in, err := s.Get(slot)
	assert.NilError(t, err)
	return in
}

func open(t *testing.T, root, booted string) *slots.Store {
	t.Helper()
	s, err := slots.Open(context.Background(), root, booted)
	assert.NilError(t, err)
	return s
}

func TestOpenNew(t *testing.T) {
	c := newChannel(t)
	target := c.publish(v1)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 7, 20, 10, 0, 0, 0, time.UTC))

	// No release in the booted slot: Active without a version.
	s, err := slots.Open(context.Background(), t.TempDir(), slots.B, slots.WithClock(clk))
	assert.NilError(t, err)
	assert.DeepEqual(t, s.Slots(), []slots.Info{
		{Name: "A", State: v1alpha1.SlotEmpty, Since: clk.Now()},
		{Name: "B", State: v1alpha1.SlotActive, Since: clk.Now()},
	})
	assert.Check(t, is.Equal(s.Other(), slots.A))

	// A release in the booted slot (put there by hand): its version and digest.
	root := t.TempDir()
	dir := filepath.Join(root, "slots", "A")
	assert.NilError(t, os.MkdirAll(dir, 0o755))
	b, err := os.ReadFile(filepath.Join(c.releaseDir(v1), "release.yaml"))
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "release.yaml"), b, 0o644))
	s = open(t, root, slots.A)
	assert.Check(t, is.Equal(state(t, s, slots.A).Target(), target))
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))

	_, err = slots.Open(context.Background(), t.TempDir(), "C")
	assert.ErrorContains(t, err, `slot "C": a slot is named A or B`)
}

func TestOpenUnreadableState(t *testing.T) {
	c := newChannel(t)
	c.publish(v1)
	for name, content := range map[string]string{
		"garbage":       "{not json",
		"unknown field": `{"formatVersion":1,"slots":[],"extra":1}`,
		"future format": `{"formatVersion":9,"slots":[]}`,
		"bad state":     `{"formatVersion":1,"slots":[{"name":"A","state":"Active"},{"name":"B","state":"Bootable"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			assert.NilError(t, os.MkdirAll(filepath.Join(root, "state"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(root, "state", "slots.json"), []byte(content), 0o644))
			s := open(t, root, slots.A)
			assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
			assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotEmpty))
		})
	}
}

// TestOpenStateOfAnotherRelease: the store a newer (or older) liken-node
// wrote, with fields this one does not know, is read as it is: the slot
// whose trial failed stays Failed instead of the store starting over.
func TestOpenStateOfAnotherRelease(t *testing.T) {
	root := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "state"), 0o755))
	content := `{"formatVersion": 2, "futureField": true,
		"slots": [{"name": "A", "state": "Active", "version": "` + v1 + `", "since": "2026-07-20T10:00:00Z"},
		          {"name": "B", "state": "Failed", "version": "` + v2 + `", "message": "trial failed", "since": "2026-07-21T10:00:00Z", "bootCount": 1}]}`
	assert.NilError(t, os.WriteFile(filepath.Join(root, "state", "slots.json"), []byte(content), 0o644))
	s := open(t, root, slots.A)
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
	b := state(t, s, slots.B)
	assert.Check(t, is.Equal(b.State, v1alpha1.SlotFailed))
	assert.Check(t, is.Equal(b.Version, v2))
	assert.Check(t, is.Equal(b.Message, "trial failed"))
}

// TestLifecycle: install, download, stage, trial boot, commit, and the
// next release into the slot that became Previous.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second, third := c.publish(v1), c.publish(v2), c.publish(v3)
	root := t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first))
	assert.ErrorContains(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first), "already holds an installed machine")

	s := open(t, root, slots.A)
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
	assert.Check(t, is.Equal(state(t, s, slots.A).Target(), first))
	_, err := s.Recheck(ctx, slots.A)
	assert.NilError(t, err)

	c.download(t, s, slots.B, second)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotDownloading))
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotStaged))
	assert.Check(t, is.Equal(state(t, s, slots.B).Target(), second))

	// Trial boot of B: A is the only proven slot and is never written.
	s = open(t, root, slots.B)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotStaged))
	_, err = s.BeginDownload(slots.A, third)
	assert.Check(t, is.ErrorIs(err, slots.ErrActiveSlot))
	_, err = s.BeginDownload(slots.B, third)
	assert.Check(t, is.ErrorIs(err, slots.ErrBootedSlot))
	assert.Check(t, is.ErrorIs(s.Withdraw(slots.A), slots.ErrActiveSlot))
	assert.Check(t, is.ErrorIs(s.Commit(slots.A), slots.ErrWrongState))
	assert.NilError(t, s.Commit(slots.B))
	assert.NilError(t, s.Commit(slots.B)) // idempotent

	s = open(t, root, slots.B)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotActive))
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotPrevious))
	assert.Check(t, is.Equal(state(t, s, slots.A).Target(), first))

	// The next release goes into A, which held the previous one.
	c.download(t, s, slots.A, third)
	_, err = s.Stage(ctx, slots.A)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(state(t, s, slots.A).Target(), third))
	_, err = os.Stat(filepath.Join(root, "slots", "A", "boot", "vmlinuz"))
	assert.NilError(t, err)
}

// TestTrialFailed: the trial slot is marked Failed, from the trial boot or
// after the fall back; the proven slot never is.
// stagedTrial installs release v1 (first) in slot A and stages v2
// (second) in slot B, as before a trial of B.
func stagedTrial(t *testing.T) (root string, first, second release.Target) {
	t.Helper()
	ctx := context.Background()
	c := newChannel(t)
	first, second = c.publish(v1), c.publish(v2)
	root = t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first))
	s := open(t, root, slots.A)
	c.download(t, s, slots.B, second)
	_, err := s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	return root, first, second
}

func TestTrialFailed(t *testing.T) {
	ctx := context.Background()
	root, _, second := stagedTrial(t)
	s := open(t, root, slots.A) // the firmware fell back to A
	assert.Check(t, is.ErrorIs(s.MarkFailed(slots.A, "x"), slots.ErrActiveSlot))
	assert.NilError(t, s.MarkFailed(slots.B, "trial failed: node not Ready within 10m"))
	s = open(t, root, slots.A)
	in := state(t, s, slots.B)
	assert.Check(t, is.Equal(in.State, v1alpha1.SlotFailed))
	assert.Check(t, is.Equal(in.Message, "trial failed: node not Ready within 10m"))
	assert.Check(t, is.Equal(in.Target(), second))
	_, err := s.Stage(ctx, slots.B)
	assert.Check(t, is.ErrorIs(err, slots.ErrWrongState))

	// A new download of the same release starts from scratch.
	assert.NilError(t, os.WriteFile(filepath.Join(root, "slots", "B", "stray"), []byte("x"), 0o644))
	dl, err := s.BeginDownload(slots.B, second)
	assert.NilError(t, err)
	defer dl.Close()
	assert.Check(t, is.Nil(dl.Checkpoint()))
	_, err = os.Stat(filepath.Join(root, "slots", "B", "stray"))
	assert.Check(t, os.IsNotExist(err), "the slot is emptied")
}

// TestReconcileWithTheBootLoader: slots.json was unreadable during a trial
// of B, so the trial boot started over with B Active and A Empty; the
// trial failed and A booted. Reconciled with the boot loader (A proven),
// A is Active again and B Failed, so the failure can be recorded and B
// written again; a store that agrees is left alone.
func TestReconcileWithTheBootLoader(t *testing.T) {
	root, first, second := stagedTrial(t)

	// The trial boot of B finds slots.json unreadable.
	assert.NilError(t, os.WriteFile(filepath.Join(root, "state", "slots.json"), []byte("{torn"), 0o644))
	s := open(t, root, slots.B)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotActive))
	changed, err := s.Reconcile(slots.A) // the trial boot: the boot loader proves A
	assert.NilError(t, err)
	assert.Check(t, is.Len(changed, 2), "%v", changed)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotStaged))
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
	assert.Check(t, is.Equal(state(t, s, slots.A).Target(), first), "the version read from the slot's release.yaml")

	// Without the reconcile, the fall back to A would find B Active.
	assert.NilError(t, os.WriteFile(filepath.Join(root, "state", "slots.json"), []byte("{torn"), 0o644))
	open(t, root, slots.B)
	s = open(t, root, slots.A)
	assert.Check(t, is.ErrorIs(s.MarkFailed(slots.B, "trial failed"), slots.ErrActiveSlot))
	_, err = s.BeginDownload(slots.B, second)
	assert.Check(t, is.ErrorIs(err, slots.ErrActiveSlot), "the machine could never download again")
	changed, err = s.Reconcile(slots.A)
	assert.NilError(t, err)
	assert.Check(t, is.Len(changed, 2), "%v", changed)
	assert.Check(t, is.Contains(changed[1], "slot B was Active, but the boot loader proves slot A"))
	assert.NilError(t, s.MarkFailed(slots.B, "trial failed"))
	dl, err := s.BeginDownload(slots.B, second)
	assert.NilError(t, err)
	assert.NilError(t, dl.Close())

	// Agreeing stores are left as they are.
	s = open(t, root, slots.A)
	changed, err = s.Reconcile(slots.A)
	assert.NilError(t, err)
	assert.Check(t, is.Len(changed, 0))
}

// TestRecheck: a staged slot whose bytes changed is marked Failed; an
// Active one is reported but left alone.
func TestRecheck(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second := c.publish(v1), c.publish(v2)
	root := t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first))
	s := open(t, root, slots.A)
	c.download(t, s, slots.B, second)
	_, err := s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	_, err = s.Recheck(ctx, slots.B)
	assert.NilError(t, err)

	for _, slot := range []string{"A", "B"} {
		f, err := os.OpenFile(filepath.Join(root, "slots", slot, "rootfs.squashfs"), os.O_WRONLY, 0)
		assert.NilError(t, err)
		_, err = f.WriteAt([]byte("X"), 10)
		assert.NilError(t, err)
		assert.NilError(t, f.Close())
	}
	_, err = s.Recheck(ctx, slots.B)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonChecksumMismatch))
	assert.Check(t, is.Equal(release.FileOf(err), "rootfs.squashfs"))
	assert.Check(t, is.ErrorContains(err, "the slot's bytes changed on disk after liken verified them"))
	assert.Check(t, !strings.Contains(err.Error(), "the channel serves"), err.Error())
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotFailed))
	assert.Check(t, is.Contains(state(t, s, slots.B).Message, "changed on disk"))
	_, err = s.Recheck(ctx, slots.A)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonChecksumMismatch))
	assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
	_, err = s.Recheck(ctx, slots.B)
	assert.Check(t, is.ErrorIs(err, slots.ErrWrongState))
}

// TestStage covers what Stage refuses.
func TestStage(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second := c.publish(v1), c.publish(v2)
	root := t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first))
	s := open(t, root, slots.A)

	_, err := s.Stage(ctx, slots.A)
	assert.Check(t, is.ErrorIs(err, slots.ErrBootedSlot))
	_, err = s.Stage(ctx, slots.B)
	assert.Check(t, is.ErrorIs(err, slots.ErrWrongState), "an Empty slot cannot be staged")

	// A stray file in the slot.
	c.download(t, s, slots.B, second)
	assert.NilError(t, os.WriteFile(filepath.Join(root, "slots", "B", "boot", "initrd"), []byte("x"), 0o644))
	_, err = s.Stage(ctx, slots.B)
	assert.Check(t, is.Equal(release.ReasonOf(err), release.ReasonUnexpectedFile), "%v", err)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotFailed))

	// A canceled verification changes nothing.
	c.download(t, s, slots.B, second)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Stage(canceled, slots.B)
	assert.Check(t, is.ErrorIs(err, context.Canceled))
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotDownloading))
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
}

// TestDownloadHandle: the handle writes only inside the slot, keeps its
// checkpoint across a restart, and stops when replaced.
func TestDownloadHandle(t *testing.T) {
	c := newChannel(t)
	first, second := c.publish(v1), c.publish(v2)
	root := t.TempDir()
	s := open(t, root, slots.A)
	dl, err := s.BeginDownload(slots.B, first)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(dl.Slot(), slots.B))
	assert.Check(t, is.Equal(dl.Target(), first))
	for _, p := range []string{"../escape", "/etc/passwd"} {
		_, err := dl.OpenArtifact(p)
		assert.Check(t, err != nil, p)
	}
	_, err = os.Stat(filepath.Join(root, "slots", "escape"))
	assert.Check(t, os.IsNotExist(err))

	cp := release.Checkpoint{Version: v1, Digest: first.Digest, Artifact: 1, Path: "boot/vmlinuz", Offset: 7, HashState: []byte("state")}
	assert.NilError(t, dl.SaveCheckpoint(cp))
	assert.ErrorContains(t, dl.SaveCheckpoint(release.Checkpoint{Version: v2, Digest: second.Digest}), "does not belong")
	f, err := dl.OpenArtifact("rootfs.squashfs")
	assert.NilError(t, err)
	_, err = f.Write([]byte("partial"))
	assert.NilError(t, err)
	assert.NilError(t, f.Close())

	// Restart: the same release resumes with its bytes and checkpoint.
	s = open(t, root, slots.A)
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotDownloading))
	dl, err = s.BeginDownload(slots.B, first)
	assert.NilError(t, err)
	assert.DeepEqual(t, dl.Checkpoint(), &cp)
	b, err := os.ReadFile(filepath.Join(root, "slots", "B", "rootfs.squashfs"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "partial"))

	// Another release: the old handle stops, the slot is emptied.
	dl2, err := s.BeginDownload(slots.B, second)
	assert.NilError(t, err)
	defer dl2.Close()
	assert.Check(t, dl.Context().Err() != nil)
	assert.Check(t, is.ErrorIs(dl.WriteDocument([]byte("x")), slots.ErrWithdrawn))
	assert.Check(t, is.Nil(dl.Checkpoint()))
	assert.Check(t, is.Nil(dl2.Checkpoint()))
	entries, err := os.ReadDir(filepath.Join(root, "slots", "B"))
	assert.NilError(t, err)
	assert.Check(t, is.Len(entries, 0))
	assert.Check(t, is.Equal(state(t, s, slots.B).Target(), second))
}
