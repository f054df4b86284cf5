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
	"path"
	"sort"
)

// Media types of the OCI image specification.
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// Image is a single-layer image for linux/amd64.
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

// Write writes the image as an OCI image layout tar archive to w. The
// archive names the image with the annotation containerd's import reads
// (io.containerd.image.name) and the standard tag annotation.
func (img Image) Write(w io.Writer) error {
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	type entry struct {
		mode int64
		data []byte
		dir  bool
	}
	entries := map[string]entry{}
	addFiles := func(files map[string][]byte, mode int64) {
		for n, b := range files {
			entries[n] = entry{mode: mode, data: b}
			// Each folder above it, so the file's parents have a mode.
			for d := path.Dir(n); d != "." && d != "/"; d = path.Dir(d) {
				entries[d+"/"] = entry{mode: 0o755, dir: true}
			}
		}
	}
	addFiles(img.Files, 0o755)
	addFiles(img.Data, 0o644)
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
			return err
		}
		if _, err := lt.Write(e.data); err != nil {
			return err
		}
	}
	if err := lt.Close(); err != nil {
		return err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       imageConfig(img),
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{digest(layer.Bytes())}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        descriptor{MediaType: mediaConfig, Digest: digest(config), Size: len(config)},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: digest(layer.Bytes()), Size: layer.Len()}},
	})
	if err != nil {
		return err
	}
	_, tag, ok := cutTag(img.Name)
	if !ok {
		return fmt.Errorf("image name %q has no tag", img.Name)
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []descriptor{{
			MediaType: mediaManifest, Digest: digest(manifest), Size: len(manifest),
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
	for _, f := range []struct {
		name string
		b    []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(manifest), manifest},
		{blob(config), config},
		{blob(layer.Bytes()), layer.Bytes()},
	} {
		if err := add(f.name, f.b); err != nil {
			return err
		}
	}
	return tw.Close()
}

// imageConfig is the image configuration's config object.
func imageConfig(img Image) map[string]any {
	c := map[string]any{"Entrypoint": img.Entrypoint}
	if img.User != "" {
		c["User"] = img.User
	}
	return c
}

func blob(b []byte) string {
	sum := sha256.Sum256(b)
	return path.Join("blobs", "sha256", hex.EncodeToString(sum[:]))
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
