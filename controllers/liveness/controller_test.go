package liveness

import (
	"context"
	"errors"
	"strings"
	"sync"
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
	k8stesting "k8s.io/client-go/testing"
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
	// onFence runs when the controller confirms its lease, just before
	// it writes a verdict.
	onFence func()

	mu        sync.Mutex
	recovered []string
}

// setup varies the fixture.
type setup struct {
	// listDelay: the informers start this long after this copy started
	// leading (at Epoch).
	listDelay time.Duration
	// lostAfter: DefaultLostAfter when 0.
	lostAfter time.Duration
}

func lease(name string, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: LeaseNamespace},
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
	return newFixtureWith(t, setup{}, likenObjs, leases...)
}

func newFixtureWith(t *testing.T, su setup, likenObjs []runtime.Object, leases ...*coordinationv1.Lease) *fixture {
	t.Helper()
	if su.lostAfter == 0 {
		su.lostAfter = DefaultLostAfter
	}
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
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(f.kube, 0, kubeinformers.WithNamespace(LeaseNamespace))
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
			Fence: leadership.FenceFunc(func(context.Context, string) error {
				if f.onFence != nil {
					f.onFence()
				}
				return f.fenceErr
			})},
		LostAfter: su.lostAfter,
		Recovered: func(name string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.recovered = append(f.recovered, name)
		},
	})
	assert.NilError(t, err)
	f.ctrl = ctrl
	f.clock.Step(su.listDelay)
	lf.Start(ctx.Done())
	kf.Start(ctx.Done())
	assert.Assert(t, cache.WaitFor(ctx, "", ctrl.synced...))
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
	after, err := f.ctrl.sync(f.ctx, name)
	assert.NilError(f.t, err)
	return after
}

// renew renews a Lease at the current time, as the machine would, and
// waits until the controller saw it.
func (f *fixture) renew(name string) {
	f.t.Helper()
	l := lease(name, f.clock.Now())
	for _, cs := range []*kubefake.Clientset{f.kube, f.reader} {
		_, err := cs.CoordinationV1().Leases(LeaseNamespace).Update(f.ctx, l, metav1.UpdateOptions{})
		assert.NilError(f.t, err)
	}
	poll.WaitOn(f.t, func(poll.LogT) poll.Result {
		if seen, _ := f.ctrl.LastSeen(name); seen.Equal(f.clock.Now()) {
			return poll.Success()
		}
		return poll.Continue("renewal of %s not observed yet", name)
	})
}

func (f *fixture) wokenFor() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.recovered...)
}

func TestLostWhenTheNodeLeaseStops(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lostAfter time.Duration
	}{
		{"fast setting", 2 * time.Second},
		{"default", DefaultLostAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixtureWith(t, setup{lostAfter: tc.lostAfter}, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")},
				lease("a", tu.Epoch.Add(-time.Hour)))
			f.clock.Step(tc.lostAfter - time.Millisecond)
			assert.Equal(t, f.sync("a"), time.Millisecond)
			assert.Equal(t, f.phase("a"), likenv1.MachineReady)

			f.clock.Step(time.Millisecond)
			assert.Equal(t, f.sync("a"), time.Duration(0))
			assert.Equal(t, f.phase("a"), likenv1.MachineLost)
			assert.Equal(t, promtestutil.ToFloat64(f.metrics.MachinesLost.WithLabelValues("lab")), 1.0)
			ev := <-f.recorder.Events
			assert.Assert(t, is.Contains(ev, "Warning MachineLost The Node Lease kube-node-lease/a of machine a was not renewed for "+tc.lostAfter.String()))

			// Lost stays Lost until the machine writes its own phase.
			f.clock.Step(time.Minute)
			f.sync("a")
			assert.Equal(t, f.phase("a"), likenv1.MachineLost)
		})
	}
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
	// The lists arrive 300 ms after leading started. When the Lease in the
	// list was renewed is unknown: the turn decision counts a silent
	// machine Lost exactly 40 s after the start, when the grace ends, and
	// the verdict is written 40 s after the list showed the Lease.
	f := newFixtureWith(t, setup{listDelay: 300 * time.Millisecond}, []runtime.Object{tu.Cluster("lab"), tu.Machine("a"), tu.Machine("b")},
		lease("a", tu.Epoch.Add(-time.Hour)))
	end := tu.Epoch.Add(DefaultLostAfter)
	assert.Assert(t, f.ctrl.Silent("a", end))
	assert.Assert(t, f.ctrl.Silent("b", end))
	assert.Assert(t, !f.ctrl.Silent("a", end.Add(-time.Millisecond)))
	f.clock.SetTime(end)
	assert.Equal(t, f.sync("a"), 300*time.Millisecond)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
	f.sync("b")
	assert.Equal(t, f.phase("b"), likenv1.MachineLost, "b has no Node Lease at all")
	f.clock.Step(300 * time.Millisecond)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
}

