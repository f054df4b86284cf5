package liveness

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	tu "liken.sh/liken/controllers/internal/testutil"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

type fixture struct {
	t        *testing.T
	ctx      context.Context
	liken    *likenfake.Clientset
	kube     *kubefake.Clientset
	reader   *kubefake.Clientset
	ctrl     *Controller
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	metrics  *metrics.Metrics
	fenceErr error
}

func lease(name string, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: likenv1.SystemNamespace},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: renew},
		},
	}
}

// newFixture starts real informers over fake clientsets. Leases are
// served to the informer by kube and to the pre-verdict read by reader,
// which holds the same Leases unless a test makes them differ.
func newFixture(t *testing.T, likenObjs []runtime.Object, leases ...*coordinationv1.Lease) *fixture {
	t.Helper()
	return newFixtureListedAfter(t, 0, likenObjs, leases...)
}

// newFixtureListedAfter starts the informers listDelay after this copy
// started leading (at Epoch).
func newFixtureListedAfter(t *testing.T, listDelay time.Duration, likenObjs []runtime.Object, leases ...*coordinationv1.Lease) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, clock: clocktesting.NewFakeClock(tu.Epoch), recorder: events.NewFakeRecorder(100), metrics: metrics.New()}
	var kubeObjs []runtime.Object
	for _, l := range leases {
		kubeObjs = append(kubeObjs, l)
	}
	f.liken = likenfake.NewSimpleClientset(likenObjs...)
	tu.OptimisticUpdates(f.liken, "machines")
	f.kube = kubefake.NewClientset(kubeObjs...)
	f.reader = kubefake.NewClientset(kubeObjs...)
	lf := likeninformers.NewSharedInformerFactory(f.liken, 0)
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(f.kube, 0, kubeinformers.WithNamespace(likenv1.SystemNamespace))
	ctrl, err := New(Config{
		Machines:    lf.Liken().V1alpha1().Machines(),
		Clusters:    lf.Liken().V1alpha1().Clusters(),
		Leases:      kf.Coordination().V1().Leases(),
		LeaseReader: f.reader.CoordinationV1(),
		Writer:      f.liken.LikenV1alpha1().Machines(),
		Recorder:    f.recorder,
		Metrics:     f.metrics,
		Clock:       f.clock,
		Term: leadership.Term{Identity: "op-1", Since: tu.Epoch,
			Fence: leadership.FenceFunc(func(context.Context, string) error { return f.fenceErr })},
		LostAfter: DefaultLostAfter,
	})
	assert.NilError(t, err)
	f.ctrl = ctrl
	f.clock.Step(listDelay)
	lf.Start(ctx.Done())
	kf.Start(ctx.Done())
	assert.Assert(t, cache.WaitForCacheSync(ctx.Done(), ctrl.synced...))
	return f
}

func (f *fixture) phase(name string) likenv1.MachinePhase {
	f.t.Helper()
	m, err := f.liken.LikenV1alpha1().Machines().Get(f.ctx, name, metav1.GetOptions{})
	assert.NilError(f.t, err)
	return m.Status.Phase
}

func (f *fixture) sync(name string) time.Duration {
	f.t.Helper()
	// The lister must hold the stored Machine (the write carries its
	// resourceVersion).
	poll.WaitOn(f.t, func(poll.LogT) poll.Result {
		m, err := f.ctrl.machines.Get(name)
		if err != nil {
			return poll.Continue("machine %s not in cache: %v", name, err)
		}
		stored, _ := f.liken.LikenV1alpha1().Machines().Get(f.ctx, name, metav1.GetOptions{})
		if m.ResourceVersion != stored.ResourceVersion {
			return poll.Continue("cache behind")
		}
		return poll.Success()
	})
	after, err := f.ctrl.Sync(f.ctx, name)
	assert.NilError(f.t, err)
	return after
}

// renew renews a Lease at the current time, as the machine would, and
// waits until the controller saw it.
func (f *fixture) renew(name string) {
	f.t.Helper()
	l := lease(name, f.clock.Now())
	for _, cs := range []*kubefake.Clientset{f.kube, f.reader} {
		_, err := cs.CoordinationV1().Leases(likenv1.SystemNamespace).Update(f.ctx, l, metav1.UpdateOptions{})
		assert.NilError(f.t, err)
	}
	poll.WaitOn(f.t, func(poll.LogT) poll.Result {
		if seen, _ := f.ctrl.LastSeen(name); seen.Equal(f.clock.Now()) {
			return poll.Success()
		}
		return poll.Continue("renewal of %s not observed yet", name)
	})
}

