// Package release reads, writes, fetches and verifies liken releases and their channel.
//
// A channel is a directory any web server can share:
//
//	<channel>/index.yaml                 every release the channel announces
//	<channel>/<version>/release.yaml     the release document
//	<channel>/<version>/<artifact path>  the files the document lists
//
// A release document looks like this (fields in any order; unknown fields
// are refused):
//
//	apiVersion: liken.sh/v1alpha1
//	kind: Release
//	version: 2026.07.20-001
//	artifacts:
//	- path: rootfs.squashfs        # required: the OS image
//	  size: 734003200
//	  sha256: 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03
//	- path: boot/vmlinuz
//	  size: 12345678
//	  sha256: ...
//
// and the index:
//
//	apiVersion: liken.sh/v1alpha1
//	kind: ReleaseIndex
//	releases:
//	- version: 2026.07.20-001
//	  digest: sha256:47f30ef764270b4d55cc38e4f0afb2e8912da297d0c3e2b6d18fe2e8c24eb9e2
//	  published: "2026-07-20T10:00:00Z"
//
// A cluster pins each release by the digest of its release.yaml bytes
// (Digest). Every byte a machine downloads is checked against that digest
// or against the sha256 the verified document gives for the artifact.
package release

// Limits on what a channel may send. Every document is read with a bound
// and refused beyond it, so a hostile or broken channel cannot exhaust a
// machine's memory or disk.
const (
	// MaxDocumentBytes bounds the size of a release.yaml.
	MaxDocumentBytes = 1 << 20
	// MaxIndexBytes bounds the size of an index.yaml.
	MaxIndexBytes = 4 << 20
	// MaxArtifacts bounds the number of artifacts in one release.
	MaxArtifacts = 256
	// MaxIndexEntries bounds the number of releases an index may announce.
	MaxIndexEntries = 10000
	// MaxArtifactBytes bounds the size of one artifact.
	MaxArtifactBytes int64 = 16 << 30
	// MaxReleaseBytes bounds the total size of a release's artifacts.
	MaxReleaseBytes int64 = 32 << 30
	// MaxPathLength bounds the length of an artifact path.
	MaxPathLength = 255
)

// Names and format markers of the channel files.
const (
	// DocumentName is the file name of the release document.
	DocumentName = "release.yaml"
	// IndexName is the file name of the channel index.
	IndexName = "index.yaml"
	// RootfsPath is the artifact every release holds: the OS image.
	RootfsPath = "rootfs.squashfs"
	// KernelPath and InitrdPath are the optional artifacts GRUB boots: the
	// slot store installs them on the boot partition as /<slot>/vmlinuz
	// and /<slot>/initrd.img when it stages the slot.
	KernelPath = "boot/vmlinuz"
	InitrdPath = "boot/initrd.img"
	// APIVersion marks the format of release documents and indexes.
	APIVersion = "liken.sh/v1alpha1"
	// KindRelease is the kind of a release document.
	KindRelease = "Release"
	// KindIndex is the kind of a channel index.
	KindIndex = "ReleaseIndex"
)

// bufferSize is the size of the buffers used to copy and hash artifacts:
// large enough that the per-call overhead is negligible next to hashing.
const bufferSize = 1 << 20
