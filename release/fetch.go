package release

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Target is the release a machine must download: a catalog entry.
type Target struct {
	// Version is the release version.
	Version string `json:"version"`
	// Digest is the digest of its release document.
	Digest string `json:"digest"`
}

// String returns version@digest.
func (t Target) String() string { return t.Version + "@" + t.Digest }

// Validate checks the version and digest formats.
func (t Target) Validate() error {
	if !ValidVersion(t.Version) {
		return fmt.Errorf("release version %q must look like YYYY.MM.DD-NNN", short(t.Version))
	}
	if !ValidDigest(t.Digest) {
		return fmt.Errorf("release %s: digest %q must be sha256: followed by 64 lowercase hex digits", t.Version, short(t.Digest))
	}
	return nil
}

// Checkpoint is the persisted progress of a download: where to resume
// after a connection cut or a restart of the machine's daemon.
type Checkpoint struct {
	// Version and Digest name the release being downloaded.
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Artifact is the position in the release document of the artifact
	// being downloaded; every artifact before it is complete and matched
	// its sha256 while it streamed in.
	Artifact int `json:"artifact"`
	// Path is that artifact's path (a consistency check).
	Path string `json:"path,omitempty"`
	// Offset is how many bytes of that artifact are durably in the slot.
	Offset int64 `json:"offset"`
	// HashState is the SHA-256 state after Offset bytes
	// (crypto/sha256's binary marshaling).
	HashState []byte `json:"hashState,omitempty"`
}

// File is an artifact file open for writing in a slot.
type File interface {
	io.Writer
	io.Seeker
	Truncate(size int64) error
	Sync() error
	Stat() (fs.FileInfo, error)
	Close() error
}

// Sink is where Fetch writes a release: a download into a boot slot. The
// slot store implements it and keeps the slot marked as being downloaded
// (never bootable) while Fetch writes.
type Sink interface {
	// Context is canceled when the download is withdrawn; Fetch stops then.
	Context() context.Context
	// Checkpoint returns the persisted progress of this download, or nil.
	Checkpoint() *Checkpoint
	// SaveCheckpoint durably records progress. Fetch syncs the artifact
	// file before it saves a checkpoint that covers its bytes.
	SaveCheckpoint(Checkpoint) error
	// WriteDocument durably stores the verified release.yaml bytes.
	WriteDocument(b []byte) error
	// OpenArtifact opens (creating it and its directories) the file of an
	// artifact for writing, without truncating it. path is a validated
	// artifact path; the sink must not let it leave the slot.
	OpenArtifact(path string) (File, error)
}

// Defaults of a Fetcher.
const (
	// DefaultCheckpointBytes is how often (in bytes) progress is persisted.
	DefaultCheckpointBytes int64 = 8 << 20
	// DefaultIdleTimeout is how long a transfer may stall before it is
	// cut and reported.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultDocumentTimeout bounds the whole read of release.yaml or
	// index.yaml, body included: both are small, and a server that sends
	// the headers and then stalls must not keep a machine Downloading
	// forever.
	DefaultDocumentTimeout = 60 * time.Second
)

// Fetcher downloads releases from a channel into slots.
type Fetcher struct {
	// Client makes the requests; nil means http.DefaultClient.
	Client *http.Client
	// CheckpointBytes is how many bytes may pass between two persisted
	// checkpoints; 0 means DefaultCheckpointBytes.
	CheckpointBytes int64
	// IdleTimeout cuts a transfer that sends nothing for this long; 0
	// means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// DocumentTimeout bounds the whole read of release.yaml (Fetch) and
	// of index.yaml (FetchIndex), body included; 0 means
	// DefaultDocumentTimeout.
	DocumentTimeout time.Duration
	// Progress, when set, is called with the bytes of the release's
	// artifacts in the slot so far and their total: once when the
	// download starts (counting what an earlier attempt left) and then as
	// bytes arrive. It runs on the fetching goroutine; keep it short.
	Progress func(done, total int64)
	// Space, when set, is asked before any artifact byte is written
	// whether need more bytes may be written into the slot; its error
	// stops the fetch with ReasonNotEnoughSpace.
	Space func(need int64) error
}

