package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"liken.sh/liken/image"
	"liken.sh/liken/release"
)

// Faults a lab release can carry. Each lives in the image or in the bytes
// the channel serves, never in a shortcut of the node daemon.
const (
	// FaultNone is a good release.
	FaultNone = ""
	// FaultPanic: the image's init fails, so the kernel panics at boot.
	FaultPanic = "panic"
	// FaultNoRejoin: the image boots, but its network configuration cannot
	// reach the cluster's API, so the machine never rejoins.
	FaultNoRejoin = "no-rejoin"
	// FaultCorrupt: the channel serves image bytes that do not match the
	// release document.
	FaultCorrupt = "corrupt"
)

// Files inside a lab image that the simulated firmware reads.
const (
	imageInit    = "sbin/init"
	imageNetwork = "etc/liken/lab-network"
)

// imageMiB is the size of the payload in each lab image (default 4 MiB;
// LIKEN_LAB_IMAGE_MIB changes it, for slower downloads).
func imageMiB() int {
	if v, err := strconv.Atoi(os.Getenv("LIKEN_LAB_IMAGE_MIB")); err == nil && v > 0 && v <= 4096 {
		return v
	}
	return 4
}

// buildImage writes a squashfs image for version with mksquashfs: a small
// root file system whose /etc/liken/release names the version, whose
// /sbin/init the firmware runs at boot, and a payload so downloads take
// measurable time.
func buildImage(work, version, fault string) (string, error) {
	if _, err := exec.LookPath("mksquashfs"); err != nil {
		return "", fmt.Errorf("mksquashfs is missing: install squashfs-tools (apt-get install squashfs-tools, or run hack/install-deps.sh)")
	}
	root := filepath.Join(work, "rootfs-"+version)
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	init := "#!/bin/sh\necho \"liken init: release " + version + " is up\"\nexit 0\n"
	network := "api=reachable\n"
	switch fault {
	case FaultPanic:
		init = "#!/bin/sh\necho \"liken init: cannot mount the root file system\" >&2\nexit 1\n"
	case FaultNoRejoin:
		network = "api=unreachable\n"
	}
	files := map[string]string{
		image.ReleaseFile: image.ReleaseFileContent(version),
		"etc/os-release":  "NAME=liken\nID=liken\nVERSION_ID=" + version + "\nPRETTY_NAME=\"liken " + version + "\"\n",
		imageInit:         init,
		imageNetwork:      network,
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			return "", err
		}
	}
	payload := filepath.Join(root, "usr", "lib", "liken", "payload")
	if err := os.MkdirAll(filepath.Dir(payload), 0o755); err != nil {
		return "", err
	}
	if err := writePayload(payload, version, imageMiB()<<20); err != nil {
		return "", err
	}
	img := filepath.Join(work, version+".squashfs")
	_ = os.Remove(img)
	out, err := exec.Command("mksquashfs", root, img, "-noappend", "-quiet", "-no-progress",
		"-comp", "gzip", "-all-root", "-mkfs-time", "0", "-all-time", "0").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mksquashfs: %w\n%s", err, out)
	}
	return img, os.RemoveAll(root)
}

// writePayload writes size pseudo-random bytes seeded by the version, so
// every release differs and none compresses away.
func writePayload(path, version string, size int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var seed [32]byte
	copy(seed[:], version)
	r := rand.NewChaCha8(seed)
	w := bufio.NewWriterSize(f, 1<<20)
	buf := make([]byte, 64<<10)
	for done := 0; done < size; done += len(buf) {
		_, _ = r.Read(buf)
		if _, err := w.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readImageFile returns one file of a squashfs image (unsquashfs -cat).
func readImageFile(img, name string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("unsquashfs", "-cat", img, name)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("reading %s from %s: %v %s", name, img, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// nextVersion is the version after the newest one in the channel: the
// same day's next number, or today's first.
func nextVersion(channelDir string, now time.Time) (string, error) {
	idx, err := release.ReadIndex(channelDir)
	if err != nil {
		return "", err
	}
	today := now.UTC().Format("2006.01.02")
	n := 1
	for _, r := range idx.Releases {
		if strings.HasPrefix(r.Version, today+"-") {
			k, err := strconv.Atoi(strings.TrimPrefix(r.Version, today+"-"))
			if err == nil && k >= n {
				n = k + 1
			}
		}
	}
	if n > 999 {
		return "", fmt.Errorf("the channel already holds 999 releases for %s", today)
	}
	return fmt.Sprintf("%s-%03d", today, n), nil
}

// publish builds the next release into the channel and returns its
// version and digest. A corrupt release is published whole, then its
// image bytes are damaged in place: the channel serves bytes that do not
// match the release document.
func publish(st *State, fault string) (version, digest string, err error) {
	switch fault {
	case FaultNone, FaultPanic, FaultNoRejoin, FaultCorrupt:
	default:
		return "", "", fmt.Errorf("--fault %q: choose panic (the image does not boot), no-rejoin (it boots but never rejoins) or corrupt (the channel serves bytes that do not match the release document)", fault)
	}
	if st.RealImage() {
		return publishVM(st, fault)
	}
	version, err = nextVersion(st.ChannelDir, time.Now())
	if err != nil {
		return "", "", err
	}
	work := filepath.Join(st.Dir, "images")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return "", "", err
	}
	img, err := buildImage(work, version, fault)
	if err != nil {
		return "", "", err
	}
	digest, err = release.Build(st.ChannelDir, version, []release.Source{{Path: "rootfs.squashfs", File: img}}, time.Now().UTC())
	if err != nil {
		return "", "", err
	}
	if fault == FaultCorrupt {
		if err := corrupt(filepath.Join(st.ChannelDir, version, "rootfs.squashfs")); err != nil {
			return "", "", err
		}
	}
	return version, digest, nil
}

// corrupt flips bytes in the middle of a file, keeping its size.
func corrupt(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteAt([]byte("liken-lab-corrupted-bytes"), st.Size()/2); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
