package releases

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/metrics"
	tu "liken.sh/liken/controllers/internal/testutil"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
	"liken.sh/liken/release"
)

func index(versions ...string) string {
	var b strings.Builder
	b.WriteString("apiVersion: liken.sh/v1alpha1\nkind: ReleaseIndex\nreleases:\n")
	for i, v := range versions {
		fmt.Fprintf(&b, "- version: %q\n  digest: sha256:%064x\n  published: 2026-11-0%dT10:00:00Z\n", v, i+1, i+1)
	}
	return b.String()
}

type channel struct {
	srv   *httptest.Server
	body  atomic.Value // string
	code  atomic.Int32
	reads atomic.Int32
}

func newChannel(t *testing.T, body string) *channel {
	ch := &channel{}
	ch.body.Store(body)
	ch.code.Store(http.StatusOK)
	ch.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/liken/index.yaml" {
			http.NotFound(w, r)
			return
		}
		ch.reads.Add(1)
		w.WriteHeader(int(ch.code.Load()))
		_, _ = w.Write([]byte(ch.body.Load().(string)))
	}))
	t.Cleanup(ch.srv.Close)
	return ch
}

type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *likenfake.Clientset
	informer likeninformers.SharedInformerFactory
	ctrl     *Controller
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
}

func newFixture(t *testing.T, c *likenv1.Cluster) *fixture {
	f := &fixture{t: t, ctx: context.Background(), clock: clocktesting.NewFakeClock(tu.Epoch), recorder: events.NewFakeRecorder(100)}
	f.client = likenfake.NewSimpleClientset(c)
	tu.OptimisticUpdates(f.client, "clusters")
	f.informer = likeninformers.NewSharedInformerFactory(f.client, 0)
	ctrl, err := New(Config{
		Clusters: f.informer.Liken().V1alpha1().Clusters(),
		Client:   f.client.LikenV1alpha1().Clusters(),
		Recorder: f.recorder,
		Metrics:  metrics.New(),
		Clock:    f.clock,
	})
	assert.NilError(t, err)
	f.ctrl = ctrl
	assert.NilError(t, f.informer.Liken().V1alpha1().Clusters().Informer().GetIndexer().Add(c))
	return f
}

func (f *fixture) stored() *likenv1.Cluster {
	c, err := f.client.LikenV1alpha1().Clusters().Get(f.ctx, "lab", metav1.GetOptions{})
	assert.NilError(f.t, err)
	return c
}

// sync refreshes the cache from the API server and syncs once.
func (f *fixture) sync() time.Duration {
	f.t.Helper()
	assert.NilError(f.t, f.informer.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(f.stored()))
	d, err := f.ctrl.sync(f.ctx, "lab")
	assert.NilError(f.t, err)
	return d
}

func (f *fixture) condition() metav1.Condition {
	c := meta.FindStatusCondition(f.stored().Status.Conditions, likenv1.ConditionReleasesAvailable)
	assert.Assert(f.t, c != nil)
	return *c
}

func withSource(src string) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) { c.Spec.Releases.Source = src }
}

func withPoll(d time.Duration) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) { c.Spec.Releases.PollInterval = &metav1.Duration{Duration: d} }
}

