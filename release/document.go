package release

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// Document is a release document (release.yaml): the version and every
// file of the release.
type Document struct {
	// APIVersion is APIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is KindRelease.
	Kind string `json:"kind"`
	// Version is the release version, YYYY.MM.DD-NNN.
	Version string `json:"version"`
	// Artifacts are the files of the release, in download order.
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one file of a release.
type Artifact struct {
	// Path is the file's path relative to the release directory.
	Path string `json:"path"`
	// Size is the file's size in bytes.
	Size int64 `json:"size"`
	// SHA256 is the file's SHA-256 in 64 lowercase hex digits.
	SHA256 string `json:"sha256"`
}

// TotalSize is the sum of the artifacts' sizes.
func (d *Document) TotalSize() int64 {
	var n int64
	for _, a := range d.Artifacts {
		n += a.Size
	}
	return n
}

// Artifact returns the artifact with the given path, or nil.
func (d *Document) Artifact(path string) *Artifact {
	for i := range d.Artifacts {
		if d.Artifacts[i].Path == path {
			return &d.Artifacts[i]
		}
	}
	return nil
}

var (
	versionRE = regexp.MustCompile(`^[0-9]{4}[.][0-9]{2}[.][0-9]{2}-[0-9]{3}$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	pathRE    = regexp.MustCompile(`^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$`)
)

// Digest returns "sha256:" and the 64 lowercase hex digits of the SHA-256
// of b: the digest a catalog entry pins a release document with.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ValidVersion reports whether v has the form YYYY.MM.DD-NNN.
func ValidVersion(v string) bool { return versionRE.MatchString(v) }

// ValidDigest reports whether d has the form sha256:<64 lowercase hex>.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// ParseDocument parses and validates a release document. It refuses a
// document larger than MaxDocumentBytes, unknown or duplicate fields, and
// any document Validate refuses. A refused artifact path gives an *Error
// with ReasonPathTraversal naming the path; any other problem gives
// ReasonInvalidDocument.
func ParseDocument(b []byte) (*Document, error) {
	if len(b) > MaxDocumentBytes {
		return nil, newError(ReasonInvalidDocument, "", DocumentName, "document is %d bytes, more than the limit of %d bytes (MaxDocumentBytes)", len(b), MaxDocumentBytes)
	}
	var d Document
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		return nil, newError(ReasonInvalidDocument, "", DocumentName, "cannot parse: %v", err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks every rule of a release document: format marker,
// version, artifact count, paths, sizes and checksums, and that the OS
// image rootfs.squashfs is present.
func (d *Document) Validate() error {
	var errs field.ErrorList
	traversal := ""
	if d.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), short(d.APIVersion), "must be "+APIVersion))
	}
	if d.Kind != KindRelease {
		errs = append(errs, field.Invalid(field.NewPath("kind"), short(d.Kind), "must be "+KindRelease))
	}
	if !ValidVersion(d.Version) {
		errs = append(errs, field.Invalid(field.NewPath("version"), short(d.Version), "must look like YYYY.MM.DD-NNN, for example 2026.07.20-001"))
	}
	arts := field.NewPath("artifacts")
	switch {
	case len(d.Artifacts) == 0:
		errs = append(errs, field.Required(arts, "a release holds at least "+RootfsPath))
	case len(d.Artifacts) > MaxArtifacts:
		errs = append(errs, field.TooMany(arts, len(d.Artifacts), MaxArtifacts))
	}
	seen := make(map[string]bool, len(d.Artifacts))
	var total int64
	for i, a := range d.Artifacts {
		p := arts.Index(i)
		if problem, escapes := checkPath(a.Path); problem != "" {
			errs = append(errs, field.Invalid(p.Child("path"), short(a.Path), problem))
			if escapes && traversal == "" {
				traversal = short(a.Path)
			}
		} else if seen[a.Path] {
			errs = append(errs, field.Duplicate(p.Child("path"), short(a.Path)))
		}
		seen[a.Path] = true
		if a.Size <= 0 || a.Size > MaxArtifactBytes {
			errs = append(errs, field.Invalid(p.Child("size"), a.Size, fmt.Sprintf("must be between 1 and %d bytes (MaxArtifactBytes)", MaxArtifactBytes)))
		} else {
			total += a.Size
		}
		if !sha256RE.MatchString(a.SHA256) {
			errs = append(errs, field.Invalid(p.Child("sha256"), short(a.SHA256), "must be 64 lowercase hex digits"))
		}
	}
	if total > MaxReleaseBytes {
		errs = append(errs, field.Invalid(arts, total, fmt.Sprintf("artifacts add up to more than the limit of %d bytes (MaxReleaseBytes)", MaxReleaseBytes)))
	}
	// A path may not be both a file and a directory of another path.
	for i, a := range d.Artifacts {
		for dir := parentDir(a.Path); dir != ""; dir = parentDir(dir) {
			if seen[dir] {
				errs = append(errs, field.Invalid(arts.Index(i).Child("path"), short(a.Path), "lies below "+short(dir)+", which is a file of the release"))
				break
			}
		}
	}
	if len(d.Artifacts) > 0 && !seen[RootfsPath] {
		errs = append(errs, field.Required(arts, "a release must hold the OS image "+RootfsPath))
	}
	if len(errs) == 0 {
		return nil
	}
	version := ""
	if ValidVersion(d.Version) {
		version = d.Version
	}
	if traversal != "" {
		return &Error{Reason: ReasonPathTraversal, Version: version, File: traversal, Err: fmt.Errorf("refused release document: %w", errs.ToAggregate())}
	}
	return &Error{Reason: ReasonInvalidDocument, Version: version, File: DocumentName, Err: fmt.Errorf("refused release document: %w", errs.ToAggregate())}
}

// checkPath returns what is wrong with an artifact path, and whether the
// path would leave the release directory or name something outside the
// plain files of the release.
func checkPath(p string) (problem string, escapes bool) {
	switch {
	case p == "":
		return "must not be empty", false
	case len(p) > MaxPathLength:
		return fmt.Sprintf("must be at most %d characters (MaxPathLength)", MaxPathLength), false
	case strings.HasPrefix(p, "/"):
		return "must be relative to the release directory, not absolute", true
	case strings.Contains(p, `\`):
		return "must not contain a backslash", true
	}
	for _, elem := range strings.Split(p, "/") {
		switch {
		case elem == "":
			return "must not contain an empty element (// or a trailing /)", true
		case elem == "." || elem == "..":
			return "must not contain . or .. elements", true
		case strings.HasPrefix(elem, "."):
			return "must not contain hidden names (starting with a dot)", false
		}
	}
	if !pathRE.MatchString(p) {
		return "may contain only letters, digits, '.', '_', '+', '-' and '/'", false
	}
	if p == DocumentName {
		return DocumentName + " is the release document itself, not an artifact", false
	}
	return "", false
}

// short cuts a value quoted in an error message to a readable length.
func short(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

func parentDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}

// Marshal returns the document as YAML.
func (d *Document) Marshal() ([]byte, error) {
	return yaml.Marshal(d)
}

// readBounded reads all of r, refusing more than limit bytes. what and
// limitName name the input and the limit in the error.
func readBounded(r io.Reader, limit int64, what, limitName string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes (%s)", what, limit, limitName)
	}
	return b, nil
}
