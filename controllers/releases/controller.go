// Package releases is the release controller: it reads each Cluster's
// release channel (index.yaml) every pollInterval and whenever the
// liken.sh/check-releases annotation changes, and reports the newest
// announced release. It never touches a rollout.
package releases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/internal/metrics"
	likeninformers "liken.sh/liken/generated/informers/externalversions/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/trust"
	"liken.sh/liken/internal/worker"
	"liken.sh/liken/release"
)

// FieldManager is the field manager of the release controller's writes.
const FieldManager = "cluster-operator-releases"

// Reasons of the ReleasesAvailable condition.
const (
	// ReasonChannelRead: index.yaml was read and is valid.
	ReasonChannelRead = "ChannelRead"
	// ReasonInvalidSource: spec.releases.source is not an http(s) URL.
	ReasonInvalidSource = "InvalidSource"
	// ReasonInvalidCABundle: spec.settings.caBundle, which the channel is
	// read trusting, holds something that is not a certificate.
	ReasonInvalidCABundle = "InvalidCABundle"
	// ReasonChannelUnreachable: the web server did not answer, or answered
	// anything but 200.
	ReasonChannelUnreachable = "ChannelUnreachable"
	// ReasonChannelTooLarge: index.yaml is larger than the read limit.
	ReasonChannelTooLarge = "ChannelTooLarge"
	// ReasonChannelMalformed: index.yaml does not parse or breaks a rule.
	ReasonChannelMalformed = "ChannelMalformed"
	// ReasonCatalogDigestMismatch: the channel was read, but it announces a
	// catalogued version with another digest than the catalog pins.
	ReasonCatalogDigestMismatch = "CatalogDigestMismatch"
)

// Event reasons of the release controller.
const (
	// EventNewReleaseAvailable: the channel announces a newer release.
	EventNewReleaseAvailable = "NewReleaseAvailable"
	// EventChannelReadFailed: the channel could not be read (a new problem).
	EventChannelReadFailed = "ChannelReadFailed"
	// EventCatalogDigestMismatch: the channel and the catalog disagree on a
	// release's digest (a new disagreement).
	EventCatalogDigestMismatch = "CatalogDigestMismatch"
)

// Defaults.
const (
	// DefaultRetryAfterError bounds the wait before reading a channel again
	// after a failed read (pollInterval applies when it is shorter).
	DefaultRetryAfterError = 5 * time.Minute
	// DefaultTimeout bounds one read of index.yaml.
	DefaultTimeout = 30 * time.Second
)

// ClusterClient reads a Cluster and writes its status.
type ClusterClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*likenv1.Cluster, error)
	UpdateStatus(ctx context.Context, c *likenv1.Cluster, opts metav1.UpdateOptions) (*likenv1.Cluster, error)
}

// Config is what the release controller needs.
type Config struct {
	Clusters likeninformers.ClusterInformer
	Client   ClusterClient
	// HTTP reads the channels; its Timeout bounds a read (DefaultTimeout
	// when zero).
	HTTP     *http.Client
	Recorder events.EventRecorder
	Metrics  *metrics.Metrics
	Clock    clock.WithTicker
	// RetryAfterError: DefaultRetryAfterError when zero.
	RetryAfterError time.Duration
	// MaxBytes bounds index.yaml: release.MaxIndexBytes when zero.
	MaxBytes int64
}

// Controller is the release controller.
type Controller struct {
	cfg      Config
	clusters likenlisters.ClusterLister
	queue    *worker.Queue
	synced   cache.DoneChecker
}