func TestReadsNewestAndPolls(t *testing.T) {
	ch := newChannel(t, index("2026.11.01-001", "2026.11.20-001", "2026.11.05-001"))
	f := newFixture(t, tu.Cluster("lab", withSource(ch.srv.URL+"/liken"), withPoll(10*time.Minute)))

	assert.Equal(t, f.sync(), 10*time.Minute)
	st := f.stored().Status.Releases
	assert.Equal(t, st.Available, "2026.11.20-001")
	assert.Equal(t, st.AvailableDigest, fmt.Sprintf("sha256:%064x", 2))
	assert.Equal(t, st.Error, "")
	assert.Equal(t, st.CheckedAt.Time, tu.Epoch)
	cond := f.condition()
	assert.Equal(t, cond.Status, metav1.ConditionTrue)
	assert.Equal(t, cond.Reason, ReasonChannelRead)
	assert.Equal(t, cond.Message, "The channel announces 3 releases; the newest is 2026.11.20-001.")
	assert.Assert(t, is.Contains(<-f.recorder.Events, "Normal NewReleaseAvailable"))

	// Not due yet: no read.
	f.clock.Step(9 * time.Minute)
	assert.Equal(t, f.sync(), time.Minute)
	assert.Equal(t, ch.reads.Load(), int32(1))

	// Due: read again.
	ch.body.Store(index("2026.11.01-001", "2026.11.28-002"))
	f.clock.Step(time.Minute)
	f.sync()
	assert.Equal(t, ch.reads.Load(), int32(2))
	assert.Equal(t, f.stored().Status.Releases.Available, "2026.11.28-002")
}

func TestCheckReleasesAnnotationReadsNow(t *testing.T) {
	ch := newChannel(t, index("2026.11.01-001"))
	f := newFixture(t, tu.Cluster("lab", withSource(ch.srv.URL+"/liken/")))
	f.sync()
	assert.Equal(t, ch.reads.Load(), int32(1))

	f.clock.Step(time.Minute)
	f.sync()
	assert.Equal(t, ch.reads.Load(), int32(1), "the default poll interval is an hour")

	for i, v := range []string{"2026-11-30T10:01:00Z", "again"} {
		c := f.stored()
		c.Annotations[likenv1.AnnotationCheckReleases] = v
		_, err := f.client.LikenV1alpha1().Clusters().Update(f.ctx, c, metav1.UpdateOptions{})
		assert.NilError(t, err)
		f.sync()
		assert.Equal(t, ch.reads.Load(), int32(2+i))
		assert.Equal(t, f.stored().Status.Releases.ObservedCheckRequest, v)
		f.sync()
		assert.Equal(t, ch.reads.Load(), int32(2+i), "the same value is not a new request")
	}
}

func TestBadChannelsNameTheProblemAndChangeNothingElse(t *testing.T) {
	huge := index("2026.11.01-001") + "#" + strings.Repeat("x", release.MaxIndexBytes)
	cases := []struct {
		name    string
		body    string
		code    int
		source  string
		reason  string
		message string
	}{
		{name: "malformed yaml", body: "releases: [", reason: ReasonChannelMalformed, message: "index.yaml is malformed"},
		{name: "bad digest", body: strings.Replace(index("2026.11.01-001"), "sha256:", "sha1:", 1),
			reason: ReasonChannelMalformed, message: "releases[0].digest"},
		{name: "bad version", body: index("v1.0"), reason: ReasonChannelMalformed, message: "releases[0].version"},
		{name: "oversized", body: huge, reason: ReasonChannelTooLarge, message: "more than the 4194304 bytes cluster-operator reads"},
		{name: "not found", body: "gone", code: http.StatusNotFound, reason: ReasonChannelUnreachable, message: "answered 404 Not Found"},
		{name: "unreachable", source: "http://127.0.0.1:1/liken", reason: ReasonChannelUnreachable, message: "Cannot read http://127.0.0.1:1/liken/index.yaml"},
		{name: "not a URL", source: "ftp://example.com/liken", reason: ReasonInvalidSource, message: `spec.releases.source "ftp://example.com/liken" is not a valid channel URL`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ch := newChannel(t, index("2026.11.01-001", "2026.11.20-001"))
			src := ch.srv.URL + "/liken"
			if tc.source != "" {
				src = tc.source
			}
			c := tu.Cluster("lab", withSource(src), withPoll(time.Hour), tu.TargetVersion(tu.Version2),
				tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, tu.Epoch)))
			c.Status.Releases.Available = "2026.11.20-001"
			c.Status.Releases.AvailableDigest = "sha256:previous"
			c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonTrialFailed, Machine: "b"}
			f := newFixture(t, c)
			ch.body.Store(tc.body)
			if tc.code != 0 {
				ch.code.Store(int32(tc.code))
			}
			before := f.stored()

			assert.Equal(t, f.sync(), DefaultRetryAfterError)
			after := f.stored()
			cond := f.condition()
			assert.Equal(t, cond.Status, metav1.ConditionFalse)
			assert.Equal(t, cond.Reason, tc.reason)
			assert.Assert(t, is.Contains(cond.Message, tc.message))
			assert.Assert(t, is.Contains(cond.Message, "Rollouts are not affected"))
			assert.Equal(t, after.Status.Releases.Error, cond.Message)
			// Nothing else changed: the last announced release, the ledger,
			// the halt and the spec are as they were.
			assert.Equal(t, after.Status.Releases.Available, "2026.11.20-001")
			assert.Equal(t, after.Status.Releases.AvailableDigest, "sha256:previous")
			assert.DeepEqual(t, after.Status.RebootTurns, before.Status.RebootTurns)
			assert.DeepEqual(t, after.Status.Halt, before.Status.Halt)
			assert.DeepEqual(t, after.Spec, before.Spec)
			assert.Assert(t, is.Contains(<-f.recorder.Events, "Warning ChannelReadFailed"))

			// Fixed: the next read (after the error retry) clears the error.
			ch.body.Store(index("2026.11.01-001"))
			ch.code.Store(http.StatusOK)
			if tc.source == "" {
				f.clock.Step(DefaultRetryAfterError)
				f.sync()
				assert.Equal(t, f.stored().Status.Releases.Error, "")
				assert.Equal(t, f.condition().Reason, ReasonChannelRead)
			}
		})
	}
}