func TestLateFirstListWritesNoFalseLost(t *testing.T) {
	// The first list of Leases arrives 50 s after leading started, later
	// than the lost-after duration: the Lease it shows was renewed at some
	// time this copy does not know, so it is no evidence of silence.
	f := newFixtureWith(t, setup{listDelay: 50 * time.Second}, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")},
		lease("a", tu.Epoch.Add(49*time.Second)))
	assert.Equal(t, f.sync("a"), DefaultLostAfter)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
	// Until a renewal is seen, the turn decision counts it silent.
	assert.Assert(t, f.ctrl.Silent("a", f.clock.Now()))

	f.clock.Step(5 * time.Second)
	f.renew("a")
	assert.Assert(t, !f.ctrl.Silent("a", f.clock.Now()))
	assert.DeepEqual(t, f.wokenFor(), []string{"a"})
}

func TestSilentUntilTheLeasesAreListed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clocktesting.NewFakeClock(tu.Epoch)
	liken := likenfake.NewSimpleClientset(tu.Cluster("lab"), tu.Machine("a"))
	kube := kubefake.NewClientset(lease("a", tu.Epoch))
	lf := likeninformers.NewSharedInformerFactory(liken, 0)
	kf := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace(LeaseNamespace))
	ctrl, err := New(Config{
		Machines: lf.Liken().V1alpha1().Machines(), Clusters: lf.Liken().V1alpha1().Clusters(),
		Leases: kf.Coordination().V1().Leases(), LeaseReader: kube.CoordinationV1(), Writer: liken.LikenV1alpha1().Machines(),
		Recorder: events.NewFakeRecorder(10), Metrics: metrics.New(), Clock: clk,
		Term: leadership.Term{Identity: "op-1", Since: tu.Epoch}, LostAfter: DefaultLostAfter,
	})
	assert.NilError(t, err)
	assert.Assert(t, ctrl.Silent("a", tu.Epoch), "no Lease listed yet: no evidence that a is alive")
	lf.Start(ctx.Done())
	kf.Start(ctx.Done())
	// Until the Lease handler saw the first list, not only the cache.
	assert.Assert(t, cache.WaitFor(ctx, "", ctrl.synced...))
	assert.Assert(t, !ctrl.Silent("a", tu.Epoch))
}

func TestRenewalAfterSilenceWakesTheTurnDecision(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a"), tu.Machine("b")}, lease("a", tu.Epoch), lease("b", tu.Epoch))
	f.clock.Step(30 * time.Second)
	f.renew("a")
	f.renew("b")
	assert.Assert(t, is.Len(f.wokenFor(), 0), "renewals of live machines wake nothing")
	f.clock.Step(DefaultLostAfter + 5*time.Second)
	assert.Assert(t, f.ctrl.Silent("a", f.clock.Now()))
	f.renew("a")
	assert.DeepEqual(t, f.wokenFor(), []string{"a"})
	assert.Assert(t, !f.ctrl.Silent("a", f.clock.Now()))
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
	_, err := f.reader.CoordinationV1().Leases(LeaseNamespace).Update(f.ctx, lease("a", f.clock.Now()), metav1.UpdateOptions{})
	assert.NilError(t, err)
	assert.Equal(t, f.sync("a"), 40*time.Second)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
}