// Result describes a fetch, complete or not.
type Result struct {
	// Document is the verified release document (nil before it verified).
	Document *Document
	// Total is the size of every artifact of the release.
	Total int64
	// Done is how many of those bytes are in the slot.
	Done int64
	// Transferred is how many bytes this call received from the channel
	// (release.yaml and artifacts, counting restarts).
	Transferred int64
	// Reused is how many artifact bytes an earlier attempt had already
	// put in the slot.
	Reused int64
}

// documentTimeout is DocumentTimeout, or its default.
func (f *Fetcher) documentTimeout() time.Duration {
	if f.DocumentTimeout <= 0 {
		return DefaultDocumentTimeout
	}
	return f.DocumentTimeout
}

// errStalled is the cause of a request cut for sending nothing.
var errStalled = errors.New("stalled")

// errDocumentTimeout is the cause of a document read cut at its deadline.
var errDocumentTimeout = errors.New("document read took too long")

// Fetch downloads and verifies the release target from the channel at
// source into sink, resuming from its checkpoint (the trust chain of
// docs/reference/release-channel.md). Errors are *Error; the Result is never nil.
func (f *Fetcher) Fetch(ctx context.Context, source string, target Target, sink Sink) (_ *Result, err error) {
	res := &Result{}
	parent := ctx
	defer func() {
		// A withdrawn download may fail anywhere (the sink refuses
		// writes): report the cancellation, not the symptom.
		if err != nil && ReasonOf(err) != ReasonCanceled {
			if cerr := context.Cause(sink.Context()); cerr != nil || parent.Err() != nil {
				if cerr == nil {
					cerr = parent.Err()
				}
				err = &Error{Reason: ReasonCanceled, Version: target.Version, File: FileOf(err), Err: fmt.Errorf("download stopped: %w", cerr)}
			}
		}
	}()
	if err := target.Validate(); err != nil {
		return res, &Error{Reason: ReasonInvalidDocument, Version: target.Version, Err: err}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sink.Context(), cancel)
	defer stop()
	log := klog.FromContext(ctx).WithValues("release", target.Version)

	docURL, err := channelURL(source, target.Version, DocumentName)
	if err != nil {
		return res, &Error{Reason: ReasonUnreachable, Version: target.Version, File: DocumentName, Err: err}
	}
	b, err := getBounded(ctx, f.Client, docURL, MaxDocumentBytes, DocumentName, "MaxDocumentBytes", f.documentTimeout())
	res.Transferred += int64(len(b))
	if err != nil {
		return res, withVersion(err, target.Version)
	}
	if got := Digest(b); got != target.Digest {
		return res, newError(ReasonDigestMismatch, target.Version, DocumentName, "%s has digest %s, but the catalog pins %s", docURL, got, target.Digest)
	}
	doc, err := ParseDocument(b)
	if err != nil {
		return res, withVersion(err, target.Version)
	}
	if doc.Version != target.Version {
		return res, newError(ReasonVersionMismatch, target.Version, DocumentName, "the document at %s is release %s, but the catalog entry is for %s", docURL, doc.Version, target.Version)
	}
	res.Document = doc
	res.Total = doc.TotalSize()
	if err := sink.WriteDocument(b); err != nil {
		return res, ioError(target.Version, DocumentName, err)
	}

	cp := resumePoint(sink.Checkpoint(), target, doc)
	if cp.Artifact > 0 || cp.Offset > 0 {
		log.V(2).Info("Resuming download", "artifact", cp.Artifact, "offset", cp.Offset)
	}
	for i := 0; i < cp.Artifact; i++ {
		res.Done += doc.Artifacts[i].Size
	}
	res.Reused = res.Done + cp.Offset
	if f.Progress != nil {
		f.Progress(res.Reused, res.Total)
	}
	if f.Space != nil && res.Total > res.Reused {
		if err := f.Space(res.Total - res.Reused); err != nil {
			return res, &Error{Reason: ReasonNotEnoughSpace, Version: target.Version, Err: err}
		}
	}
	buf := make([]byte, bufferSize)
	for i := cp.Artifact; i < len(doc.Artifacts); i++ {
		if err := ctx.Err(); err != nil {
			return res, canceled(ctx, target.Version, doc.Artifacts[i].Path)
		}
		a := doc.Artifacts[i]
		u, err := channelURL(source, target.Version, a.Path)
		if err != nil {
			return res, &Error{Reason: ReasonUnreachable, Version: target.Version, File: a.Path, Err: err}
		}
		a1 := artifactFetch{f: f, sink: sink, res: res, target: target, index: i, art: a, url: u, buf: buf}
		if i == cp.Artifact {
			a1.offset, a1.state = cp.Offset, cp.HashState
		}
		if err := a1.run(ctx); err != nil {
			return res, err
		}
		res.Done += a.Size
		next := Checkpoint{Version: target.Version, Digest: target.Digest, Artifact: i + 1}
		if i+1 < len(doc.Artifacts) {
			next.Path = doc.Artifacts[i+1].Path
		}
		if err := sink.SaveCheckpoint(next); err != nil {
			return res, ioError(target.Version, a.Path, err)
		}
	}
	log.V(2).Info("Downloaded release", "bytes", res.Total, "transferred", res.Transferred, "reused", res.Reused)
	return res, nil
}

