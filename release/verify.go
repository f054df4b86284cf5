package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"liken.sh/liken/internal/diskread"
)

// VerifyDir re-reads a slot directory against target: the document, every
// artifact, and no other file (dot files are the store's temporary files,
// which no artifact can be). The error is an *Error naming the first file.
func VerifyDir(ctx context.Context, root *os.Root, target Target) (*Document, error) {
	if err := target.Validate(); err != nil {
		return nil, &Error{Reason: ReasonInvalidDocument, Version: target.Version, Err: err}
	}
	f, err := root.Open(DocumentName)
	if err != nil {
		return nil, ioError(target.Version, DocumentName, err)
	}
	b, err := readBounded(f, MaxDocumentBytes, DocumentName, "MaxDocumentBytes")
	f.Close()
	if err != nil {
		return nil, newError(ReasonInvalidDocument, target.Version, DocumentName, "%v", err)
	}
	if got := Digest(b); got != target.Digest {
		return nil, newError(ReasonDigestMismatch, target.Version, DocumentName, "the slot's release.yaml has digest %s, but the staged release is %s", got, target.Digest)
	}
	doc, err := ParseDocument(b)
	if err != nil {
		return nil, withVersion(err, target.Version)
	}
	if doc.Version != target.Version {
		return nil, newError(ReasonVersionMismatch, target.Version, DocumentName, "the slot's release.yaml is release %s", doc.Version)
	}
	if err := checkTree(root, doc); err != nil {
		return nil, withVersion(err, target.Version)
	}
	buf := make([]byte, bufferSize)
	for _, a := range doc.Artifacts {
		if err := verifyFile(ctx, root, target.Version, a, buf); err != nil {
			return nil, err
		}
	}
	return doc, nil
}

// checkTree refuses files in the slot that the document does not list.
func checkTree(root *os.Root, doc *Document) error {
	want := map[string]bool{DocumentName: true}
	for _, a := range doc.Artifacts {
		want[a.Path] = true
	}
	return fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return ioError("", path, err)
		}
		if path == "." {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if !want[path] {
			return newError(ReasonUnexpectedFile, "", path, "the slot holds %s, which the release document does not list", path)
		}
		if !d.Type().IsRegular() {
			return newError(ReasonUnexpectedFile, "", path, "%s in the slot is not a regular file", path)
		}
		return nil
	})
}

// verifyFile checks one artifact's size and sha256.
func verifyFile(ctx context.Context, root *os.Root, version string, a Artifact, buf []byte) error {
	fi, err := root.Lstat(a.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return newError(ReasonSizeMismatch, version, a.Path, "the file is missing from the slot")
	}
	if err != nil {
		return ioError(version, a.Path, err)
	}
	if !fi.Mode().IsRegular() {
		return newError(ReasonUnexpectedFile, version, a.Path, "the file in the slot is not a regular file")
	}
	if fi.Size() != a.Size {
		return newError(sizeReason(fi.Size(), a.Size), version, a.Path, "the file in the slot is %d bytes, but the release document says %d", fi.Size(), a.Size)
	}
	f, err := root.Open(a.Path)
	if err != nil {
		return ioError(version, a.Path, err)
	}
	defer f.Close()
	// The bytes on the disk, which the boot loader reads, not the page
	// cache's copy of what was written.
	if err := diskread.Uncached(f); err != nil {
		return ioError(version, a.Path, err)
	}
	sum, n, err := hashReader(ctx, f, buf)
	if err != nil {
		return ioError(version, a.Path, err)
	}
	if n != a.Size {
		return newError(sizeReason(n, a.Size), version, a.Path, "the file in the slot is %d bytes, but the release document says %d", n, a.Size)
	}
	if sum != a.SHA256 {
		return newError(ReasonChecksumMismatch, version, a.Path, "the file in the slot has sha256 %s, but the release document says %s", sum, a.SHA256)
	}
	return nil
}

// hashReader returns the hex sha256 and the length of r's content,
// checking ctx between reads.
func hashReader(ctx context.Context, r io.Reader, buf []byte) (string, int64, error) {
	h := sha256.New()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", n, err
		}
		m, err := r.Read(buf)
		if m > 0 {
			h.Write(buf[:m])
			n += int64(m)
		}
		if err == io.EOF {
			return hex.EncodeToString(h.Sum(nil)), n, nil
		}
		if err != nil {
			return "", n, err
		}
	}
}

// HashFile returns the sha256 (64 lowercase hex digits) and size of a file.
func HashFile(ctx context.Context, path string) (sum string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	sum, size, err = hashReader(ctx, f, make([]byte, bufferSize))
	if err != nil {
		return "", size, fmt.Errorf("hashing %s: %w", path, err)
	}
	return sum, size, nil
}
