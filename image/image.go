// Package image names what make image writes: the files of liken's OS image, which a release of it publishes.
package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"liken.sh/liken/release"
)

// ReleaseFile is the image's release file, relative to its root: it names
// the release version the image is, as VERSION=<version>.
const ReleaseFile = "etc/liken/release"

// ReleaseFileContent is the release file of an image of version.
func ReleaseFileContent(version string) string { return "VERSION=" + version + "\n" }

// The files make image writes into its output folder. A release of the
// image carries the root as its image and the others as artifacts at
// their Artifact paths.
const (
	// RootFS is the read-only root file system (squashfs).
	RootFS = "rootfs.squashfs"
	// Kernel is the kernel GRUB loads.
	Kernel = "vmlinuz"
	// Initramfs is liken's initramfs.
	Initramfs = "initrd.img"
	// Packages lists every Debian package and built component with its
	// version.
	Packages = "packages.txt"
)

// Files are every file make image writes.
var Files = []string{RootFS, Kernel, Initramfs, Packages}

// ArtifactFlags are the --artifact values (PATH=FILE) of liken release that
// publish the image in dir with its kernel, initramfs and package list.
func ArtifactFlags(dir string) []string {
	return []string{
		release.KernelPath + "=" + filepath.Join(dir, Kernel),
		release.InitrdPath + "=" + filepath.Join(dir, Initramfs),
		Packages + "=" + filepath.Join(dir, Packages),
	}
}

// ParseReleaseFile reads the version of the running image from its release
// file (ReleaseFile): either VERSION=<version> (or
// LIKEN_VERSION=, optionally quoted) in os-release style, or the version
// alone on the first line.
func ParseReleaseFile(b []byte) (string, error) {
	if len(b) > 64<<10 {
		return "", errors.New("the release file is larger than 64 KiB")
	}
	var first string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if k, v, ok := strings.Cut(l, "="); ok {
			if k == "VERSION" || k == "LIKEN_VERSION" {
				v = strings.Trim(v, `"'`)
				if !release.ValidVersion(v) {
					return "", fmt.Errorf("%s=%q is not a release version (YYYY.MM.DD-NNN)", k, v)
				}
				return v, nil
			}
			continue
		}
		if first == "" {
			first = l
		}
	}
	if release.ValidVersion(first) {
		return first, nil
	}
	return "", errors.New("no release version found: the file holds VERSION=YYYY.MM.DD-NNN or the version alone")
}
