package turns

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	tu "liken.sh/liken/controllers/internal/testutil"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

type fixture struct {
	t        *testing.T
	client   *likenfake.Clientset
	ctrl     *Controller
	clusters likeninformers.SharedInformerFactory
	recorder *tu.Recorder
	metrics  *metrics.Metrics
	clock    *clocktesting.FakeClock
	fenceErr error
	// newController makes another copy's controller on the same
	// informers (f.ctrl is the first copy's).
	newController func(term leadership.Term, w StatusWriter) *Controller
}

// fixtureTerm is the leadership term of the fixture's controller, already
// recorded in its Clusters.
const fixtureTerm = "1/op-1"

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{t: t, recorder: &tu.Recorder{}, metrics: metrics.New(), clock: clocktesting.NewFakeClock(after)}
	var likenObjs, kubeObjs []runtime.Object
	for _, o := range objs {
		switch o := o.(type) {
		case *likenv1.Cluster:
			// This copy's term is recorded: its first sync decides.
			o.Status.Term = fixtureTerm
			likenObjs = append(likenObjs, o)
		case *likenv1.Machine:
			likenObjs = append(likenObjs, o)
		default:
			kubeObjs = append(kubeObjs, o)
		}
	}
	f.client = likenfake.NewSimpleClientset(likenObjs...)
	tu.OptimisticUpdates(f.client, "clusters")
	kube := kubefake.NewClientset(kubeObjs...)
	f.clusters = likeninformers.NewSharedInformerFactory(f.client, 0)
	kf := kubeinformers.NewSharedInformerFactory(kube, 0)
	pods := NewPodInformer(kube)
	f.newController = func(term leadership.Term, w StatusWriter) *Controller {
		ctrl, err := New(Config{
			Clusters:     f.clusters.Liken().V1alpha1().Clusters(),
			Machines:     f.clusters.Liken().V1alpha1().Machines(),
			Nodes:        kf.Core().V1().Nodes(),
			Pods:         pods,
			Budgets:      kf.Policy().V1().PodDisruptionBudgets(),
			Copies:       kf.Apps().V1().Deployments(),
			Writer:       w,
			Recorder:     f.recorder,
			Metrics:      f.metrics,
			Clock:        f.clock,
			Term:         term,
			StartupGrace: 40 * time.Second,
		})
		assert.NilError(t, err)
		return ctrl
	}
	f.ctrl = f.newController(leadership.Term{Identity: "op-1", Since: tu.Epoch, Token: fixtureTerm,
		Fence: leadership.FenceFunc(func(context.Context, string) error { return f.fenceErr })}, f.client.LikenV1alpha1().Clusters())
	for _, o := range likenObjs {
		switch o := o.(type) {
		case *likenv1.Cluster:
			assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Add(o))
		case *likenv1.Machine:
			assert.NilError(t, f.clusters.Liken().V1alpha1().Machines().Informer().GetIndexer().Add(o))
		}
	}
	for _, o := range kubeObjs {
		switch o := o.(type) {
		case *corev1.Pod:
			trimmed, err := TrimPod(o)
			assert.NilError(t, err)
			assert.NilError(t, pods.GetIndexer().Add(trimmed))
		case *policyv1.PodDisruptionBudget:
			assert.NilError(t, kf.Policy().V1().PodDisruptionBudgets().Informer().GetIndexer().Add(o))
		case *appsv1.Deployment:
			assert.NilError(t, kf.Apps().V1().Deployments().Informer().GetIndexer().Add(o))
		default:
			assert.NilError(t, kf.Core().V1().Nodes().Informer().GetIndexer().Add(o))
		}
	}
	return f
}

// stored is the Cluster as the API server holds it.
func (f *fixture) stored(name string) *likenv1.Cluster {
	f.t.Helper()
	c, err := f.client.LikenV1alpha1().Clusters().Get(context.Background(), name, metav1.GetOptions{})
	assert.NilError(f.t, err)
	return c
}

// refresh makes the informer cache catch up with the API server.
func (f *fixture) refresh(name string) {
	f.t.Helper()
	assert.NilError(f.t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(f.stored(name)))
}

