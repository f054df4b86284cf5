package release

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Reason says in one word why a release could not be fetched or verified.
// The values are fit for a condition reason.
type Reason string

// Reasons a fetch or a verification fails.
const (
	// ReasonUnreachable: the channel did not answer, answered an error, or
	// stopped sending.
	ReasonUnreachable Reason = "ChannelUnreachable"
	// ReasonNotFound: the channel has no such file.
	ReasonNotFound Reason = "NotFound"
	// ReasonDigestMismatch: release.yaml does not match the catalog digest.
	ReasonDigestMismatch Reason = "DigestMismatch"
	// ReasonVersionMismatch: release.yaml names another version than the
	// catalog entry.
	ReasonVersionMismatch Reason = "VersionMismatch"
	// ReasonInvalidDocument: release.yaml (or index.yaml) is malformed,
	// too large, or breaks a rule.
	ReasonInvalidDocument Reason = "InvalidDocument"
	// ReasonPathTraversal: an artifact path would leave the release
	// directory.
	ReasonPathTraversal Reason = "PathTraversal"
	// ReasonSizeMismatch: an artifact is shorter than declared, or the
	// server describes a different size.
	ReasonSizeMismatch Reason = "SizeMismatch"
	// ReasonOversize: the server sends more bytes than declared.
	ReasonOversize Reason = "Oversize"
	// ReasonChecksumMismatch: an artifact's bytes do not match its sha256.
	ReasonChecksumMismatch Reason = "ChecksumMismatch"
	// ReasonUnexpectedFile: a slot holds a file the release does not list.
	ReasonUnexpectedFile Reason = "UnexpectedFile"
	// ReasonDiskFull: the slot has no space left.
	ReasonDiskFull Reason = "DiskFull"
	// ReasonNotEnoughSpace: the slot store has less space free than the
	// release needs plus what the machine keeps free; nothing was
	// written, and the machine retries.
	ReasonNotEnoughSpace Reason = "NotEnoughSpace"
	// ReasonWriteFailed: the slot could not be written or read.
	ReasonWriteFailed Reason = "SlotIOFailed"
	// ReasonCanceled: the fetch was stopped (retarget or shutdown).
	ReasonCanceled Reason = "Canceled"
)

// Error is a failure to fetch or verify a release. It names the release,
// the file concerned (release.yaml or an artifact path; empty when the
// failure concerns the whole release) and the reason.
type Error struct {
	// Reason is the kind of failure.
	Reason Reason
	// Version is the release concerned.
	Version string
	// File is release.yaml, an artifact path, or empty.
	File string
	// Err is the detail.
	Err error
	// Recheck is set when the bytes were read again from a slot that had
	// verified before (as right before a trial boot): a mismatch then
	// means they changed on disk, not that the channel served other bytes.
	Recheck bool
}

// Error says what failed, on which file, and what to do.
func (e *Error) Error() string {
	what := "release " + e.Version
	if e.Version == "" {
		what = "release"
	}
	if e.File != "" {
		what += " file " + e.File
	}
	msg := fmt.Sprintf("%s: %v", what, e.Err)
	if hint := e.hint(); hint != "" {
		msg += " (" + hint + ")"
	}
	return msg
}

// Unwrap returns the detail.
func (e *Error) Unwrap() error { return e.Err }

// hint says what to do about e.
func (e *Error) hint() string {
	if e.Recheck {
		switch e.Reason {
		case ReasonDigestMismatch, ReasonVersionMismatch, ReasonInvalidDocument, ReasonSizeMismatch,
			ReasonOversize, ReasonChecksumMismatch, ReasonUnexpectedFile:
			return "the slot's bytes changed on disk after liken verified them, so the channel is not at fault: " +
				"check the disk for errors (kernel log, SMART) and that nothing but liken-node writes to the slot"
		}
	}
	return e.Reason.hint()
}

func (r Reason) hint() string {
	switch r {
	case ReasonUnreachable:
		return "check that spec.releases.source is right and its web server answers; liken retries"
	case ReasonNotFound:
		return "the channel does not publish this file: check spec.releases.source and that the release was published completely"
	case ReasonDigestMismatch:
		return "the channel serves a different release.yaml than the one catalogued: check the catalog digest with liken release digest, and the channel's integrity"
	case ReasonVersionMismatch:
		return "the catalog entry pins a document of another release: correct the catalog entry"
	case ReasonPathTraversal:
		return "the release document is hostile or broken: do not use this release"
	case ReasonSizeMismatch, ReasonOversize, ReasonChecksumMismatch:
		return "the channel serves bytes that differ from the release document: republish the file or fix the web server; liken retries"
	case ReasonDiskFull:
		return "free space on the slot's file system or use smaller artifacts"
	case ReasonNotEnoughSpace:
		return "free space on the slot store (unused images, logs) or give the machine a larger disk; liken retries"
	case ReasonWriteFailed:
		return "the slot's storage failed: check the disk"
	}
	return ""
}

// ReasonOf returns the Reason of err, or "" when err is not an *Error.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// FileOf returns the file an *Error names, or "".
func FileOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.File
	}
	return ""
}

func newError(reason Reason, version, file string, format string, args ...any) *Error {
	return &Error{Reason: reason, Version: version, File: file, Err: fmt.Errorf(format, args...)}
}

// ioError classifies a failure to write or read the slot.
func ioError(version, file string, err error) *Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return &Error{Reason: ReasonDiskFull, Version: version, File: file, Err: err}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Reason: ReasonCanceled, Version: version, File: file, Err: err}
	}
	return &Error{Reason: ReasonWriteFailed, Version: version, File: file, Err: err}
}
