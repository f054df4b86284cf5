package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// download is a fetch into the other slot, running in its own goroutine.
type download struct {
	target release.Target
	slot   string
	cancel context.CancelFunc
	// done and total are the bytes in the slot and the release's size.
	done, total  int64
	lastEnqueued time.Time
	started      time.Time
}

// downloadFailure is the last failed attempt at the current target.
type downloadFailure struct {
	target   release.Target
	err      error
	attempts int
	retryAt  time.Time
	reported bool
}

// pendingEvents are outcomes of background work, reported by sync (which
// has the Machine and Cluster to attach events to).
type pendingEvent struct {
	typ, reason, action, note string
}

func reasonOf(err error) string {
	if r := release.ReasonOf(err); r != "" {
		return string(r)
	}
	return "DownloadFailed"
}

// cancelDownload stops the running download. Call with d.mu held.
func (d *Daemon) cancelDownload() {
	if d.dl != nil {
		d.dl.cancel()
		d.dl = nil
	}
}

// startDownload fetches target into slot in the background; downloadDone
// records how it ended.
func (d *Daemon) startDownload(ctx context.Context, f *facts, target release.Target, slot string) {
	log := klog.FromContext(ctx).WithValues("release", target.Version, "slot", slot)
	source, caBundle := f.C.Spec.Releases.Source, f.C.Spec.Settings.CABundle
	dctx, cancel := context.WithCancel(ctx)
	dl := &download{target: target, slot: slot, cancel: cancel, started: f.Now}
	d.mu.Lock()
	if fl := d.dlFailure; fl != nil && fl.target != target {
		d.dlFailure = nil
	}
	d.dl = dl
	d.mu.Unlock()
	log.Info("Downloading release into the other slot", "source", source)
	d.event(f.M, f.C, "Normal", ReasonDownloadStarted, "Download", "Downloading release %s from %s into slot %s", target.Version, source, slot)
	d.wg.Go(func() {
		err := d.runDownload(klog.NewContext(dctx, log), dl, source, caBundle)
		d.downloadDone(ctx, dl, err)
	})
}

func (d *Daemon) runDownload(ctx context.Context, dl *download, source, caBundle string) error {
	if d.trust != nil {
		if err := d.trust.Use(caBundle); err != nil {
			return err
		}
	}
	// No byte goes into the inactive slot while the boot loader could
	// still try it: a power cut mid-write would boot half a release.
	d.mu.Lock()
	busy := d.run != nil || d.st.Trial != nil
	d.mu.Unlock()
	safe := errors.New("a turn or a trial is under way")
	if !busy {
		safe = d.disarmLeftovers(ctx)
	}
	if safe != nil {
		return fmt.Errorf("not writing into slot %s while the next boot might try it: %w", dl.slot, safe)
	}
	h, err := d.slots.BeginDownload(dl.slot, dl.target)
	if errors.Is(err, slots.ErrAlreadyStaged) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.Context(), cancel)
	defer stop()
	f := &release.Fetcher{Client: d.http, Space: d.roomFor, Progress: func(done, total int64) {
		d.mu.Lock()
		dl.done, dl.total = done, total
		now := d.clock.Now()
		tick := now.Sub(dl.lastEnqueued) >= d.t.Progress/2 || done == total
		if tick {
			dl.lastEnqueued = now
		}
		d.mu.Unlock()
		if tick {
			d.enqueue()
		}
	}}
	res, err := f.Fetch(fctx, source, dl.target, h)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Release downloaded; verifying the whole slot", "bytes", res.Total, "transferred", res.Transferred, "reused", res.Reused)
	// Stage ends the download handle (and its context) itself.
	if _, err := d.slots.Stage(ctx, dl.slot); err != nil {
		return err
	}
	return nil
}

// roomFor says whether need more bytes may go into the inactive slot:
// a download never takes the room the kubelet's eviction threshold and a
// leader's etcd need (roomFor in space.go).
func (d *Daemon) roomFor(need int64) error {
	fs, err := statSpace(d.o.Root)
	if err != nil {
		return err
	}
	var datastore int64
	if d.o.DatastoreRoom != nil {
		datastore = d.o.DatastoreRoom()
	}
	return roomFor(need, fs, datastore)
}

// downloadDone records how a download ended.
func (d *Daemon) downloadDone(ctx context.Context, dl *download, err error) {
	log := klog.FromContext(ctx).WithValues("release", dl.target.Version, "slot", dl.slot)
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.enqueue()
	if d.dl != dl {
		log.V(2).Info("A withdrawn download ended", "err", err)
		return
	}
	d.dl = nil
	switch {
	case err == nil:
		d.dlFailure = nil
		log.Info("Release verified and staged", "took", d.clock.Since(dl.started).Round(time.Millisecond))
		d.pendingEvents = append(d.pendingEvents, pendingEvent{"Normal", ReasonReleaseStaged, "Stage",
			fmt.Sprintf("Release %s verified and staged in slot %s (%d bytes)", dl.target.Version, dl.slot, dl.total)})
	case ctx.Err() != nil || release.ReasonOf(err) == release.ReasonCanceled || errors.Is(err, slots.ErrWithdrawn):
		log.Info("Download stopped", "reason", err)
	default:
		f := d.dlFailure
		if f == nil || f.target != dl.target {
			f = &downloadFailure{target: dl.target}
		}
		f.attempts++
		f.err = err
		f.reported = false
		backoff := d.t.RetryMin
		for i := 1; i < f.attempts && backoff < d.t.RetryMax; i++ {
			backoff *= 2
		}
		backoff = min(backoff, d.t.RetryMax)
		f.retryAt = d.clock.Now().Add(backoff)
		d.dlFailure = f
		log.Error(err, "Release download or verification failed; nothing staged, retrying", "reason", reasonOf(err), "file", release.FileOf(err), "retryIn", backoff)
	}
}