// setMachine replaces a machine in the informer cache.
func (f *fixture) setMachine(m *likenv1.Machine) {
	f.t.Helper()
	assert.NilError(f.t, f.clusters.Liken().V1alpha1().Machines().Informer().GetIndexer().Update(m))
}

func (f *fixture) updates() int {
	n := 0
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "update" {
			n++
		}
	}
	return n
}

// events are the events recorded since the last call, each with the
// object it is about ("Machine/a Normal TurnGranted ...").
func (f *fixture) events() []string { return f.recorder.Take() }

func TestControllerGrantsWithTheResourceVersionItRead(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease),
		tu.Machine("other", tu.InCluster("elsewhere"), tu.WantsRelease),
		tu.Node("a", true), tu.Node("b", true))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)

	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "a")
	assert.Equal(t, c.ResourceVersion, "2")
	assert.Equal(t, c.Status.RebootTurns[0].Change, "change-a")
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.TurnsGranted.WithLabelValues("lab", "Release")), 1.0)
	assert.Equal(t, promtestutil.CollectAndCount(f.metrics.GrantLatency), 1)
	evs := f.events()
	assert.Equal(t, len(evs), 1, "one event per occurrence, on the Machine: %v", evs)
	assert.Assert(t, is.Contains(evs[0], "Machine/a Normal TurnGranted Granted a Release turn to machine a"))

	// Nothing changed: no write.
	f.refresh("lab")
	before := f.updates()
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), before)
}

func TestControllerConflictDecidesAgain(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease))
	// Another copy recorded a turn for b after this copy's cache was filled.
	other := f.stored("lab")
	other.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("b", likenv1.TurnRelease, false, after)}
	other.Status.Turns = "b"
	_, err := f.client.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), other, metav1.UpdateOptions{})
	assert.NilError(t, err)

	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.Assert(t, err != nil, "a write from a stale read must fail")
	assert.Assert(t, apierrors.IsConflict(errors.Unwrap(err)), "%v", err)
	assert.Equal(t, f.stored("lab").Status.Turns, "b", "the stale grant added no turn")
	assert.Equal(t, len(f.events()), 0)

	// With the newer version read, the budget is full: no grant.
	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "b")
}

func TestControllerFencedCopyDoesNotGrant(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2)), tu.Machine("a", tu.WantsRelease))
	f.fenceErr = leadership.ErrNotLeader
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.Assert(t, errors.Is(err, leadership.ErrNotLeader))
	assert.Equal(t, f.updates(), 0)
}

func TestControllerStartupGraceRequeues(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2)), tu.Machine("a", tu.WantsRelease))
	f.clock.SetTime(tu.Epoch.Add(10 * time.Second))
	after, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, after, 30*time.Second)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "")
	f.refresh("lab")

	f.clock.SetTime(tu.Epoch.Add(40 * time.Second))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "a")
}

// Outside its window a Cluster is written once (Progressing says when the
// window opens), keeps its phase, and Sync asks to run again when the
// window opens; run then, it grants.
func TestControllerWaitsForTheWindow(t *testing.T) {
	// now is Monday 11:00 UTC; the window opens at 11:30 UTC.
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(tu.Window("Mon", "11:30", time.Hour, "UTC"))),
		tu.Machine("a", tu.WantsRelease), tu.Node("a", true))
	requeue, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, requeue, 30*time.Minute)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "")
	assert.Equal(t, c.Status.Phase, likenv1.ClusterUpdating)
	p := meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing)
	assert.Equal(t, p.Reason, likenv1.ReasonOutsideWindow)
	assert.Assert(t, is.Contains(p.Message, "the next opens Mon 2026-11-30 11:30 UTC"))

	// Until it opens, a sync writes nothing: the message holds no clock.
	f.refresh("lab")
	writes := f.updates()
	f.clock.Step(29 * time.Minute)
	requeue, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, requeue, time.Minute)
	assert.Equal(t, f.updates(), writes)

	f.clock.Step(requeue)
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	c = f.stored("lab")
	assert.Equal(t, c.Status.Turns, "a")
	assert.Equal(t, c.Status.Phase, likenv1.ClusterUpdating)
	assert.Equal(t, meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing).Reason, likenv1.ReasonGranting)
}