// TestStalledChannelIsCut: a channel that sends index.yaml's headers and
// part of it, then stalls, is cut within the read's timeout (its whole
// body included), and the condition says what happened.
func TestStalledChannelIsCut(t *testing.T) {
	stalled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "4096")
		_, _ = w.Write([]byte(index("2026.11.01-001")[:16]))
		w.(http.Flusher).Flush()
		close(stalled)
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	f := newFixture(t, tu.Cluster("lab", withSource(srv.URL+"/liken"), withPoll(time.Hour)))
	f.ctrl.cfg.HTTP.Timeout = 300 * time.Millisecond

	// The test's own bound: without the timeout, the read would wait for it.
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	f.ctx = ctx
	assert.Equal(t, f.sync(), DefaultRetryAfterError)
	select {
	case <-stalled:
	default:
		t.Fatal("the channel never stalled: the read failed before the body")
	}
	cond := f.condition()
	assert.Equal(t, cond.Status, metav1.ConditionFalse)
	assert.Equal(t, cond.Reason, ReasonChannelUnreachable)
	assert.Assert(t, is.Contains(cond.Message, "took longer than 300ms: the channel's web server answered but did not send the whole file in time"), cond.Message)
}

func TestWriteRetriesOnConflictWithOwnFieldsOnly(t *testing.T) {
	ch := newChannel(t, index("2026.11.01-001"))
	f := newFixture(t, tu.Cluster("lab", withSource(ch.srv.URL+"/liken")))
	// Another controller writes the ledger after the cache was filled.
	other := f.stored()
	other.Status.Turns = "a"
	other.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnReboot, false, tu.Epoch)}
	_, err := f.client.LikenV1alpha1().Clusters().UpdateStatus(f.ctx, other, metav1.UpdateOptions{})
	assert.NilError(t, err)

	_, err = f.ctrl.sync(f.ctx, "lab") // cache holds the older version
	assert.NilError(t, err)
	st := f.stored().Status
	assert.Equal(t, st.Releases.Available, "2026.11.01-001")
	assert.Equal(t, st.Turns, "a", "the other writer's ledger is kept")
	assert.Equal(t, ch.reads.Load(), int32(1))
}

