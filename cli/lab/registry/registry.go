// Package registry is the VM lab's image registry: it serves, read-only
// and over plain http on a loopback port, the images of one OCI image
// layout folder, so that the lab's machines pull images that never leave
// this computer (the images Kubernetes' own network tests run, or a
// person's own, copied in with skopeo copy ... oci:FOLDER:REPOSITORY:TAG).
package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/klog/v2"
)

// The media types of the manifests the layout names.
const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
)

// refAnnotation names an image in a layout's index.json, as
// REPOSITORY:TAG.
const refAnnotation = "org.opencontainers.image.ref.name"

// digestPattern is a sha256 digest, the only kind the layout holds.
var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Handler serves the distribution API's read side (GET and HEAD of
// /v2/, of manifests by tag or digest, and of blobs) from the OCI image
// layout folder Dir. It reads index.json at every request, so images
// written into Dir (oci.WriteLayout writes index.json last) are served
// at once.
type Handler struct {
	// Dir is the OCI image layout folder.
	Dir string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ServeHTTP answers one request of the distribution API.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "the lab's registry is read-only: copy images into "+h.Dir+" instead")
		return
	}
	p := r.URL.Path
	if p == "/v2/" || p == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		writeError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a registry path: "+p)
		return
	}
	if i := strings.LastIndex(rest, "/manifests/"); i > 0 {
		h.manifest(w, r, rest[:i], rest[i+len("/manifests/"):])
		return
	}
	if i := strings.LastIndex(rest, "/blobs/"); i > 0 {
		d := rest[i+len("/blobs/"):]
		if !digestPattern.MatchString(d) {
			writeError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("%q is not a sha256 digest", d))
			return
		}
		h.serveBlob(w, r, d, "application/octet-stream")
		return
	}
	writeError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a registry path: "+p)
}

// manifest serves the manifest of repository's reference: a tag the index
// names as REPOSITORY:TAG, or a digest the index lists for that
// repository.
func (h Handler) manifest(w http.ResponseWriter, r *http.Request, repository, reference string) {
	index, err := h.index()
	if err != nil {
		klog.ErrorS(err, "Reading the registry's index", "dir", h.Dir)
		writeError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	for _, d := range index {
		name, tag, _ := strings.Cut(d.Annotations[refAnnotation], ":")
		if name == repository && (tag == reference || d.Digest == reference) {
			mt := d.MediaType
			if mt == "" {
				mt = mediaManifest
			}
			h.serveBlob(w, r, d.Digest, mt)
			return
		}
	}
	klog.InfoS("No such manifest", "repository", repository, "reference", reference)
	writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s:%s is not in the lab's registry (%s)", repository, reference, h.Dir))
}

// index is the manifests index.json lists; an empty or missing layout
// lists none.
func (h Handler) index() ([]descriptor, error) {
	b, err := os.ReadFile(filepath.Join(h.Dir, "index.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var idx struct{ Manifests []descriptor }
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s/index.json: %w", h.Dir, err)
	}
	return idx.Manifests, nil
}

// serveBlob serves the blob of digest d with its digest header.
func (h Handler) serveBlob(w http.ResponseWriter, r *http.Request, d, mediaType string) {
	f, err := os.Open(filepath.Join(h.Dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
	if err != nil {
		writeError(w, http.StatusNotFound, "BLOB_UNKNOWN", d+" is not in the lab's registry")
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", d)
	w.Header().Set("Etag", `"`+d+`"`)
	klog.InfoS("Serving", "path", r.URL.Path, "bytes", fi.Size())
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// writeError answers with the distribution API's error document.
func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": message}}})
}