// A window the operator cannot read stops every grant, and says so once in
// a warning event.
func TestControllerInvalidWindowWarns(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Windows(tu.Window("Sat", "22:00", 4*time.Hour, "Europe/Berln"))),
		tu.Machine("a", tu.WantsRelease), tu.Node("a", true))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "")
	assert.Equal(t, meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing).Reason, likenv1.ReasonInvalidWindow)
	evs := f.events()
	assert.Equal(t, len(evs), 1, "%v", evs)
	assert.Assert(t, is.Contains(evs[0], `Warning InvalidWindow No turn is granted: cluster-operator cannot tell when the maintenance windows are open`))
	assert.Assert(t, is.Contains(evs[0], `spec.disruption.windows[0].timeZone: Invalid value: "Europe/Berln"`))

	// Once is enough: the next sync sees the same condition.
	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, len(f.events()), 0)
}

func TestControllerEventsForEndings(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0"), tu.Turns(
			tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Minute)),
			tu.Turn("b", likenv1.TurnRelease, false, after.Add(-time.Minute)),
			tu.Turn("gone", likenv1.TurnRelease, false, after.Add(-time.Minute)))),
		tu.Machine("a", tu.FinishedOn(tu.Version2)),
		tu.Machine("b", tu.WantsRelease, tu.TrialFailed))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	evs := f.events()
	all := strings.Join(evs, "\n")
	// Each machine's own turn events on its Machine (on the Cluster for a
	// Machine that is gone), the halt on the Cluster: one event each.
	for _, want := range []string{"Machine/a Normal TurnFinished", "Machine/a Normal TrialSucceeded", "Machine/b Warning TrialFailed",
		"Cluster/lab Normal TurnTakenBack Took back the turn of machine gone", "Cluster/lab Warning TrialFailed Halted the rollout (TrialFailed, machine b)"} {
		assert.Assert(t, is.Contains(all, want))
	}
	assert.Equal(t, len(evs), 5, "%v", evs)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Halt.Reason, likenv1.ReasonTrialFailed)
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.RolloutHalted.WithLabelValues("lab", "TrialFailed")), 1.0)
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.TurnsEnded.WithLabelValues("lab", "TakenBack")), 1.0)
}

// The reactor is what makes the conflict test meaningful: check it.
func TestOptimisticUpdatesReactor(t *testing.T) {
	client := likenfake.NewSimpleClientset(tu.Cluster("lab"))
	tu.OptimisticUpdates(client, "clusters")
	c := tu.Cluster("lab")
	c.ResourceVersion = "7"
	_, err := client.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsConflict(err), "%v", err)
	c.ResourceVersion = "1"
	got, err := client.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	assert.Equal(t, got.ResourceVersion, "2")
}

