package release

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// Index is a channel's index.yaml: every release the channel announces.
type Index struct {
	// APIVersion is APIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is KindIndex.
	Kind string `json:"kind"`
	// Releases are the announced releases, oldest first.
	Releases []IndexEntry `json:"releases"`
}

// IndexEntry announces one release.
type IndexEntry struct {
	// Version is the release version, YYYY.MM.DD-NNN.
	Version string `json:"version"`
	// Digest is the digest of the release's release.yaml.
	Digest string `json:"digest"`
	// Published is when the release was published.
	Published time.Time `json:"published"`
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{APIVersion: APIVersion, Kind: KindIndex}
}

// ParseIndex parses and validates a channel index. It refuses an index
// larger than MaxIndexBytes, unknown or duplicate fields, and any index
// Validate refuses.
func ParseIndex(b []byte) (*Index, error) {
	if len(b) > MaxIndexBytes {
		return nil, newError(ReasonInvalidDocument, "", IndexName, "index is %d bytes, more than the limit of %d bytes (MaxIndexBytes)", len(b), MaxIndexBytes)
	}
	var idx Index
	if err := yaml.UnmarshalStrict(b, &idx); err != nil {
		return nil, newError(ReasonInvalidDocument, "", IndexName, "cannot parse: %v", err)
	}
	if err := idx.Validate(); err != nil {
		return nil, err
	}
	return &idx, nil
}

// Validate checks the format marker, the number of entries, and that
// every entry has a valid, unique version, a valid digest and a
// publication time.
func (idx *Index) Validate() error {
	var errs field.ErrorList
	if idx.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), short(idx.APIVersion), "must be "+APIVersion))
	}
	if idx.Kind != KindIndex {
		errs = append(errs, field.Invalid(field.NewPath("kind"), short(idx.Kind), "must be "+KindIndex))
	}
	rels := field.NewPath("releases")
	if len(idx.Releases) > MaxIndexEntries {
		errs = append(errs, field.TooMany(rels, len(idx.Releases), MaxIndexEntries))
	}
	seen := make(map[string]bool, len(idx.Releases))
	for i, e := range idx.Releases {
		p := rels.Index(i)
		if !ValidVersion(e.Version) {
			errs = append(errs, field.Invalid(p.Child("version"), short(e.Version), "must look like YYYY.MM.DD-NNN, for example 2026.07.20-001"))
		} else if seen[e.Version] {
			errs = append(errs, field.Duplicate(p.Child("version"), e.Version))
		}
		seen[e.Version] = true
		if !ValidDigest(e.Digest) {
			errs = append(errs, field.Invalid(p.Child("digest"), short(e.Digest), "must be sha256: followed by 64 lowercase hex digits"))
		}
		if e.Published.IsZero() {
			errs = append(errs, field.Required(p.Child("published"), "the publication time, such as 2026-07-20T10:00:00Z"))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return &Error{Reason: ReasonInvalidDocument, File: IndexName, Err: fmt.Errorf("refused channel index: %w", errs.ToAggregate())}
}

// Lookup returns the entry of version, or nil.
func (idx *Index) Lookup(version string) *IndexEntry {
	for i := range idx.Releases {
		if idx.Releases[i].Version == version {
			return &idx.Releases[i]
		}
	}
	return nil
}

// Newest returns the entry with the highest version, or nil when the index
// is empty. Versions YYYY.MM.DD-NNN order as strings.
func (idx *Index) Newest() *IndexEntry {
	var n *IndexEntry
	for i := range idx.Releases {
		if n == nil || idx.Releases[i].Version > n.Version {
			n = &idx.Releases[i]
		}
	}
	return n
}

// Put adds e, or replaces the entry with the same version, and keeps the
// entries sorted by version.
func (idx *Index) Put(e IndexEntry) {
	if old := idx.Lookup(e.Version); old != nil {
		*old = e
	} else {
		idx.Releases = append(idx.Releases, e)
	}
	slices.SortFunc(idx.Releases, func(a, b IndexEntry) int { return strings.Compare(a.Version, b.Version) })
}

// NextVersion returns the first version of day (YYYY.MM.DD-NNN, NNN from
// 001) that is higher than every version the index announces for that day.
func (idx *Index) NextVersion(day time.Time) (string, error) {
	prefix := day.Format("2006.01.02") + "-"
	n := 0
	for _, e := range idx.Releases {
		if rest, ok := strings.CutPrefix(e.Version, prefix); ok {
			var k int
			if _, err := fmt.Sscanf(rest, "%03d", &k); err == nil && k > n {
				n = k
			}
		}
	}
	if n >= 999 {
		return "", fmt.Errorf("the channel already holds release %s999, the last number of that day: publish tomorrow or choose a version by hand", prefix)
	}
	return fmt.Sprintf("%s%03d", prefix, n+1), nil
}

// Marshal returns the index as YAML.
func (idx *Index) Marshal() ([]byte, error) {
	return yaml.Marshal(idx)
}
