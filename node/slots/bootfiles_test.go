package slots_test

import (
	"bytes"
	"context"
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

// publishBoot builds a release with a kernel and an initramfs (kernel
// false: the OS image only, as the lab's releases).
func (c *channel) publishBoot(version string, kernel bool) release.Target {
	c.t.Helper()
	src := c.t.TempDir()
	paths := []string{release.RootfsPath}
	if kernel {
		paths = append(paths, release.KernelPath, release.InitrdPath)
	}
	var sources []release.Source
	for _, p := range paths {
		f := filepath.Join(src, filepath.Base(p))
		assert.NilError(c.t, os.WriteFile(f, []byte(strings.Repeat(version+" "+p+"\n", 500)), 0o644))
		sources = append(sources, release.Source{Path: p, File: f})
	}
	digest, err := release.Build(c.dir, version, sources, time.Now())
	assert.NilError(c.t, err)
	return release.Target{Version: version, Digest: digest}
}

func (c *channel) artifact(version, p string) []byte {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.releaseDir(version), filepath.FromSlash(p)))
	assert.NilError(c.t, err)
	return b
}

// bootFiles returns what GRUB would find for a slot: the content of
// vmlinuz and initrd.img ("" when missing) and every other name there.
func bootFiles(t *testing.T, bootPart, slot string) (kernel, initrd string, others []string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(bootPart, slot))
	if os.IsNotExist(err) {
		return "", "", nil
	}
	assert.NilError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(bootPart, slot, e.Name()))
		assert.NilError(t, err)
		switch e.Name() {
		case "vmlinuz":
			kernel = string(b)
		case "initrd.img":
			initrd = string(b)
		default:
			others = append(others, e.Name())
		}
	}
	return kernel, initrd, others
}

func openBoot(t *testing.T, root, bootPart, booted string) *slots.Store {
	t.Helper()
	s, err := slots.Open(context.Background(), root, booted, slots.WithBootPartition(bootPart))
	assert.NilError(t, err)
	return s
}

// TestBootFilesInstalled: installing and staging a release puts its kernel
// and initramfs where grub.cfg loads the slot's, and never touches the
// proven slot's; a release without them leaves the slot nothing to load.
func TestBootFilesInstalled(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second := c.publishBoot(v1, true), c.publishBoot(v2, true)
	third := c.publishBoot(v3, false)
	root, bootPart := t.TempDir(), t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first, slots.WithBootPartition(bootPart)))
	kernel, initrd, others := bootFiles(t, bootPart, slots.A)
	assert.Check(t, is.Equal(kernel, string(c.artifact(v1, release.KernelPath))))
	assert.Check(t, is.Equal(initrd, string(c.artifact(v1, release.InitrdPath))))
	assert.Check(t, is.Len(others, 0))
	aInfo, err := os.Stat(filepath.Join(bootPart, slots.A, "vmlinuz"))
	assert.NilError(t, err)

	s := openBoot(t, root, bootPart, slots.A)
	assert.Check(t, is.Equal(s.BootDir(slots.B), filepath.Join(bootPart, slots.B)))
	_, err = s.Recheck(ctx, slots.A)
	assert.NilError(t, err)
	c.download(t, s, slots.B, second)
	kernel, _, _ = bootFiles(t, bootPart, slots.B)
	assert.Check(t, is.Equal(kernel, ""), "nothing to load before the slot is staged")
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	kernel, initrd, others = bootFiles(t, bootPart, slots.B)
	assert.Check(t, is.Equal(kernel, string(c.artifact(v2, release.KernelPath))))
	assert.Check(t, is.Equal(initrd, string(c.artifact(v2, release.InitrdPath))))
	assert.Check(t, is.Len(others, 0))
	_, err = s.Recheck(ctx, slots.B)
	assert.NilError(t, err)

	// The proven slot's files were not rewritten.
	kernel, _, _ = bootFiles(t, bootPart, slots.A)
	assert.Check(t, is.Equal(kernel, string(c.artifact(v1, release.KernelPath))))
	fi, err := os.Stat(filepath.Join(bootPart, slots.A, "vmlinuz"))
	assert.NilError(t, err)
	assert.Check(t, os.SameFile(fi, aInfo), "slot A's kernel is the file the installer wrote")

	// A release without a kernel: the older kernel of the slot goes as soon
	// as the download begins, and nothing replaces it.
	c.download(t, s, slots.B, third)
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	kernel, initrd, others = bootFiles(t, bootPart, slots.B)
	assert.Check(t, is.Equal(kernel+initrd, ""))
	assert.Check(t, is.Len(others, 0))
	_, err = s.Recheck(ctx, slots.B)
	assert.NilError(t, err)

	// Withdrawing the staged release takes its boot files too.
	c.download(t, s, slots.B, second)
	_, err = s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	assert.NilError(t, s.Withdraw(slots.B))
	kernel, initrd, _ = bootFiles(t, bootPart, slots.B)
	assert.Check(t, is.Equal(kernel+initrd, ""))
}