func TestControllerWritesLedgerAndColumnsTogether(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.WantsRelease, tu.Leader), tu.Machine("b", tu.WantsRelease),
		tu.Node("a", true), tu.Node("b", true))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 1, "one write carries the grant and the columns")
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "a")
	assert.Equal(t, c.Status.Phase, likenv1.ClusterUpdating)
	assert.Equal(t, c.Status.Machines, "0/2")
	assert.DeepEqual(t, c.Status.Leaders, []string{"a"})
	assert.Equal(t, c.Status.Endpoint, "https://10.0.0.1:6443")
	assert.Equal(t, c.Status.Releases.Newest, tu.Version2)
	assert.Equal(t, c.Status.ObservedGeneration, int64(1))
	ready := meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionReady)
	assert.Assert(t, ready != nil)
	assert.Equal(t, ready.Reason, ReasonMachinesNotReady)
	assert.Equal(t, meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing).Reason, likenv1.ReasonGranting)
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.Machines.WithLabelValues("lab", "UpdatePending")), 2.0)
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.Machines.WithLabelValues("lab", "Ready")), 0.0)

	// The machine takes its turn: only the columns change (the turn stays),
	// and they are written.
	f.refresh("lab")
	f.setMachine(tu.Machine("a", tu.WantsRelease, tu.Leader, tu.Phase(likenv1.MachineUpdating)))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 2)
	ready = meta.FindStatusCondition(f.stored("lab").Status.Conditions, likenv1.ConditionReady)
	assert.Assert(t, is.Contains(ready.Message, "a (Updating, runs 2026.11.01-001)"))
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.Machines.WithLabelValues("lab", "Updating")), 1.0)

	// It finishes, its kubelet back: the turn ends and the columns follow
	// in the same write.
	f.refresh("lab")
	f.setMachine(tu.Machine("a", tu.Leader, tu.FinishedOn(tu.Version2)))
	assert.NilError(t, f.ctrl.nodes.Update(tu.Node("a", true, tu.Heartbeat(after.Add(time.Second)))))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 3)
	c = f.stored("lab")
	assert.Equal(t, c.Status.Turns, "b")
	assert.Equal(t, c.Status.Machines, "1/2")

	// Deleted: the metric goes.
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Delete(c))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, promtestutil.CollectAndCount(f.metrics.Machines), 0)
}

func TestControllerColumnsMoveWhileNothingIsGranted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cluster *likenv1.Cluster
		now     time.Time
		reason  string
	}{
		{name: "startup grace", cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2)), now: tu.Epoch.Add(10 * time.Second), reason: likenv1.ReasonStartupGrace},
		{name: "paused", cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0")), now: after, reason: likenv1.ReasonPaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.cluster, tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.Phase(likenv1.MachineDownloading)))
			f.clock.SetTime(tc.now)
			_, err := f.ctrl.sync(context.Background(), "lab")
			assert.NilError(t, err)
			c := f.stored("lab")
			assert.Equal(t, c.Status.Turns, "")
			assert.Equal(t, c.Status.Machines, "0/2")
			assert.Equal(t, meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing).Reason, tc.reason)

			// b stages too: the Ready condition and counts move, nothing
			// is granted.
			f.refresh("lab")
			f.setMachine(tu.Machine("b", tu.WantsRelease))
			f.clock.Step(ColumnsEvery)
			_, err = f.ctrl.sync(context.Background(), "lab")
			assert.NilError(t, err)
			c = f.stored("lab")
			assert.Equal(t, c.Status.Turns, "")
			assert.Assert(t, is.Contains(meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionReady).Message, "b (UpdatePending"))
		})
	}
}

func TestControllerFenceGuardsLedgerWritesNotColumns(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0")),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b"))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	f.refresh("lab")
	f.fenceErr = leadership.ErrNotLeader

	// Only a column changes: written without the lease, the ledger as read.
	f.setMachine(tu.Machine("b", tu.Phase(likenv1.MachineDownloading)))
	f.clock.Step(ColumnsEvery)
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 2)
	assert.Assert(t, is.Contains(meta.FindStatusCondition(f.stored("lab").Status.Conditions, likenv1.ConditionReady).Message, "b (Downloading"))

	// A grant (the budget opens) needs the lease: nothing is written.
	f.refresh("lab")
	c := f.stored("lab")
	c.Spec.Disruption = tu.Cluster("lab").Spec.Disruption
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(c))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.Assert(t, errors.Is(err, leadership.ErrNotLeader), "%v", err)
	assert.Assert(t, is.Contains(err.Error(), "granting turns to a in cluster lab"))
	assert.Equal(t, f.updates(), 2)
}