// New wires the controller to its informer. Call before it starts.
func New(cfg Config) (*Controller, error) {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	// A copy: its whole read is bounded (Timeout covers the body), and a
	// redirect from https to plain http is refused.
	h := *cfg.HTTP
	if h.Timeout == 0 {
		h.Timeout = DefaultTimeout
	}
	h.CheckRedirect = release.RefuseDowngrade(h.CheckRedirect)
	cfg.HTTP = &h
	if cfg.RetryAfterError == 0 {
		cfg.RetryAfterError = DefaultRetryAfterError
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = release.MaxIndexBytes
	}
	c := &Controller{cfg: cfg, clusters: cfg.Clusters.Lister(), synced: cfg.Clusters.Informer().HasSyncedChecker()}
	c.queue = worker.New("releases", cfg.Clock, c.sync)
	fn := func(obj any) {
		if k, ok := worker.KeyOf(obj); ok {
			c.queue.Add(k)
		}
	}
	if _, err := cfg.Clusters.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: fn, UpdateFunc: func(_, n any) { fn(n) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return c.queue.Run(ctx, workers, c.synced)
}

// interval is how long after checkedAt the next read is due.
func (c *Controller) interval(cl *likenv1.Cluster) time.Duration {
	poll := cl.Spec.Releases.PollIntervalOrDefault()
	if cl.Status.Releases.Error != "" {
		return min(poll, c.cfg.RetryAfterError)
	}
	return poll
}

func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	cl, err := c.clusters.Get(key)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	now := c.cfg.Clock.Now()
	request := cl.Annotations[likenv1.AnnotationCheckReleases]
	requested := request != cl.Status.Releases.ObservedCheckRequest
	if checked := cl.Status.Releases.CheckedAt; !requested && checked != nil {
		if wait := checked.Add(c.interval(cl)).Sub(now); wait > 0 {
			return wait, nil
		}
	}

	res := c.read(ctx, cl.Spec.Releases.Source, cl.Spec.Settings.CABundle)
	res.compare(cl.Spec.Releases.Catalog)
	c.cfg.Metrics.ChannelReads.WithLabelValues(cl.Name, res.reason).Inc()
	prev := cl.Status.Releases
	first := true
	var written *likenv1.Cluster
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := cl
		if !first {
			// Only the fields this controller owns change: apply them to
			// the newest version.
			fresh, err := c.cfg.Client.Get(ctx, key, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur = fresh
		}
		first = false
		updated := cur.DeepCopy()
		apply(updated, res, request, now)
		w, err := c.cfg.Client.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager})
		written = w
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("recording the channel read of cluster %s: %w", cl.Name, err)
	}
	logger := klog.FromContext(ctx)
	if res.err != nil {
		logger.Info("Channel read failed", "cluster", klog.KObj(cl), "reason", res.reason, "err", res.err)
		if prev.Error != res.message {
			c.cfg.Recorder.Eventf(cl, nil, corev1.EventTypeWarning, EventChannelReadFailed, "ReadChannel", "%s", res.message)
		}
	} else {
		logger.V(2).Info("Channel read", "cluster", klog.KObj(cl), "newest", res.newest.Version)
		if res.reason == ReasonCatalogDigestMismatch && prevReason(cl) != ReasonCatalogDigestMismatch {
			c.cfg.Recorder.Eventf(cl, nil, corev1.EventTypeWarning, EventCatalogDigestMismatch, "ReadChannel", "%s", res.message)
		}
		if res.newest.Version != "" && res.newest.Version != prev.Available {
			c.cfg.Recorder.Eventf(cl, nil, corev1.EventTypeNormal, EventNewReleaseAvailable, "ReadChannel",
				"The channel %s announces release %s (digest %s). To upgrade, add it to spec.releases.catalog and set spec.version to it.",
				cl.Spec.Releases.Source, res.newest.Version, res.newest.Digest)
		}
	}
	if written != nil {
		return c.interval(written), nil
	}
	return c.interval(cl), nil
}

// readResult is the outcome of one read of a channel.
type readResult struct {
	newest  release.IndexEntry
	count   int
	reason  string
	message string
	err     error
	index   *release.Index
}

// compare notes, after a successful read, the catalogued versions the
// channel announces with another digest. Machines verify against the
// catalog, so they would refuse such a release: say so before they try.
func (r *readResult) compare(catalog []likenv1.CatalogEntry) {
	if r.err != nil || r.index == nil {
		return
	}
	var bad []string
	for _, e := range catalog {
		if a := r.index.Lookup(e.Version); a != nil && a.Digest != e.Digest {
			bad = append(bad, fmt.Sprintf("%s (channel %s, catalog %s)", e.Version, a.Digest, e.Digest))
		}
	}
	if len(bad) == 0 {
		return
	}
	r.reason = ReasonCatalogDigestMismatch
	r.message += fmt.Sprintf(" The channel and spec.releases.catalog disagree on the digest of %s: machines refuse such a release (DigestMismatch). "+
		"Check the digest with `liken release digest` and correct the catalog entry, or the channel.", strings.Join(bad, ", "))
}

func prevReason(cl *likenv1.Cluster) string {
	if c := meta.FindStatusCondition(cl.Status.Conditions, likenv1.ConditionReleasesAvailable); c != nil {
		return c.Reason
	}
	return ""
}