func TestLostAfterFortySecondsWithoutHeartbeat(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch.Add(-time.Hour)))

	f.clock.Step(39 * time.Second)
	assert.Equal(t, f.sync("a"), time.Second)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)

	f.clock.Step(time.Second)
	assert.Equal(t, f.sync("a"), time.Duration(0))
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.MachinesLost.WithLabelValues("lab")), 1.0)
	ev := <-f.recorder.Events
	assert.Assert(t, is.Contains(ev, "Warning MachineLost Machine a sent no heartbeat (Lease liken-system/a) for 40s"))

	// Lost stays Lost until the machine writes its own phase.
	f.clock.Step(time.Minute)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
}

func TestSilent(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a"), tu.Machine("b")}, lease("a", tu.Epoch))
	f.clock.Step(30 * time.Second)
	f.renew("a")
	now := tu.Epoch.Add(40 * time.Second)
	assert.Assert(t, !f.ctrl.Silent("a", now), "renewed 10 s ago")
	assert.Assert(t, f.ctrl.Silent("b", now), "no Lease since the start, 40 s ago")
	assert.Assert(t, !f.ctrl.Silent("b", now.Add(-time.Nanosecond)))
	assert.Assert(t, f.ctrl.Silent("a", tu.Epoch.Add(70*time.Second)))
}

func TestInitialListCountsFromTheStartOfLeadership(t *testing.T) {
	// The lists arrive 300 ms after leading started: a silent machine is
	// still silent exactly 40 s after the start, when the grace ends.
	f := newFixtureListedAfter(t, 300*time.Millisecond, []runtime.Object{tu.Cluster("lab"), tu.Machine("a"), tu.Machine("b")},
		lease("a", tu.Epoch.Add(-time.Hour)))
	end := tu.Epoch.Add(DefaultLostAfter)
	assert.Assert(t, f.ctrl.Silent("a", end))
	assert.Assert(t, f.ctrl.Silent("b", end))
	assert.Assert(t, !f.ctrl.Silent("a", end.Add(-time.Millisecond)))
	f.clock.SetTime(end)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
}

func TestRenewalsKeepAMachineAlive(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch))
	for range 5 {
		f.clock.Step(30 * time.Second)
		f.renew("a")
		assert.Equal(t, f.sync("a"), 40*time.Second)
	}
	f.clock.Step(39 * time.Second)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
	f.clock.Step(time.Second)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
}

func TestMachineWithoutLeaseIsLostFortySecondsAfterStart(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")})
	f.clock.Step(39 * time.Second)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
	f.clock.Step(time.Second)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
}

func TestRenewalNotYetDeliveredIsNotMissed(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch))
	f.clock.Step(45 * time.Second)
	// The machine renewed, but the informer has not delivered it.
	_, err := f.reader.CoordinationV1().Leases(likenv1.SystemNamespace).Update(f.ctx, lease("a", f.clock.Now()), metav1.UpdateOptions{})
	assert.NilError(t, err)
	assert.Equal(t, f.sync("a"), 40*time.Second)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
}

func TestFencedCopyWritesNoVerdict(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")})
	f.fenceErr = leadership.ErrNotLeader
	f.clock.Step(time.Minute)
	_, err := f.ctrl.Sync(f.ctx, "a")
	assert.Assert(t, errors.Is(err, leadership.ErrNotLeader))
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
}

func TestMachineAppearingLateIsJudgedFromThen(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab")})
	f.clock.Step(time.Minute)
	_, err := f.liken.LikenV1alpha1().Machines().Create(f.ctx, tu.Machine("late"), metav1.CreateOptions{})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, ok := f.ctrl.LastSeen("late"); ok {
			return poll.Success()
		}
		return poll.Continue("machine not observed")
	})
	assert.Equal(t, f.sync("late"), 40*time.Second)
	assert.Assert(t, !strings.Contains(string(f.phase("late")), "Lost"))
}