// TestControllerGrantOrder: whatever order the informer index holds the
// machines in, turns go to a leader first, then to the workers in byte
// order of their names, and the order holds from one sync to the next as
// machines come and go.
func TestControllerGrantOrder(t *testing.T) {
	names := []string{"node-10", "node-2", "Node-3", "node-1-a", "node-1", "node-", "a", "node-0", "z", "node-20"}
	objs := []runtime.Object{tu.Cluster("lab", tu.MaxUnavailable("100%"))}
	for _, n := range names {
		objs = append(objs, tu.Machine(n, tu.WantsReboot))
	}
	objs = append(objs, tu.Machine("leader-b", tu.Leader, tu.WantsReboot), tu.Machine("leader-a", tu.Leader, tu.WantsReboot))
	f := newFixture(t, objs...)
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "leader-a,Node-3,a,node-,node-0,node-1,node-1-a,node-10,node-2,node-20,z")

	// The first worker finishes, one machine is deleted and two join: the
	// newcomers get their turns in byte order after the ledger's.
	f.refresh("lab")
	f.setMachine(tu.Machine("Node-3", tu.FinishedOn(tu.Version1)))
	assert.NilError(t, f.clusters.Liken().V1alpha1().Machines().Informer().GetIndexer().Delete(tu.Machine("z")))
	assert.NilError(t, f.clusters.Liken().V1alpha1().Machines().Informer().GetIndexer().Add(tu.Machine("node-11", tu.WantsReboot)))
	assert.NilError(t, f.clusters.Liken().V1alpha1().Machines().Informer().GetIndexer().Add(tu.Machine("b", tu.WantsReboot)))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "leader-a,a,node-,node-0,node-1,node-1-a,node-10,node-2,node-20,b,node-11")
}

// grantLatencySum is the sum of the grant latencies observed for cluster.
func (f *fixture) grantLatencySum() (float64, uint64) {
	f.t.Helper()
	mfs, err := f.metrics.Registry.Gather()
	assert.NilError(f.t, err)
	for _, mf := range mfs {
		if mf.GetName() == "liken_operator_grant_latency_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), h.GetSampleCount()
		}
	}
	return 0, 0
}

func TestControllerGrantLatencyCountsFromTheCurrentChange(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0")),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	f.refresh("lab")

	// a stages another change 5 s later: its wait starts again; b stops
	// waiting, then waits again 6 s later.
	f.clock.Step(5 * time.Second)
	f.setMachine(tu.Machine("a", tu.WantsRelease, tu.Change("change-a2")))
	f.setMachine(tu.Machine("b", tu.Phase(likenv1.MachineDownloading)))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	f.refresh("lab")
	f.clock.Step(1 * time.Second)
	f.setMachine(tu.Machine("b", tu.WantsRelease))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	f.refresh("lab")

	// The budget opens 2 s later: a waited 3 s, b 2 s.
	f.clock.Step(2 * time.Second)
	c := f.stored("lab")
	c.Spec.Disruption = tu.Cluster("lab", tu.MaxUnavailable("2")).Spec.Disruption
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(c))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "a,b")
	sum, n := f.grantLatencySum()
	assert.Equal(t, n, uint64(2))
	assert.Equal(t, sum, 5.0)
}

// A sync that comes before this copy's own last write reached the cache
// decides from what that write returned, not from the version it
// replaced: no conflict, no backoff.
func TestControllerDecidesFromItsOwnWriteBeforeTheCacheHasIt(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("1")),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "a")

	// a takes its turn and finishes before the cache shows the grant.
	f.setMachine(tu.Machine("a", tu.FinishedOn(tu.Version2)))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "b")
	assert.Equal(t, c.ResourceVersion, "3")
	assert.Equal(t, promtestutil.ToFloat64(f.metrics.TurnsEnded.WithLabelValues("lab", "Finished")), 1.0)

	// Another writer changes the Cluster after that: the write from the
	// stale view is refused, as always.
	other := f.stored("lab")
	other.Status.Releases.Available = tu.Version2
	_, err = f.client.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), other, metav1.UpdateOptions{})
	assert.NilError(t, err)
	f.setMachine(tu.Machine("b", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)))
	f.clock.Step(ColumnsEvery)
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.Assert(t, apierrors.IsConflict(errors.Unwrap(err)), "%v", err)

	// Once the cache has the newer version, the decision goes through.
	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Releases.Available, tu.Version2)
}

