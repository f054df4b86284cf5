// Package oci writes container images as OCI image layout archives, the form liken preloads into a machine's container runtime.
package oci

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"liken.sh/liken/internal/atomicfile"
)

// Media types of the OCI image specification.
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// Image is an image for linux/amd64: its own layer, over a base layer if
// it has one.
type Image struct {
	// Name is the image's full reference, such as liken.sh/pause:3.10.
	Name string
	// Files are the layer's files (path to content), each executable.
	Files map[string][]byte
	// Data are the layer's other files (path to content), readable by
	// everyone and not executable, such as a CA bundle.
	Data map[string][]byte
	// Entrypoint is the command the container runs.
	Entrypoint []string
	// Cmd is the command's default arguments (or the command, without an
	// Entrypoint).
	Cmd []string
	// Env is the container's environment, NAME=VALUE.
	Env []string
	// Dirs are empty folders the layer holds, writable by everyone (with
	// the sticky bit, as /tmp).
	Dirs []string
	// Base is a layer under the image's own: an uncompressed tar archive
	// of a root, such as Debian's (nil: none).
	Base []byte
	// User is the user the container runs as, such as "65532:65532"
	// (empty: root). A pod that must not run as root needs a numeric one.
	User string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// content is a blob with its digest, computed once.
type content struct {
	digest string
	data   []byte
}

func newContent(b []byte) content { return content{digest: digest(b), data: b} }

// path is where the blob goes in an OCI image layout.
func (c content) path() string {
	return path.Join("blobs", "sha256", strings.TrimPrefix(c.digest, "sha256:"))
}

// descriptor describes the blob with mediaType.
func (c content) descriptor(mediaType string) descriptor {
	return descriptor{MediaType: mediaType, Digest: c.digest, Size: len(c.data)}
}

// Write writes the image as an OCI image layout tar archive to w. The
// archive names the image with the annotation containerd's import reads
// (io.containerd.image.name) and the standard tag annotation.
func (img Image) Write(w io.Writer) error {
	_, tag, ok := cutTag(img.Name)
	if !ok {
		return fmt.Errorf("image name %q has no tag", img.Name)
	}
	manifest, blobs, err := img.blobs()
	if err != nil {
		return err
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []descriptor{{
			MediaType: mediaManifest, Digest: manifest.digest, Size: len(manifest.data),
			Annotations: map[string]string{
				"io.containerd.image.name":          img.Name,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := add("oci-layout", []byte(layoutVersion)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	for _, c := range append([]content{manifest}, blobs...) {
		if err := add(c.path(), c.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// layoutVersion is the oci-layout file of every layout liken writes.
const layoutVersion = `{"imageLayoutVersion":"1.0.0"}`

// blobs returns the image's manifest and the blobs it names: its
// configuration, the base layer if any, and its own layer.
func (img Image) blobs() (manifest content, blobs []content, err error) {
	data, err := img.layer()
	if err != nil {
		return content{}, nil, err
	}
	layers := []content{newContent(data)}
	if img.Base != nil {
		layers = []content{newContent(img.Base), layers[0]}
	}
	var diffIDs []string
	var descs []descriptor
	for _, l := range layers {
		// Uncompressed layers: each one's diff ID is its digest.
		diffIDs = append(diffIDs, l.digest)
		descs = append(descs, l.descriptor(mediaLayer))
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       imageConfig(img),
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return content{}, nil, err
	}
	cfg := newContent(config)
	m, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        cfg.descriptor(mediaConfig),
		"layers":        descs,
	})
	return newContent(m), append([]content{cfg}, layers...), err
}

// layer is the image's own layer: its Files, Data and Dirs as an
// uncompressed tar archive.
func (img Image) layer() ([]byte, error) {
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	type entry struct {
		mode int64
		data []byte
		dir  bool
	}
	entries := map[string]entry{}
	parents := func(n string) {
		// Each folder above it, so the file's parents have a mode.
		for d := path.Dir(n); d != "." && d != "/"; d = path.Dir(d) {
			entries[d+"/"] = entry{mode: 0o755, dir: true}
		}
	}
	addFiles := func(files map[string][]byte, mode int64) {
		for n, b := range files {
			entries[n] = entry{mode: mode, data: b}
			parents(n)
		}
	}
	addFiles(img.Files, 0o755)
	addFiles(img.Data, 0o644)
	for _, d := range img.Dirs {
		entries[strings.TrimSuffix(d, "/")+"/"] = entry{mode: 0o1777, dir: true}
		parents(strings.TrimSuffix(d, "/"))
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: n, Mode: e.mode, Size: int64(len(e.data)), Typeflag: tar.TypeReg}
		if e.dir {
			h.Typeflag = tar.TypeDir
		}
		if err := lt.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := lt.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := lt.Close(); err != nil {
		return nil, err
	}
	return layer.Bytes(), nil
}

// WriteLayout writes images into the OCI image layout folder dir, as a
// registry serves it (liken lab serve-registry): each blob once, then
// index.json naming each image by its Name (repository:tag, without a
// registry host) in org.opencontainers.image.ref.name. index.json is
// written last and whole, so a reader never sees an image whose blobs are
// missing.
func WriteLayout(dir string, images []Image) error {
	for _, img := range images {
		if _, _, ok := cutTag(img.Name); !ok {
			return fmt.Errorf("image name %q has no tag", img.Name)
		}
	}
	var index []descriptor
	for _, img := range images {
		manifest, blobs, err := img.blobs()
		if err != nil {
			return err
		}
		for _, c := range append([]content{manifest}, blobs...) {
			p := filepath.Join(dir, filepath.FromSlash(c.path()))
			if _, err := os.Stat(p); err == nil {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := atomicfile.Write(p, c.data, 0o644); err != nil {
				return err
			}
		}
		d := manifest.descriptor(mediaManifest)
		d.Annotations = map[string]string{"org.opencontainers.image.ref.name": img.Name}
		index = append(index, d)
	}
	b, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": index})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, "oci-layout"), []byte(layoutVersion), 0o644); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "index.json"), b, 0o644)
}

// imageConfig is the image configuration's config object.
func imageConfig(img Image) map[string]any {
	c := map[string]any{"Entrypoint": img.Entrypoint}
	if img.Cmd != nil {
		c["Cmd"] = img.Cmd
	}
	if img.Env != nil {
		c["Env"] = img.Env
	}
	if img.User != "" {
		c["User"] = img.User
	}
	return c
}

// cutTag splits name:tag, where the tag follows the last colon after the
// last slash.
func cutTag(ref string) (name, tag string, ok bool) {
	i := len(ref) - 1
	for ; i >= 0 && ref[i] != '/'; i-- {
		if ref[i] == ':' {
			return ref[:i], ref[i+1:], i+1 < len(ref)
		}
	}
	return ref, "", false
}