func TestFencedCopyWritesNoVerdict(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")})
	f.fenceErr = leadership.ErrNotLeader
	f.clock.Step(time.Minute)
	_, err := f.ctrl.sync(f.ctx, "a")
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

// TestRenewalDuringTheVerdictKeepsTheMachineDown: the Lease is renewed
// after the verdict read it stale and before the Lost write lands. From the
// read until the informer delivers the written Machine, a turn decision
// must not read the machine alive: either its cache shows Lost, or Silent
// says it is down.
func TestRenewalDuringTheVerdictKeepsTheMachineDown(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch))
	f.clock.Step(45 * time.Second)
	var duringRead []string
	f.onFence = func() {
		// The verdict read the Lease stale; the renewal reaches the
		// informer now, before the Lost write.
		_, err := f.kube.CoordinationV1().Leases(LeaseNamespace).Update(f.ctx, lease("a", f.clock.Now()), metav1.UpdateOptions{})
		assert.NilError(t, err)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if seen, _ := f.ctrl.LastSeen("a"); seen.Equal(f.clock.Now()) {
				return poll.Success()
			}
			return poll.Continue("renewal not observed")
		})
		m, err := f.ctrl.machines.Get("a")
		assert.NilError(t, err)
		if m.Status.Phase != likenv1.MachineLost && !f.ctrl.Silent("a", f.clock.Now()) {
			duringRead = append(duringRead, "alive in the cache and not silent while its Lost verdict is being written")
		}
	}
	assert.Equal(t, f.sync("a"), time.Duration(0))
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)
	assert.DeepEqual(t, duringRead, []string(nil))
	// The wake-up for the renewal came while the verdict was pending.
	assert.DeepEqual(t, f.wokenFor(), []string{"a"})

	// Until the cache shows Lost, the machine stays silent; after, the
	// cache says Lost, and the fresh renewal makes it not silent.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		release := f.ctrl.Hold()
		m, err := f.ctrl.machines.Get("a")
		silent := f.ctrl.Silent("a", f.clock.Now())
		release()
		assert.NilError(t, err)
		assert.Assert(t, m.Status.Phase == likenv1.MachineLost || silent, "a read alive while Lost was written")
		if m.Status.Phase == likenv1.MachineLost && !silent {
			return poll.Success()
		}
		return poll.Continue("cache shows %s, silent %v", m.Status.Phase, silent)
	})
}

// TestRenewalDeliveredDuringTheLeaseReadIsNotMissed: the informer delivers
// the renewal while the verdict reads the Lease, so the read shows what the
// controller already holds. The machine is alive: no Lost.
func TestRenewalDeliveredDuringTheLeaseReadIsNotMissed(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch))
	f.clock.Step(45 * time.Second)
	f.reader.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		renewed := lease("a", f.clock.Now())
		_, err := f.kube.CoordinationV1().Leases(LeaseNamespace).Update(f.ctx, renewed, metav1.UpdateOptions{})
		assert.NilError(t, err)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if seen, _ := f.ctrl.LastSeen("a"); seen.Equal(f.clock.Now()) {
				return poll.Success()
			}
			return poll.Continue("renewal not observed")
		})
		return true, renewed, nil
	})
	assert.Equal(t, f.sync("a"), DefaultLostAfter)
	assert.Equal(t, f.phase("a"), likenv1.MachineReady)
	assert.Assert(t, !f.ctrl.Silent("a", f.clock.Now()))
}

// TestOneVerdictPerSilence: a machine whose daemon writes its own phase
// again while its kubelet still renews nothing (a slow trial boot) is not
// written Lost again and again; it stays silent for the turns until a
// renewal ends the silence, and the next silence gets its own verdict.
func TestOneVerdictPerSilence(t *testing.T) {
	f := newFixture(t, []runtime.Object{tu.Cluster("lab"), tu.Machine("a")}, lease("a", tu.Epoch))
	f.clock.Step(45 * time.Second)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost)

	back := func() {
		m, err := f.liken.LikenV1alpha1().Machines().Get(f.ctx, "a", metav1.GetOptions{})
		assert.NilError(t, err)
		m.Status.Phase = likenv1.MachineUpdating
		_, err = f.liken.LikenV1alpha1().Machines().UpdateStatus(f.ctx, m, metav1.UpdateOptions{})
		assert.NilError(t, err)
	}
	back()
	f.clock.Step(time.Minute)
	assert.Equal(t, f.sync("a"), time.Duration(0))
	assert.Equal(t, f.phase("a"), likenv1.MachineUpdating, "written Lost twice in one silence")
	assert.Assert(t, f.ctrl.Silent("a", f.clock.Now()))
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.MachinesLost.WithLabelValues("lab")), 1.0)

	f.renew("a")
	assert.Assert(t, !f.ctrl.Silent("a", f.clock.Now()))
	f.clock.Step(DefaultLostAfter)
	f.sync("a")
	assert.Equal(t, f.phase("a"), likenv1.MachineLost, "a new silence gets its verdict")
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.MachinesLost.WithLabelValues("lab")), 2.0)
}