// A cordon a person set is not liken's: the machine leaves it in place, so
// it must not hold the turn (a turn that never ends would stall the whole
// rollout). liken's own cordon still does, until the machine lifts it.
func TestControllerTurnEndsOnANodeAPersonCordoned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     func(*corev1.Node)
		finished bool
	}{
		{name: "cordoned by a person", node: tu.CordonedByPerson, finished: true},
		{name: "cordoned by liken", node: tu.Cordoned, finished: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t,
				tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(
					tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Minute)))),
				tu.Machine("a", tu.FinishedOn(tu.Version2)),
				tu.Node("a", true, tc.node, tu.Heartbeat(after)))
			_, err := f.ctrl.sync(context.Background(), "lab")
			assert.NilError(t, err)
			c := f.stored("lab")
			assert.Equal(t, len(c.Status.RebootTurns) == 0, tc.finished, "ledger: %v", c.Status.RebootTurns)
			assert.Equal(t, strings.Contains(strings.Join(f.events(), "\n"), "Normal TurnFinished"), tc.finished)
		})
	}
}

// A copy that becomes the leader finds a halt an earlier copy wrote: its
// metric must say so at once (an alert on it must not clear at a
// failover), and go back to 0 when the halt is lifted.
func TestControllerHaltMetricAfterFailover(t *testing.T) {
	halted := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	halted.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonTrialFailed, Machine: "a", Version: tu.Version2,
		Since: metav1.NewTime(after.Add(-time.Hour))}
	f := newFixture(t, halted, tu.Machine("a", tu.WantsRelease, tu.TrialFailed), tu.Machine("b", tu.WantsRelease))
	gauge := func(reason string) float64 {
		return promtestutil.ToFloat64(f.metrics.RolloutHalted.WithLabelValues("lab", reason))
	}
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, gauge(likenv1.ReasonTrialFailed), 1.0)
	assert.Equal(t, gauge(likenv1.ReasonRolloutStalled), 0.0)

	f.refresh("lab")
	c := f.stored("lab")
	c.Spec.Version = tu.Version1 // a new spec.version lifts the halt
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(c))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Assert(t, f.stored("lab").Status.Halt == nil)
	assert.Equal(t, gauge(likenv1.ReasonTrialFailed), 0.0)
}

// TestMachineChangedWakesItsCluster: the liveness controller wakes the
// decision of a machine's Cluster when a silent machine renews its Node
// Lease again, a change the turn controller's own informers do not show.
func TestMachineChangedWakesItsCluster(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab"), tu.Machine("a"))
	f.ctrl.MachineChanged("unknown")
	assert.Equal(t, f.ctrl.queue.Len(), 0)
	f.ctrl.MachineChanged("a")
	assert.Equal(t, f.ctrl.queue.Len(), 1)
}

// A leader's turn ends only once its Node shows the kubelet of the new
// boot: Kubernetes keeps a silent Node Ready for about 40 s, and ending
// the turn on that Ready would let the next leader go down while this
// one's datastore member is not back.
func TestControllerLeaderTurnEndsWhenItsNodeIsBack(t *testing.T) {
	granted := after.Add(-time.Minute)
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3"), tu.Turns(tu.Turn("l1", likenv1.TurnRelease, true, granted))),
		tu.Machine("l1", tu.Leader, tu.FinishedOn(tu.Version2)),
		tu.Machine("l2", tu.Leader, tu.WantsRelease),
		tu.Node("l1", true, tu.Heartbeat(granted.Add(-5*time.Second)), tu.NodeBootID("boot-1-l1")),
		tu.Node("l2", true, tu.Heartbeat(granted)))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "l1", "the turn ended on a Node Ready from before the reboot")

	// The kubelet of the new boot posts Ready.
	f.refresh("lab")
	n := tu.Node("l1", true, tu.Heartbeat(after), tu.NodeBootID("boot-2-l1"))
	assert.NilError(t, f.ctrl.nodes.Update(n))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "l2")
	assert.Assert(t, is.Contains(strings.Join(f.events(), "\n"), "Normal TrialSucceeded Machine l1 proved release "+tu.Version2))
}