func TestCatalogDigestMismatchIsNamed(t *testing.T) {
	// The test index gives version i the digest sha256:<i+1 in hex>; the
	// test catalog pins Version2 (2026.11.20-001) to sha256:...2.
	ch := newChannel(t, index("2026.11.20-001", "2026.11.01-001"))
	f := newFixture(t, tu.Cluster("lab", withSource(ch.srv.URL+"/liken"), tu.Turns(tu.Turn("a", likenv1.TurnRelease, false, tu.Epoch))))
	before := f.stored()
	f.sync()
	cond := f.condition()
	assert.Equal(t, cond.Status, metav1.ConditionTrue, "the channel itself was read")
	assert.Equal(t, cond.Reason, ReasonCatalogDigestMismatch)
	assert.Assert(t, is.Contains(cond.Message, fmt.Sprintf("2026.11.20-001 (channel sha256:%064x, catalog sha256:%064x)", 1, 2)))
	assert.Assert(t, is.Contains(cond.Message, fmt.Sprintf("2026.11.01-001 (channel sha256:%064x, catalog sha256:%064x)", 2, 1)))
	after := f.stored()
	assert.Equal(t, after.Status.Releases.Available, "2026.11.20-001")
	assert.DeepEqual(t, after.Status.RebootTurns, before.Status.RebootTurns)
	assert.DeepEqual(t, after.Spec, before.Spec)
	var evs []string
	for len(f.recorder.Events) > 0 {
		evs = append(evs, <-f.recorder.Events)
	}
	assert.Assert(t, is.Contains(strings.Join(evs, "\n"), "Warning CatalogDigestMismatch"))
}

// A channel read over https never continues over plain http.
func TestRedirectFromHTTPSToHTTPIsRefused(t *testing.T) {
	ch := newChannel(t, index("2026.11.01-001"))
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, ch.srv.URL+r.URL.Path, http.StatusFound)
	}))
	defer tlsSrv.Close()
	c := tu.Cluster("lab", withSource(tlsSrv.URL+"/liken"))
	client := likenfake.NewSimpleClientset(c)
	inf := likeninformers.NewSharedInformerFactory(client, 0)
	ctrl, err := New(Config{
		Clusters: inf.Liken().V1alpha1().Clusters(), Client: client.LikenV1alpha1().Clusters(), HTTP: tlsSrv.Client(),
		Recorder: events.NewFakeRecorder(10), Metrics: metrics.New(), Clock: clocktesting.NewFakeClock(tu.Epoch),
	})
	assert.NilError(t, err)
	res := ctrl.read(context.Background(), c.Spec.Releases.Source, "")
	assert.Equal(t, res.reason, ReasonChannelUnreachable)
	assert.Assert(t, is.Contains(res.message, "refused the redirect from https://"))
	assert.Equal(t, ch.reads.Load(), int32(0))
}

// TestPrivateCAChannelIsReadWithTheClustersBundle: a channel whose
// certificate no public CA signed is unreachable until the Cluster's
// settings.caBundle holds its CA, read once it does, and a bundle of no
// certificate is named as the problem.
func TestPrivateCAChannelIsReadWithTheClustersBundle(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(index("2026.11.01-001")))
	}))
	defer srv.Close()
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	for _, tc := range []struct {
		name, bundle, reason, message string
	}{
		{name: "no bundle", reason: ReasonChannelUnreachable, message: "certificate signed by unknown authority"},
		{name: "the channel's CA", bundle: caPEM, reason: ReasonChannelRead},
		{name: "no certificate", bundle: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n", reason: ReasonInvalidCABundle, message: "trusting spec.settings.caBundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tu.Cluster("lab", withSource(srv.URL+"/liken"), func(c *likenv1.Cluster) { c.Spec.Settings.CABundle = tc.bundle }))
			f.sync()
			cond := f.condition()
			assert.Check(t, is.Equal(cond.Reason, tc.reason))
			assert.Check(t, is.Contains(cond.Message, tc.message))
		})
	}
}