// apply writes a read's outcome into the fields this controller owns:
// status.releases (except newest) and the ReleasesAvailable condition. A
// failed read keeps the last announced release.
func apply(cl *likenv1.Cluster, res readResult, request string, now time.Time) {
	rs := &cl.Status.Releases
	checked := metav1.NewTime(now)
	rs.CheckedAt = &checked
	rs.ObservedCheckRequest = request
	cond := metav1.Condition{Type: likenv1.ConditionReleasesAvailable, Reason: res.reason, Message: res.message, ObservedGeneration: cl.Generation}
	if res.err != nil {
		rs.Error = res.message
		cond.Status = metav1.ConditionFalse
	} else {
		rs.Error = ""
		rs.Available = res.newest.Version
		rs.AvailableDigest = res.newest.Digest
		cond.Status = metav1.ConditionTrue
	}
	fleet.SetCondition(&cl.Status.Conditions, cond, now)
}

// read fetches and validates <source>/index.yaml, reading at most
// MaxBytes.
func (c *Controller) read(ctx context.Context, source, caBundle string) readResult {
	fail := func(reason string, err error, format string, args ...any) readResult {
		return readResult{reason: reason, err: err, message: fmt.Sprintf(format, args...) +
			" Rollouts are not affected. cluster-operator reads the channel again after min(pollInterval, " +
			c.cfg.RetryAfterError.String() + ") or when annotation " + likenv1.AnnotationCheckReleases + " gets a new value."}
	}
	u, err := url.Parse(source)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		if err == nil {
			err = errors.New("not an http or https URL with a host")
		}
		return fail(ReasonInvalidSource, err, "spec.releases.source %q is not a valid channel URL (%v): set it to the http(s) URL of the channel directory.", source, err)
	}
	index := u.JoinPath(release.IndexName).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, index, nil)
	if err != nil {
		return fail(ReasonInvalidSource, err, "Cannot build a request for %s: %v.", index, err)
	}
	client := c.cfg.HTTP
	if caBundle != "" {
		// The Cluster's private CAs, besides the public ones of the
		// operator's image.
		base, _ := client.Transport.(*http.Transport)
		tr, err := trust.WithBundle(base, caBundle)
		if err != nil {
			return fail(ReasonInvalidCABundle, err, "Cannot read %s trusting spec.settings.caBundle: %v. Give PEM certificates of the CAs that sign the channel's certificate.", index, err)
		}
		defer tr.CloseIdleConnections()
		cp := *client
		cp.Transport = tr
		client = &cp
	}
	resp, err := client.Do(req)
	if err != nil {
		return fail(ReasonChannelUnreachable, err, "Cannot read %s: %v. Check spec.releases.source and that the channel's web server answers.", index, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("HTTP %s", resp.Status)
		return fail(ReasonChannelUnreachable, err, "Reading %s answered %s. Check spec.releases.source and that the channel publishes %s.", index, resp.Status, release.IndexName)
	}
	tooLarge := func(size string) readResult {
		err := fmt.Errorf("index.yaml is %s bytes, more than %d", size, c.cfg.MaxBytes)
		return fail(ReasonChannelTooLarge, err, "%s is %s bytes, more than the %d bytes cluster-operator reads; it was not parsed. Check the channel.", index, size, c.cfg.MaxBytes)
	}
	if resp.ContentLength > c.cfg.MaxBytes {
		return tooLarge(fmt.Sprint(resp.ContentLength))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxBytes+1))
	if err != nil {
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return fail(ReasonChannelUnreachable, err, "Reading %s took longer than %s: the channel's web server answered but did not send the whole file in time. Check the server and the network.", index, c.cfg.HTTP.Timeout)
		}
		return fail(ReasonChannelUnreachable, err, "Reading %s stopped: %v.", index, err)
	}
	if int64(len(b)) > c.cfg.MaxBytes {
		return tooLarge("more than " + fmt.Sprint(c.cfg.MaxBytes))
	}
	idx, err := release.ParseIndex(b)
	if err != nil {
		return fail(ReasonChannelMalformed, err, "%s is malformed: %v. Fix the channel's index (liken release rewrites it).", index, err)
	}
	res := readResult{reason: ReasonChannelRead, count: len(idx.Releases), index: idx}
	if n := idx.Newest(); n != nil {
		res.newest = *n
		res.message = fmt.Sprintf("The channel announces %d releases; the newest is %s.", res.count, n.Version)
	} else {
		res.message = "The channel announces no release."
	}
	return res
}