// resumePoint returns where to start: the sink's checkpoint when it is for
// this release and consistent with the document, else the beginning.
func resumePoint(cp *Checkpoint, target Target, doc *Document) Checkpoint {
	start := Checkpoint{Version: target.Version, Digest: target.Digest, Path: doc.Artifacts[0].Path}
	if cp == nil || cp.Version != target.Version || cp.Digest != target.Digest || cp.Artifact < 0 || cp.Artifact > len(doc.Artifacts) {
		return start
	}
	if cp.Artifact == len(doc.Artifacts) {
		return Checkpoint{Version: target.Version, Digest: target.Digest, Artifact: cp.Artifact}
	}
	a := doc.Artifacts[cp.Artifact]
	out := Checkpoint{Version: target.Version, Digest: target.Digest, Artifact: cp.Artifact, Path: a.Path}
	if cp.Path == a.Path && cp.Offset > 0 && cp.Offset <= a.Size && len(cp.HashState) > 0 {
		h := sha256.New()
		if h.(encoding.BinaryUnmarshaler).UnmarshalBinary(cp.HashState) == nil {
			out.Offset, out.HashState = cp.Offset, cp.HashState
		}
	}
	return out
}

// artifactFetch downloads one artifact.
type artifactFetch struct {
	f      *Fetcher
	sink   Sink
	res    *Result
	target Target
	index  int
	art    Artifact
	url    string
	buf    []byte
	// offset and state: the resume point (bytes in the file and hash state).
	offset int64
	state  []byte

	file  File
	h     hash.Hash
	saved int64 // offset of the last persisted checkpoint
}

func (a *artifactFetch) errorf(reason Reason, format string, args ...any) *Error {
	return newError(reason, a.target.Version, a.art.Path, format, args...)
}

func (a *artifactFetch) run(ctx context.Context) (err error) {
	file, err := a.sink.OpenArtifact(a.art.Path)
	if err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	a.file = file
	defer func() {
		if cerr := file.Close(); cerr != nil && err == nil {
			err = ioError(a.target.Version, a.art.Path, cerr)
		}
	}()
	a.h = sha256.New()
	if a.offset > 0 {
		fi, err := file.Stat()
		if err != nil {
			return ioError(a.target.Version, a.art.Path, err)
		}
		if fi.Size() < a.offset || a.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(a.state) != nil {
			a.offset = 0 // the slot lost bytes the checkpoint covers: start over
			a.h.Reset()
		}
	}
	if err := a.restartAt(a.offset); err != nil {
		return err
	}
	a.saved = a.offset
	if a.offset < a.art.Size {
		if err := a.download(ctx); err != nil {
			a.checkpointOnStop(ctx, err)
			return err
		}
	}
	if got := hex.EncodeToString(a.h.Sum(nil)); got != a.art.SHA256 {
		// Drop the bytes; start this artifact over on the next attempt.
		a.h.Reset()
		_ = a.restartAt(0)
		a.checkpoint()
		return a.errorf(ReasonChecksumMismatch, "%s has sha256 %s, but the release document says %s", a.url, got, a.art.SHA256)
	}
	if err := file.Sync(); err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	return nil
}

