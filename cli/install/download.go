package install

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"liken.sh/liken/release"
)

// download fetches the release whose release.yaml is at docURL into dir,
// verifying every byte against target (release.Fetcher's checks: the
// document against the digest, each artifact against the document).
func download(ctx context.Context, client *http.Client, docURL string, target release.Target, dir string, progress func(done, total int64)) error {
	suffix := "/" + target.Version + "/" + release.DocumentName
	if !strings.HasSuffix(docURL, suffix) {
		return fmt.Errorf("%s: a release on a channel is in a folder named after its version (.../%s/); give the URL of that folder", docURL, target.Version)
	}
	channel := strings.TrimSuffix(docURL, suffix)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var last time.Time
	f := &release.Fetcher{Client: client, Progress: func(done, total int64) {
		if now := time.Now(); now.Sub(last) >= 2*time.Second || done == total {
			last = now
			progress(done, total)
		}
	}}
	if _, err := f.Fetch(ctx, channel, target, &dirSink{ctx: ctx, root: root}); err != nil {
		return fmt.Errorf("downloading release %s from %s: %w", target.Version, channel, err)
	}
	return nil
}

// dirSink receives a download in a plain folder; progress is not kept (an
// interrupted install starts again).
type dirSink struct {
	ctx  context.Context
	root *os.Root
}

var _ release.Sink = (*dirSink)(nil)

func (s *dirSink) Context() context.Context                { return s.ctx }
func (s *dirSink) Checkpoint() *release.Checkpoint         { return nil }
func (s *dirSink) SaveCheckpoint(release.Checkpoint) error { return nil }

func (s *dirSink) WriteDocument(b []byte) error {
	return s.root.WriteFile(release.DocumentName, b, 0o644)
}

func (s *dirSink) OpenArtifact(p string) (release.File, error) {
	if d := path.Dir(p); d != "." {
		if err := s.root.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return s.root.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
}
