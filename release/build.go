package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"liken.sh/liken/internal/atomicfile"
)

// Source is one file to publish in a release.
type Source struct {
	// Path is the artifact's path in the release, such as rootfs.squashfs.
	Path string
	// File is the local file to copy.
	File string
}

// Build publishes a release into channelDir, whole or not at all, and
// returns its document's digest; run one Build at a time per channel
// (docs/reference/release-channel.md#publishing).
func Build(channelDir, version string, artifacts []Source, published time.Time) (digest string, err error) {
	if !ValidVersion(version) {
		return "", fmt.Errorf("release version %q must look like YYYY.MM.DD-NNN, for example 2026.07.20-001", version)
	}
	if published.IsZero() {
		return "", fmt.Errorf("release %s: the publication time is missing", version)
	}
	st, err := os.Stat(channelDir)
	if err != nil {
		return "", fmt.Errorf("release channel directory: %w (create it first)", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("release channel %s is not a directory", channelDir)
	}
	final := filepath.Join(channelDir, version)
	if _, err := os.Lstat(final); err == nil {
		return "", fmt.Errorf("the channel already holds release %s in %s: a published release never changes, because clusters pin its digest; publish a new version (or remove the directory if no cluster catalogued it)", version, final)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	// Read the index first: a broken index stops the build before any copy.
	idx, err := ReadIndex(channelDir)
	if err != nil {
		return "", err
	}

	doc := &Document{APIVersion: APIVersion, Kind: KindRelease, Version: version}
	for _, s := range artifacts {
		fi, err := os.Stat(s.File)
		if err != nil {
			return "", fmt.Errorf("release %s artifact %s: %w", version, s.Path, err)
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("release %s artifact %s: %s is not a regular file", version, s.Path, s.File)
		}
		// The checksum is filled in while copying.
		doc.Artifacts = append(doc.Artifacts, Artifact{Path: s.Path, Size: fi.Size(), SHA256: strings.Repeat("0", 64)})
	}
	if err := doc.Validate(); err != nil {
		return "", err
	}

	tmp, err := os.MkdirTemp(channelDir, "."+version+".partial-")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	buf := make([]byte, bufferSize)
	for i, s := range artifacts {
		sum, n, err := copyFile(filepath.Join(tmp, filepath.FromSlash(s.Path)), s.File, buf)
		if err != nil {
			return "", fmt.Errorf("release %s artifact %s: %w", version, s.Path, err)
		}
		if n != doc.Artifacts[i].Size {
			return "", fmt.Errorf("release %s artifact %s: %s changed size while it was copied (%d bytes, then %d)", version, s.Path, s.File, doc.Artifacts[i].Size, n)
		}
		doc.Artifacts[i].SHA256 = sum
	}
	b, err := doc.Marshal()
	if err != nil {
		return "", err
	}
	if err := writeFileSync(filepath.Join(tmp, DocumentName), b, 0o644); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	digest = Digest(b)
	idx.Put(IndexEntry{Version: version, Digest: digest, Published: published.UTC().Truncate(time.Second)})
	if err := WriteIndex(channelDir, idx); err != nil {
		return "", fmt.Errorf("release %s is in %s but the index was not updated (run the build again after removing that directory): %w", version, final, err)
	}
	return digest, nil
}

// ReadIndex reads <channelDir>/index.yaml; a missing index is an empty one.
func ReadIndex(channelDir string) (*Index, error) {
	f, err := os.Open(filepath.Join(channelDir, IndexName))
	if errors.Is(err, fs.ErrNotExist) {
		return NewIndex(), nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := readBounded(f, MaxIndexBytes, IndexName, "MaxIndexBytes")
	if err != nil {
		return nil, newError(ReasonInvalidDocument, "", IndexName, "%v", err)
	}
	return ParseIndex(b)
}

// WriteIndex validates idx and replaces <channelDir>/index.yaml atomically
// (a temporary file, fsync, rename).
func WriteIndex(channelDir string, idx *Index) error {
	if err := idx.Validate(); err != nil {
		return err
	}
	b, err := idx.Marshal()
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(channelDir, IndexName), b, 0o644)
}

func writeFileSync(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// copyFile copies src to dst (creating dst's directory) and returns the
// sha256 and size of what it copied, in one pass over the bytes.
func copyFile(dst, src string, buf []byte) (sum string, n int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", 0, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", 0, err
	}
	defer out.Close()
	h := sha256.New()
	for {
		m, rerr := in.Read(buf)
		if m > 0 {
			h.Write(buf[:m])
			if _, err := out.Write(buf[:m]); err != nil {
				return "", n, err
			}
			n += int64(m)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return "", n, rerr
		}
	}
	if err := out.Sync(); err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, out.Close()
}

// DigestOf reads a release document and returns its digest and the parsed
// document. ref is an http:// or https:// URL of a release.yaml, a local
// release.yaml, or a local release directory (its release.yaml is read).
// A nil client means http.DefaultClient.
func DigestOf(ctx context.Context, client *http.Client, ref string) (digest string, doc *Document, err error) {
	var b []byte
	if strings.HasPrefix(ref, "http://") || strings.HasPrefix(ref, "https://") {
		b, err = getBounded(ctx, client, ref, MaxDocumentBytes, DocumentName, "MaxDocumentBytes", DefaultDocumentTimeout)
		if err != nil {
			return "", nil, err
		}
	} else {
		path := ref
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			path = filepath.Join(path, DocumentName)
		}
		f, err := os.Open(path)
		if err != nil {
			return "", nil, err
		}
		defer f.Close()
		b, err = readBounded(f, MaxDocumentBytes, path, "MaxDocumentBytes")
		if err != nil {
			return "", nil, newError(ReasonInvalidDocument, "", DocumentName, "%v", err)
		}
	}
	digest = Digest(b)
	doc, err = ParseDocument(b)
	if err != nil {
		return digest, nil, err
	}
	return digest, doc, nil
}