// TestBootFilesRecheck: the re-check before a trial reads the boot files
// GRUB would load; any difference from the release document fails it, and
// the staged slot is marked Failed with a message naming the file.
func TestBootFilesRecheck(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		kernel  bool // the staged release has a kernel
		tamper  func(t *testing.T, dir string)
		reason  release.Reason
		file    string
		message string
	}{
		{
			name: "one byte of the kernel changed", kernel: true,
			tamper:  func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, "vmlinuz"), 100) },
			reason:  release.ReasonChecksumMismatch,
			file:    release.KernelPath,
			message: "vmlinuz, where GRUB loads it from, has sha256",
		},
		{
			name: "initramfs missing", kernel: true,
			tamper:  func(t *testing.T, dir string) { assert.NilError(t, os.Remove(filepath.Join(dir, "initrd.img"))) },
			reason:  release.ReasonSizeMismatch,
			file:    release.InitrdPath,
			message: "initrd.img, where GRUB loads it from, is missing",
		},
		{
			name: "kernel cut short", kernel: true,
			tamper:  func(t *testing.T, dir string) { assert.NilError(t, os.Truncate(filepath.Join(dir, "vmlinuz"), 10)) },
			reason:  release.ReasonSizeMismatch,
			file:    release.KernelPath,
			message: "is 10 bytes, but the release document says",
		},
		{
			name: "a kernel the release does not have",
			tamper: func(t *testing.T, dir string) {
				assert.NilError(t, os.MkdirAll(dir, 0o755))
				assert.NilError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("stale"), 0o644))
			},
			reason:  release.ReasonUnexpectedFile,
			file:    release.KernelPath,
			message: "but the release has no boot/vmlinuz",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChannel(t)
			first, second := c.publishBoot(v1, true), c.publishBoot(v2, tc.kernel)
			root, bootPart := t.TempDir(), t.TempDir()
			assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first, slots.WithBootPartition(bootPart)))
			s := openBoot(t, root, bootPart, slots.A)
			c.download(t, s, slots.B, second)
			_, err := s.Stage(ctx, slots.B)
			assert.NilError(t, err)

			tc.tamper(t, filepath.Join(bootPart, slots.B))
			_, err = s.Recheck(ctx, slots.B)
			assert.Check(t, is.Equal(release.ReasonOf(err), tc.reason), "%v", err)
			assert.Check(t, is.Equal(release.FileOf(err), tc.file))
			assert.Check(t, is.ErrorContains(err, tc.message))
			assert.Check(t, is.ErrorContains(err, "changed on disk after liken verified them"))
			in := state(t, s, slots.B)
			assert.Check(t, is.Equal(in.State, v1alpha1.SlotFailed), "no trial of a slot whose boot files do not verify")
			assert.Check(t, is.Contains(in.Message, tc.file))

			// The same damage on the proven slot is reported, and its files
			// are left as they are.
			tc.tamper(t, filepath.Join(bootPart, slots.A))
			before, _, _ := bootFiles(t, bootPart, slots.A)
			_, err = s.Recheck(ctx, slots.A)
			assert.Check(t, err != nil, "the proven slot's damaged boot files are reported")
			after, _, _ := bootFiles(t, bootPart, slots.A)
			assert.Check(t, is.Equal(after, before))
			assert.Check(t, is.Equal(state(t, s, slots.A).State, v1alpha1.SlotActive))
		})
	}
}

func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	assert.NilError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	assert.NilError(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, off)
	assert.NilError(t, err)
}

// powerCut is the panic value that stops Stage at a cut point.
type powerCut struct{ point string }