// Events carry at most 1024 bytes of note: a machine's long TrialFailed
// text is clipped, not refused by the API server.
func TestControllerEventNotesAreBounded(t *testing.T) {
	b := tu.Machine("b", tu.WantsRelease, tu.TrialFailed)
	b.Status.Conditions[0].Message = strings.Repeat("x", 32<<10)
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Turns(tu.Turn("b", likenv1.TurnRelease, false, after.Add(-time.Minute)))), b)
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	evs := f.events()
	assert.Assert(t, len(evs) > 0)
	for _, e := range evs {
		_, note, _ := strings.Cut(e, " ")   // type
		_, note, _ = strings.Cut(note, " ") // reason
		assert.Assert(t, len(note) <= 1024, "event note of %d bytes: %.80s", len(note), e)
	}
}

// heldLiveness records when the decision asks about silence, and whether
// it holds Lost verdicts back while it does.
type heldLiveness struct {
	held   bool
	silent map[string]bool
	log    []string
}

func (l *heldLiveness) Hold() func() {
	l.held = true
	l.log = append(l.log, "hold")
	return func() { l.held = false; l.log = append(l.log, "release") }
}

func (l *heldLiveness) Silent(name string, _ time.Time) bool {
	if !l.held {
		l.log = append(l.log, "UNHELD "+name)
	}
	return l.silent[name]
}

// TestControllerReadsSilenceUnderTheLivenessHold: the decision asks which
// machines are silent while Lost verdicts are held back, and counts a
// silent machine as down: with maxUnavailable 1 and b silent, nothing is
// granted.
func TestControllerReadsSilenceUnderTheLivenessHold(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease),
		tu.Node("a", true), tu.Node("b", true))
	live := &heldLiveness{silent: map[string]bool{"b": true}}
	f.ctrl.cfg.Liveness = live
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.DeepEqual(t, live.log, []string{"hold", "release"})
	assert.Equal(t, f.stored("lab").Status.Turns, "")

	live.silent = nil
	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "a")
}

// TestControllerDeletedMachineHoldsItsTurnWhileItsNodeIsDown: the
// controller reads the Node of a machine whose Machine was deleted during
// its turn, keeps the turn while that Node is down, and gives the place to
// the next machine once the Node is gone.
func TestControllerDeletedMachineHoldsItsTurnWhileItsNodeIsDown(t *testing.T) {
	granted := after.Add(-time.Minute)
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("1"), tu.Turns(tu.Turn("w1", likenv1.TurnRelease, false, granted))),
		tu.Machine("w2", tu.WantsRelease),
		tu.Node("w1", false, tu.Heartbeat(granted), tu.NodeBootID("boot-1-w1")),
		tu.Node("w2", true, tu.Heartbeat(granted)))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "w1", "the deleted machine's turn ended while its Node was down")

	f.refresh("lab")
	n, _, err := f.ctrl.nodes.GetByKey("w1")
	assert.NilError(t, err)
	assert.NilError(t, f.ctrl.nodes.Delete(n))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Turns, "w2")
	assert.Assert(t, is.Contains(strings.Join(f.events(), "\n"), "Took back the turn of machine w1: the Machine was deleted, and it has no Node"))
}

// pausedWriter holds a write back until released, as a copy paused
// between its lease confirmation and its write.
type pausedWriter struct {
	StatusWriter
	paused, release chan struct{}
}

func (w *pausedWriter) UpdateStatus(ctx context.Context, c *likenv1.Cluster, opts metav1.UpdateOptions) (*likenv1.Cluster, error) {
	close(w.paused)
	<-w.release
	return w.StatusWriter.UpdateStatus(ctx, c, opts)
}

