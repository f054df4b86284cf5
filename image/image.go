// Package image names what make image writes: the files of liken's OS image, which a release of it publishes.
package image

import (
	"path/filepath"

	"liken.sh/liken/release"
)

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