// TestBootFilesPowerCut cuts the power after each write Stage makes to the
// boot partition, and checks what the next boot finds: the slot is not
// staged (so no trial can be armed for it: Recheck refuses it), GRUB's
// path for the slot holds nothing or bytes that verified, and staging the
// release again finishes the job.
func TestBootFilesPowerCut(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second, third := c.publishBoot(v1, true), c.publishBoot(v2, true), c.publishBoot(v3, true)

	// Collect the cut points of one Stage that replaces an older kernel.
	setup := func(t *testing.T) (root, bootPart string, s *slots.Store) {
		root, bootPart = t.TempDir(), t.TempDir()
		assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first, slots.WithBootPartition(bootPart)))
		s = openBoot(t, root, bootPart, slots.A)
		c.download(t, s, slots.B, second)
		_, err := s.Stage(ctx, slots.B)
		assert.NilError(t, err)
		// The next release into B: the download began, the files are in
		// the slot, Stage is next.
		c.download(t, s, slots.B, third)
		return root, bootPart, s
	}
	var points []string
	restore := slots.SetPowerCut(func(p string) { points = append(points, p) })
	_, bootPart, s := setup(t)
	points = nil
	_, err := s.Stage(ctx, slots.B)
	assert.NilError(t, err)
	restore()
	rel := func(bootPart, p string) string { return strings.ReplaceAll(p, bootPart+string(filepath.Separator), "") }
	var names []string
	for _, p := range points {
		names = append(names, rel(bootPart, p))
	}
	assert.DeepEqual(t, names, []string{"written B/vmlinuz", "renamed B/vmlinuz", "written B/initrd.img", "renamed B/initrd.img"})

	// A cut in the middle of a copy leaves a partial temporary file.
	for _, point := range append(names, "partial copy") {
		t.Run(point, func(t *testing.T) {
			root, bootPart, s := setup(t)
			if point == "partial copy" {
				assert.NilError(t, os.WriteFile(filepath.Join(bootPart, slots.B, ".liken-tmp-vmlinuz-123"), []byte("half"), 0o644))
			} else {
				restore := slots.SetPowerCut(func(p string) {
					if rel(bootPart, p) == point {
						panic(powerCut{p})
					}
				})
				func() {
					defer restore()
					defer func() {
						r := recover()
						_, ok := r.(powerCut)
						assert.Check(t, ok, "Stage reached the cut point: %v", r)
					}()
					_, _ = s.Stage(ctx, slots.B)
				}()
			}

			// The next boot (of A, the proven slot).
			s = openBoot(t, root, bootPart, slots.A)
			assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotDownloading))
			_, err := s.Recheck(ctx, slots.B)
			assert.Check(t, is.ErrorIs(err, slots.ErrWrongState), "no trial of a slot that is not staged")
			kernel, initrd, _ := bootFiles(t, bootPart, slots.B)
			for p, got := range map[string]string{release.KernelPath: kernel, release.InitrdPath: initrd} {
				assert.Check(t, got == "" || got == string(c.artifact(v3, p)), "%s: GRUB would load unverified bytes: %q", p, got[:min(len(got), 40)])
			}

			// The download resumes and staging finishes.
			dl, err := s.BeginDownload(slots.B, third)
			assert.NilError(t, err)
			dl.Close()
			_, err = s.Stage(ctx, slots.B)
			assert.NilError(t, err)
			kernel, initrd, others := bootFiles(t, bootPart, slots.B)
			assert.Check(t, is.Equal(kernel, string(c.artifact(v3, release.KernelPath))))
			assert.Check(t, is.Equal(initrd, string(c.artifact(v3, release.InitrdPath))))
			assert.Check(t, is.Len(others, 0), "temporary files are gone")
			_, err = s.Recheck(ctx, slots.B)
			assert.NilError(t, err)
			kernel, _, _ = bootFiles(t, bootPart, slots.A)
			assert.Check(t, bytes.Equal([]byte(kernel), c.artifact(v1, release.KernelPath)))
		})
	}
}

// TestBootFilesWithdrawnWhileStaged: a release withdrawn while Stage
// copies its kernel leaves no boot files behind for the emptied slot.
func TestBootFilesWithdrawnWhileStaged(t *testing.T) {
	ctx := context.Background()
	c := newChannel(t)
	first, second := c.publishBoot(v1, true), c.publishBoot(v2, true)
	root, bootPart := t.TempDir(), t.TempDir()
	assert.NilError(t, slots.Install(ctx, root, slots.A, c.releaseDir(v1), first, slots.WithBootPartition(bootPart)))
	s := openBoot(t, root, bootPart, slots.A)
	c.download(t, s, slots.B, second)
	defer slots.SetPowerCut(func(p string) {
		if strings.HasPrefix(p, "renamed ") && strings.HasSuffix(p, "vmlinuz") {
			assert.NilError(t, s.Withdraw(slots.B))
		}
	})()
	_, err := s.Stage(ctx, slots.B)
	assert.Check(t, is.ErrorIs(err, slots.ErrWithdrawn))
	assert.Check(t, is.Equal(state(t, s, slots.B).State, v1alpha1.SlotEmpty))
	kernel, initrd, others := bootFiles(t, bootPart, slots.B)
	assert.Check(t, is.Equal(kernel+initrd, ""))
	assert.Check(t, is.Len(others, 0))
}