// TestPausedLeaderAddsNoTurn: the leading copy reads the Cluster while
// machine a asks for a turn, confirms its lease and pauses right before
// it writes the grant. Meanwhile a's need went away, and another copy
// takes the lease: the status it would decide is the one stored, so only
// its term makes it write, before anything else. The paused copy's write
// then conflicts: the grant it decided on what it saw before adds no turn.
func TestPausedLeaderAddsNoTurn(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Node("a", true))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	f.refresh("lab")
	ready := f.stored("lab")
	assert.Equal(t, ready.Status.Turns, "")

	// The first copy sees a asking, decides to grant it, and pauses.
	f.setMachine(tu.Machine("a", tu.WantsRelease))
	w := &pausedWriter{StatusWriter: f.client.LikenV1alpha1().Clusters(), paused: make(chan struct{}), release: make(chan struct{})}
	old := f.newController(leadership.Term{Identity: "op-1", Since: tu.Epoch, Token: fixtureTerm, Fence: leadership.Always}, w)
	done := make(chan error)
	go func() {
		_, err := old.sync(context.Background(), "lab")
		done <- err
	}()
	<-w.paused

	// a no longer asks; the next copy decides what is stored already.
	f.setMachine(tu.Machine("a", tu.FinishedOn(tu.Version2)))
	next := f.newController(leadership.Term{Identity: "op-2", Since: tu.Epoch, Token: "2/op-2", Fence: leadership.Always}, f.client.LikenV1alpha1().Clusters())
	_, err = next.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.stored("lab").Status.Term, "2/op-2")

	close(w.release)
	err = <-done
	assert.Assert(t, apierrors.IsConflict(errors.Unwrap(err)), "the paused copy's grant was written: %v", err)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "", "a turn decided before the new term was added")
	assert.Equal(t, c.Status.Term, "2/op-2")
}

// TestNewTermIsWrittenBeforeTheFirstDecision: a copy that starts leading
// writes its term alone, then decides from what it wrote, in one sync.
func TestNewTermIsWrittenBeforeTheFirstDecision(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("a", tu.WantsRelease), tu.Node("a", true))
	next := f.newController(leadership.Term{Identity: "op-2", Since: tu.Epoch, Token: "2/op-2", Fence: leadership.Always}, f.client.LikenV1alpha1().Clusters())
	_, err := next.sync(context.Background(), "lab")
	assert.NilError(t, err)
	var writes []likenv1.ClusterStatus
	for _, a := range f.client.Actions() {
		if u, ok := a.(clienttesting.UpdateAction); ok && a.GetSubresource() == "status" {
			writes = append(writes, u.GetObject().(*likenv1.Cluster).Status)
		}
	}
	assert.Equal(t, len(writes), 2, "%+v", writes)
	assert.Equal(t, writes[0].Term, "2/op-2")
	assert.Equal(t, writes[0].Turns, "", "the term's write decides nothing")
	assert.Equal(t, writes[1].Turns, "a")
	assert.Equal(t, writes[1].Term, "2/op-2")
}

// TestColumnsWaitForASecondAfterAWrite: a change of the columns alone is
// written no sooner than ColumnsEvery after the Cluster's last write (the
// sync asks to come back then), while a grant is written at once: a grant
// never waits behind a write of counts.
func TestColumnsWaitForASecondAfterAWrite(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("0")),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b"), tu.Machine("c"))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 1)
	f.refresh("lab")

	// b downloads 300 ms later: its count waits for the rest of the second.
	f.clock.Step(300 * time.Millisecond)
	f.setMachine(tu.Machine("b", tu.Phase(likenv1.MachineDownloading)))
	requeue, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 1, "a write of the columns alone 300 ms after the last write")
	assert.Equal(t, requeue, 700*time.Millisecond)

	// The budget opens 100 ms later: the grant is written at once, the
	// columns with it.
	f.clock.Step(100 * time.Millisecond)
	c := f.stored("lab")
	c.Spec.Disruption = tu.Cluster("lab", tu.MaxUnavailable("1")).Spec.Disruption
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(c))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 2)
	c = f.stored("lab")
	assert.Equal(t, c.Status.Turns, "a")
	assert.Assert(t, is.Contains(meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionReady).Message, "b (Downloading"))
	f.refresh("lab")

	// c downloads: its count is written once a second has passed since.
	f.setMachine(tu.Machine("c", tu.Phase(likenv1.MachineDownloading)))
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 2)
	f.clock.Step(ColumnsEvery)
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	assert.Equal(t, f.updates(), 3)
	assert.Assert(t, is.Contains(meta.FindStatusCondition(f.stored("lab").Status.Conditions, likenv1.ConditionReady).Message, "c (Downloading"))
}
