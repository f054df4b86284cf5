package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
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

// catalogTarget is the release the Cluster wants, or nil when it runs it
// already or the catalog does not name it.
func (d *Daemon) catalogTarget(c *likenv1.Cluster) *release.Target {
	if c.Spec.Version == "" || c.Spec.Version == d.o.Boot.Version {
		return nil
	}
	for _, e := range c.Spec.Releases.Catalog {
		if e.Version == c.Spec.Version {
			return &release.Target{Version: e.Version, Digest: e.Digest}
		}
	}
	return nil
}

// syncRelease runs the release pipeline: download the Cluster's version
// into the other slot, verify and stage it; withdraw a release the Cluster
// no longer wants. Call with d.mu held.
func (d *Daemon) syncRelease(ctx context.Context, v *view) {
	log := klog.FromContext(ctx)
	for _, e := range d.pendingEvents {
		d.event(v.m, v.c, e.typ, e.reason, e.action, "%s", e.note)
	}
	d.pendingEvents = nil
	v.target = d.catalogTarget(v.c)
	other := d.slots.Other()
	oi, _ := d.slots.Get(other)

	// A failed trial holds the release back until the version changes or
	// a person resumes the rollout after the failure. The resume value
	// that counts is the Cluster's when the failure is first seen here:
	// a resume given while the trial ran (for another machine's halt)
	// does not clear a failure nobody has seen yet.
	if f := d.st.TrialFailure; f != nil {
		resume := v.c.Annotations[likenv1.AnnotationResumeRollout]
		if f.ResumeUnseen {
			if resume != f.Resume {
				log.Info("The rollout was resumed while the trial ran; the failure still holds the release back until the next resume", "failed", f.Version, "armedWith", f.Resume, "resume", resume)
			}
			if err := d.update(func(st *diskState) {
				st.TrialFailure.Resume, st.TrialFailure.ResumeUnseen = resume, false
			}); err != nil {
				log.Error(err, "Recording the resume value the failed trial is first reported under; retried at the next sync")
			}
			f = d.st.TrialFailure
			if f.ResumeUnseen {
				// Not saved: this sync holds the release anyway.
				unsaved := *f
				unsaved.Resume, unsaved.ResumeUnseen = resume, false
				f = &unsaved
			}
		}
		if v.target != nil && f.Version == v.target.Version && f.Digest == v.target.Digest && resume == f.Resume {
			v.failedTrial = f
		} else {
			log.Info("Clearing the failed trial: the Cluster wants another release or the rollout was resumed", "failed", f.Version)
			if err := d.update(func(st *diskState) { st.TrialFailure = nil }); err != nil {
				log.Error(err, "Clearing the failed trial")
			}
		}
	}

	if h := d.turn; h != nil {
		// During a turn the release it reboots into stays staged, even
		// when the re-check before the reboot marks the slot Failed (the
		// machine then reboots without a trial); only a new target
		// changes what is staged, and the turn is given back.
		v.staged = v.target != nil && h.release != nil && *h.release == *v.target
		return
	}
	if d.mode != modeNormal || d.st.Turn != nil {
		// No slot changes during a trial, nor on a boot that is not the
		// proven slot.
		v.staged = v.target != nil && oi.State == likenv1.SlotStaged && oi.Target() == *v.target
		v.downloading = d.dl != nil
		return
	}

	switch {
	case v.target == nil || v.failedTrial != nil:
		d.cancelDownload()
		d.dlFailure = nil
		if v.target == nil && v.c.Spec.Version == d.o.Boot.Version && (oi.State == likenv1.SlotStaged || oi.State == likenv1.SlotDownloading) {
			if err := d.slots.Withdraw(other); err != nil {
				log.Error(err, "Withdrawing the release the Cluster no longer wants", "slot", other)
			} else {
				log.Info("Withdrew the release the Cluster no longer wants", "slot", other, "release", oi.Version)
				d.event(v.m, v.c, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Withdrew release %s from slot %s: the Cluster's version is %s, which this machine runs", oi.Version, other, v.c.Spec.Version)
			}
		}
	case oi.State == likenv1.SlotStaged && oi.Target() == *v.target:
		v.staged = true
		if d.dl != nil && d.dl.target != *v.target {
			d.cancelDownload()
		}
		// A download of this target that just staged it reports itself.
		d.dlFailure = nil
	case d.dl != nil && d.dl.target == *v.target:
		v.downloading = true
	default:
		if d.dl != nil {
			log.Info("Retarget: stopping the download of a release the Cluster no longer wants", "old", d.dl.target.Version, "new", v.target.Version)
			d.event(v.m, v.c, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Stopped downloading release %s: the Cluster's version is now %s, downloaded into the same slot", d.dl.target.Version, v.target.Version)
			d.cancelDownload()
		} else if oi.State == likenv1.SlotStaged {
			d.event(v.m, v.c, "Normal", ReasonReleaseWithdrawn, "Withdraw", "Withdrew staged release %s from slot %s: the Cluster's version is now %s", oi.Version, other, v.target.Version)
		}
		if f := d.dlFailure; f != nil && f.target == *v.target && v.now.Before(f.retryAt) {
			v.requeue(f.retryAt.Sub(v.now))
			break
		}
		if f := d.dlFailure; f != nil && f.target != *v.target {
			d.dlFailure = nil
		}
		d.startDownload(ctx, v, other)
		v.downloading = true
	}
	if f := d.dlFailure; f != nil && !f.reported && v.target != nil && f.target == *v.target {
		f.reported = true
		file := release.FileOf(f.err)
		if file == "" {
			file = "the release as a whole"
		}
		d.event(v.m, v.c, "Warning", ReasonReleaseFailed, "Download",
			"Release %s, %s: %s (%v). Nothing was staged; retrying in %s",
			f.target.Version, file, reasonOf(f.err), f.err, f.retryAt.Sub(v.now).Round(time.Second))
	}
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

// startDownload fetches v.target into slot in the background. Call with
// d.mu held.
func (d *Daemon) startDownload(ctx context.Context, v *view, slot string) {
	log := klog.FromContext(ctx).WithValues("release", v.target.Version, "slot", slot)
	dctx, cancel := context.WithCancel(ctx)
	dl := &download{target: *v.target, slot: slot, cancel: cancel, started: v.now}
	d.dl = dl
	source, caBundle := v.c.Spec.Releases.Source, v.c.Spec.Settings.CABundle
	log.Info("Downloading release into the other slot", "source", source)
	d.event(v.m, v.c, "Normal", ReasonDownloadStarted, "Download", "Downloading release %s from %s into slot %s", v.target.Version, source, slot)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		err := d.runDownload(klog.NewContext(dctx, log), dl, source, caBundle)
		d.downloadDone(ctx, dl, err)
	}()
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
	var safe error
	if d.turn != nil || d.st.Trial != nil {
		safe = errors.New("a turn or a trial is under way")
	} else {
		safe = d.disarmLeftovers(ctx)
	}
	d.mu.Unlock()
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