// restartAt cuts the file to offset and positions the writes there.
func (a *artifactFetch) restartAt(offset int64) error {
	if err := a.file.Truncate(offset); err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	if _, err := a.file.Seek(offset, io.SeekStart); err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	a.offset = offset
	return nil
}

// download requests the rest of the artifact and streams it in.
func (a *artifactFetch) download(ctx context.Context) error {
	log := klog.FromContext(ctx)
	idle := a.f.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(idle, func() { cancel(errStalled) })
	defer timer.Stop()

	req, err := http.NewRequestWithContext(rctx, http.MethodGet, a.url, nil)
	if err != nil {
		return a.errorf(ReasonUnreachable, "%v", err)
	}
	if a.offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", a.offset))
	}
	resp, err := client(a.f.Client).Do(req)
	if err != nil {
		return a.requestError(ctx, rctx, idle, err)
	}
	defer resp.Body.Close()

	switch {
	case resp.StatusCode == http.StatusPartialContent && a.offset > 0:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != a.offset {
			err := a.errorf(ReasonUnreachable, "%s answered a range request with Content-Range %q, not bytes %d-: the web server's range support is broken; liken downloads the file whole next time", a.url, resp.Header.Get("Content-Range"), a.offset)
			a.h.Reset()
			a.offset = 0
			a.checkpoint()
			return err
		}
		if total >= 0 && total != a.art.Size {
			return a.errorf(sizeReason(total, a.art.Size), "%s is %d bytes, but the release document says %d", a.url, total, a.art.Size)
		}
	case resp.StatusCode == http.StatusOK:
		if a.offset > 0 {
			log.V(2).Info("Server ignored the range request; restarting the artifact", "artifact", a.art.Path, "offset", a.offset)
			a.h.Reset()
			if err := a.restartAt(0); err != nil {
				return err
			}
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		// The file on the server is shorter than the bytes we hold.
		return a.errorf(ReasonSizeMismatch, "%s refused the range from byte %d: the file on the channel is shorter than the release document says (%d bytes)", a.url, a.offset, a.art.Size)
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return a.errorf(ReasonNotFound, "%s answered %s", a.url, resp.Status)
	default:
		return a.errorf(ReasonUnreachable, "%s answered %s", a.url, resp.Status)
	}
	remaining := a.art.Size - a.offset
	if resp.ContentLength >= 0 && resp.ContentLength != remaining {
		total := a.offset + resp.ContentLength
		return a.errorf(sizeReason(total, a.art.Size), "%s is %d bytes, but the release document says %d", a.url, total, a.art.Size)
	}

	interval := a.f.CheckpointBytes
	if interval <= 0 {
		interval = DefaultCheckpointBytes
	}
	for remaining > 0 {
		n := int64(len(a.buf))
		if n > remaining {
			n = remaining
		}
		m, rerr := resp.Body.Read(a.buf[:n])
		if m > 0 {
			timer.Reset(idle)
			a.res.Transferred += int64(m)
			a.h.Write(a.buf[:m])
			if _, err := a.file.Write(a.buf[:m]); err != nil {
				return ioError(a.target.Version, a.art.Path, err)
			}
			a.offset += int64(m)
			remaining -= int64(m)
			if a.f.Progress != nil {
				a.f.Progress(a.res.Done+a.offset, a.res.Total)
			}
			if a.offset-a.saved >= interval && remaining > 0 {
				if err := a.persist(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF && remaining > 0 {
			return a.errorf(ReasonSizeMismatch, "%s ended after %d bytes, but the release document says %d", a.url, a.offset, a.art.Size)
		}
		if rerr != nil && rerr != io.EOF {
			return a.requestError(ctx, rctx, idle, rerr)
		}
	}
	// Never read past the declared size, but notice a server that has more.
	var one [1]byte
	for {
		m, rerr := resp.Body.Read(one[:])
		if m > 0 {
			return a.errorf(ReasonOversize, "%s sends more than the %d bytes the release document says", a.url, a.art.Size)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return a.requestError(ctx, rctx, idle, rerr)
		}
	}
}

// persist syncs the file and records a checkpoint at the current offset.
func (a *artifactFetch) persist() error {
	if err := a.file.Sync(); err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	state, err := a.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	cp := Checkpoint{Version: a.target.Version, Digest: a.target.Digest, Artifact: a.index, Path: a.art.Path, Offset: a.offset, HashState: state}
	if err := a.sink.SaveCheckpoint(cp); err != nil {
		return ioError(a.target.Version, a.art.Path, err)
	}
	a.saved = a.offset
	return nil
}

// checkpoint records the current offset, best effort (the download stops).
func (a *artifactFetch) checkpoint() {
	if a.offset == 0 {
		_ = a.sink.SaveCheckpoint(Checkpoint{Version: a.target.Version, Digest: a.target.Digest, Artifact: a.index, Path: a.art.Path})
		return
	}
	_ = a.persist()
}

// checkpointOnStop keeps the bytes received so far when the transfer was
// merely cut, and starts the artifact over when its bytes are suspect.
func (a *artifactFetch) checkpointOnStop(ctx context.Context, err error) {
	switch ReasonOf(err) {
	case ReasonUnreachable, ReasonCanceled, ReasonNotFound:
		if a.offset > a.saved {
			a.checkpoint()
		}
	case ReasonDiskFull, ReasonWriteFailed:
	default:
		// The server misbehaves: drop what it sent for this artifact.
		a.h.Reset()
		_ = a.restartAt(0)
		a.checkpoint()
	}
}

func (a *artifactFetch) requestError(ctx, rctx context.Context, idle time.Duration, err error) error {
	if ctx.Err() != nil {
		return canceled(ctx, a.target.Version, a.art.Path)
	}
	if errors.Is(context.Cause(rctx), errStalled) {
		return a.errorf(ReasonUnreachable, "%s sent nothing for %s after byte %d; liken resumes from there", a.url, idle, a.offset)
	}
	return &Error{Reason: ReasonUnreachable, Version: a.target.Version, File: a.art.Path, Err: fmt.Errorf("transfer from %s cut after byte %d: %w", a.url, a.offset, err)}
}

func canceled(ctx context.Context, version, file string) *Error {
	return &Error{Reason: ReasonCanceled, Version: version, File: file, Err: fmt.Errorf("download stopped: %w", ctx.Err())}
}

func sizeReason(got, want int64) Reason {
	if got > want {
		return ReasonOversize
	}
	return ReasonSizeMismatch
}

// parseContentRange parses "bytes start-end/total"; total is -1 for "*".
func parseContentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	first, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false
	}
	if tot == "*" {
		return start, -1, true
	}
	total, err = strconv.ParseInt(tot, 10, 64)
	if err != nil || total < 0 {
		return 0, 0, false
	}
	return start, total, true
}

// client is c (http.DefaultClient when nil) with its redirects checked
// by RefuseDowngrade.
func client(c *http.Client) *http.Client {
	if c == nil {
		c = http.DefaultClient
	}
	cc := *c
	cc.CheckRedirect = RefuseDowngrade(c.CheckRedirect)
	return &cc
}

// maxRedirects is how many redirects a channel read follows, as
// net/http's default policy.
const maxRedirects = 10

// RefuseDowngrade returns an http.Client CheckRedirect that refuses a
// redirect to a plain http URL once any step of the request was https (a
// channel read over https never continues in the clear), then applies
// next, or net/http's default limit of 10 redirects when next is nil.
func RefuseDowngrade(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "https" {
			for _, v := range via {
				if v.URL.Scheme == "https" {
					return fmt.Errorf("refused the redirect from %s to %s: a channel read over https is never continued over plain http; "+
						"fix the redirect on the channel's web server, or set an http:// source if the channel is meant to be plain http", v.URL.Redacted(), req.URL.Redacted())
				}
			}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
}

// channelURL returns the URL of a file of the channel at source.
func channelURL(source string, elems ...string) (string, error) {
	u, err := url.Parse(source)
	if err != nil {
		return "", fmt.Errorf("release channel URL %q: %w", short(source), err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("release channel URL %q must be an http:// or https:// URL", short(source))
	}
	var parts []string
	for _, e := range elems {
		parts = append(parts, strings.Split(e, "/")...)
	}
	return u.JoinPath(parts...).String(), nil
}

// getBounded GETs url and reads at most limit bytes of its body, all of
// it within timeout.
func getBounded(ctx context.Context, c *http.Client, u string, limit int64, file, limitName string, timeout time.Duration) ([]byte, error) {
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errDocumentTimeout)
	defer cancel()
	late := func() error {
		if parent.Err() == nil && errors.Is(context.Cause(ctx), errDocumentTimeout) {
			return newError(ReasonUnreachable, "", file, "reading %s took longer than %s: the channel's web server answered but did not send the whole file in time; check the server and the network, liken retries", u, timeout)
		}
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &Error{Reason: ReasonUnreachable, File: file, Err: err}
	}
	resp, err := client(c).Do(req)
	if err != nil {
		if e := late(); e != nil {
			return nil, e
		}
		if ctx.Err() != nil {
			return nil, canceled(ctx, "", file)
		}
		return nil, &Error{Reason: ReasonUnreachable, File: file, Err: err}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, newError(ReasonNotFound, "", file, "%s answered %s", u, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, newError(ReasonUnreachable, "", file, "%s answered %s", u, resp.Status)
	case resp.ContentLength > limit:
		return nil, newError(ReasonInvalidDocument, "", file, "%s is %d bytes, more than the limit of %d bytes (%s)", u, resp.ContentLength, limit, limitName)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if e := late(); e != nil {
			return nil, e
		}
		if ctx.Err() != nil {
			return nil, canceled(ctx, "", file)
		}
		return nil, &Error{Reason: ReasonUnreachable, File: file, Err: fmt.Errorf("reading %s: %w", u, err)}
	}
	if int64(len(b)) > limit {
		return nil, newError(ReasonInvalidDocument, "", file, "%s is larger than the limit of %d bytes (%s)", u, limit, limitName)
	}
	return b, nil
}

// withVersion sets the release version on an *Error that lacks it.
func withVersion(err error, version string) error {
	var e *Error
	if errors.As(err, &e) && e.Version == "" {
		e.Version = version
	}
	return err
}

// FetchIndex reads and validates the index of the channel at source,
// within DefaultDocumentTimeout. A nil client means http.DefaultClient.
func FetchIndex(ctx context.Context, c *http.Client, source string) (*Index, error) {
	return (&Fetcher{Client: c}).FetchIndex(ctx, source)
}

// FetchIndex reads and validates the index of the channel at source with
// f's client. The whole read, body included, ends within DocumentTimeout:
// a channel that sends the headers and then stalls is cut, and the error
// (ReasonUnreachable) says so.
func (f *Fetcher) FetchIndex(ctx context.Context, source string) (*Index, error) {
	u, err := channelURL(source, IndexName)
	if err != nil {
		return nil, &Error{Reason: ReasonUnreachable, File: IndexName, Err: err}
	}
	b, err := getBounded(ctx, f.Client, u, MaxIndexBytes, IndexName, "MaxIndexBytes", f.documentTimeout())
	if err != nil {
		return nil, err
	}
	return ParseIndex(b)
}
