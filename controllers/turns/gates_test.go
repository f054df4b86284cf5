package turns

import (
	"context"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	tu "liken.sh/liken/controllers/internal/testutil"
	"liken.sh/liken/controllers/promgate"
)

// heldBy sets the annotation liken.sh/hold to reason, written by manager
// at at, as the API server records it.
func heldBy(reason, manager string, at time.Time) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) {
		c.Annotations[likenv1.AnnotationHold] = reason
		t := metav1.NewTime(at)
		c.ManagedFields = append(c.ManagedFields,
			metav1.ManagedFieldsEntry{Manager: "kubectl-edit", Operation: metav1.ManagedFieldsOperationUpdate, Time: &t,
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:version":{}}}`)}},
			metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Time: &t,
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{"f:liken.sh/hold":{}}}}`)}})
	}
}

func TestHold(t *testing.T) {
	at := after.Add(-time.Hour)
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2"), heldBy("change freeze until Monday", "liken rollout hold by alice", at))
	c.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Minute))}
	d := Decide(input(c, []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}, nil))
	assert.Check(t, is.Len(d.Granted, 0))
	assert.Check(t, is.Equal(d.Status.Turns, "a"), "a turn granted before the hold goes on")
	p := progressing(t, d.Status)
	assert.Check(t, is.Equal(p.Status, metav1.ConditionFalse))
	assert.Check(t, is.Equal(p.Reason, likenv1.ReasonHeld))
	assert.Check(t, is.Equal(p.Message, `No turn is granted: the rollout is held (annotation liken.sh/hold): "change freeze until Monday", set by liken rollout hold by alice at `+
		at.UTC().Format(time.RFC3339)+". Turns granted before go on to their end: a. Machines go on downloading and staging. "+
		"To let turns start again, remove it: `liken rollout unhold lab` or `kubectl annotate cluster lab liken.sh/hold-`."))

	// Without the annotation, the same decision grants.
	delete(c.Annotations, likenv1.AnnotationHold)
	d = Decide(input(c, []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}, nil))
	assert.Check(t, is.DeepEqual(granted(d), []string{"b"}))
}

func TestHoldGivesWayToAHalt(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), heldBy("freeze", "kubectl-annotate", after), stalledOn("x"))
	c.Status.Halt.Reason, c.Status.Halt.Version = likenv1.ReasonTrialFailed, tu.Version2
	d := Decide(input(c, []*likenv1.Machine{tu.Machine("b", tu.WantsRelease)}, nil))
	assert.Check(t, is.Equal(progressing(t, d.Status).Reason, likenv1.ReasonTrialFailed), "a halt needs a person more than a hold does")
}

func TestBlockingPodsGate(t *testing.T) {
	blocked := map[string]Blocked{"a": {Gate: 1, Pods: []string{"shop/batch-1"}}}
	t.Run("the next machine takes the turn", func(t *testing.T) {
		in := input(tu.Cluster("lab", tu.TargetVersion(tu.Version2)), []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}, nil)
		in.Blocked = blocked
		d := Decide(in)
		assert.Check(t, is.DeepEqual(granted(d), []string{"b"}))
		assert.Check(t, is.DeepEqual(d.Gated, []Gated{{Machine: "a", Blocked: blocked["a"]}}))
		p := progressing(t, d.Status)
		assert.Check(t, is.Equal(p.Reason, likenv1.ReasonGranting))
		assert.Check(t, is.Contains(p.Message, "Passed over by a gate: a runs pod shop/batch-1 (spec.disruption.gates[1], blockingPods). Each gets its turn by itself once no such pod runs on it."))
	})
	t.Run("nothing moves: GateClosed", func(t *testing.T) {
		in := input(tu.Cluster("lab", tu.TargetVersion(tu.Version2)), []*likenv1.Machine{tu.Machine("a", tu.Leader, tu.WantsRelease), tu.Machine("b", tu.WantsRelease)}, nil)
		in.Blocked = blocked
		d := Decide(in)
		assert.Check(t, is.Len(d.Granted, 0))
		p := progressing(t, d.Status)
		assert.Check(t, is.Equal(p.Status, metav1.ConditionFalse))
		assert.Check(t, is.Equal(p.Reason, likenv1.ReasonGateClosed))
		assert.Check(t, is.Contains(p.Message, "A leader passed over holds back the workers of an upgrade"))
	})
	t.Run("a gate that cannot be read grants nothing", func(t *testing.T) {
		in := input(tu.Cluster("lab", tu.TargetVersion(tu.Version2)), []*likenv1.Machine{tu.Machine("b", tu.WantsRelease)}, nil)
		in.GateErr = errors.New(`spec.disruption.gates[0].blockingPods.selector: "Bad" is not a valid label selector operator`)
		d := Decide(in)
		assert.Check(t, is.Len(d.Granted, 0))
		p := progressing(t, d.Status)
		assert.Check(t, is.Equal(p.Reason, likenv1.ReasonInvalidGate))
		assert.Check(t, is.Contains(p.Message, "spec.disruption.gates[0].blockingPods.selector"))
	})
}

// TestBlockedOn reads the pods a gate matches as the controller does:
// through the pod informer's transform and index.
func TestBlockedOn(t *testing.T) {
	batch := func(p *corev1.Pod) { p.Labels["kind"] = "batch" }
	finished := func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }
	inOps := func(p *corev1.Pod) { p.Namespace = "ops" }
	gate := func(namespaces ...string) likenv1.Gate {
		return likenv1.Gate{BlockingPods: &likenv1.BlockingPodsGate{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"kind": "batch"}}, Namespaces: namespaces}}
	}
	cases := []struct {
		name  string
		gates []likenv1.Gate
		pods  []*corev1.Pod
		want  *Blocked
	}{
		{name: "a running pod the selector matches blocks", gates: []likenv1.Gate{gate()},
			pods: []*corev1.Pod{podOn("node-1", "batch-2", "x", batch), podOn("node-1", "batch-1", "x", batch), podOn("node-1", "web-1", "web"), podOn("node-2", "batch-3", "x", batch)},
			want: &Blocked{Gate: 0, Pods: []string{"shop/batch-1", "shop/batch-2"}}},
		{name: "a finished pod does not", gates: []likenv1.Gate{gate()},
			pods: []*corev1.Pod{podOn("node-1", "batch-1", "x", batch, finished)}},
		{name: "a pod of another namespace does not", gates: []likenv1.Gate{gate("ops")},
			pods: []*corev1.Pod{podOn("node-1", "batch-1", "x", batch)}},
		{name: "the first gate that matches is named", gates: []likenv1.Gate{gate("shop"), gate("ops")},
			pods: []*corev1.Pod{podOn("node-1", "batch-1", "x", batch, inOps)},
			want: &Blocked{Gate: 1, Pods: []string{"ops/batch-1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			podIdx, _ := indexers(t, tc.pods, nil)
			c := tu.Cluster("lab", func(c *likenv1.Cluster) { c.Spec.Disruption.Gates = tc.gates })
			gates, err := blockingSelectors(c)
			assert.NilError(t, err)
			r := budgetsReader{pods: podIdx}
			got, ok, err := r.blockedOn("node-1", gates)
			assert.NilError(t, err)
			if tc.want == nil {
				assert.Check(t, !ok, "blocked by %v", got)
				return
			}
			assert.Check(t, ok)
			assert.DeepEqual(t, got, *tc.want)
		})
	}
}

func TestBlockingSelectorsNameTheGateThatCannotBeRead(t *testing.T) {
	c := tu.Cluster("lab", func(c *likenv1.Cluster) {
		c.Spec.Disruption.Gates = []likenv1.Gate{{BlockingPods: &likenv1.BlockingPodsGate{Selector: metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kind", Operator: "Near"}}}}}}
	})
	_, err := blockingSelectors(c)
	assert.ErrorContains(t, err, "spec.disruption.gates[0].blockingPods.selector")
}

// TestControllerReportsTheHold: one event on the Cluster when the hold
// stops the turns, none while it lasts, one when it is lifted.
func TestControllerReportsTheHold(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), heldBy("freeze", "kubectl-annotate", after)),
		tu.Machine("a", tu.WantsRelease))
	ctx := context.Background()
	_, err := f.ctrl.sync(ctx, "lab")
	assert.NilError(t, err)
	evs := f.events()
	assert.Assert(t, is.Len(evs, 1))
	assert.Check(t, is.Contains(evs[0], `Cluster/lab Normal Held No turn is granted: the rollout is held (annotation liken.sh/hold): "freeze", set by kubectl-annotate`))

	f.refresh("lab")
	_, err = f.ctrl.sync(ctx, "lab")
	assert.NilError(t, err)
	assert.Check(t, is.Len(f.events(), 0))

	c := f.stored("lab")
	delete(c.Annotations, likenv1.AnnotationHold)
	assert.NilError(t, f.clusters.Liken().V1alpha1().Clusters().Informer().GetIndexer().Update(c))
	_, err = f.ctrl.sync(ctx, "lab")
	assert.NilError(t, err)
	evs = f.events()
	assert.Assert(t, is.Len(evs, 2))
	assert.Check(t, is.Equal(evs[0], "Cluster/lab Normal HoldLifted The annotation liken.sh/hold was removed: turns are granted again"))
	assert.Check(t, is.Contains(evs[1], "Machine/a Normal TurnGranted"))
}

func TestPrometheusGateShutsEveryTurn(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	c.Status.RebootTurns = []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, after.Add(-time.Minute))}
	in := input(c, []*likenv1.Machine{tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsReboot)}, nil)
	in.Shut = []promgate.Closed{{Gate: 2, Why: "alerts fire on http://prometheus.monitoring:9090: KubeNodeNotReady"}}
	d := Decide(in)
	assert.Check(t, is.Len(d.Granted, 0))
	assert.Check(t, is.Equal(d.Status.Turns, "a"), "a turn granted before goes on")
	p := progressing(t, d.Status)
	assert.Check(t, is.Equal(p.Status, metav1.ConditionFalse))
	assert.Check(t, is.Equal(p.Reason, likenv1.ReasonGateClosed))
	assert.Check(t, is.Equal(p.Message, "No turn is granted: spec.disruption.gates[2] (prometheus) is shut: alerts fire on http://prometheus.monitoring:9090: KubeNodeNotReady. "+
		"Turns granted before go on to their end: a. Granting resumes by itself once every gate opens (cluster-operator reads each server every 15 s); to go on anyway, remove the gate from spec.disruption.gates."))
}

// TestControllerWithoutAProberGrantsNothingBehindAPrometheusGate: a
// cluster-operator that reads no Prometheus server does not pass a gate it
// cannot read.
func TestControllerWithoutAProberGrantsNothingBehindAPrometheusGate(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), func(c *likenv1.Cluster) {
		c.Spec.Disruption.Gates = []likenv1.Gate{{Prometheus: &likenv1.PrometheusGate{URL: "http://prometheus.invalid"}}}
	})
	f := newFixture(t, c, tu.Machine("a", tu.WantsRelease))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	st := f.stored("lab").Status
	assert.Check(t, is.Equal(st.Turns, ""))
	assert.Check(t, is.Contains(progressing(t, st).Message, "this cluster-operator reads no Prometheus server"))
	evs := f.events()
	assert.Assert(t, is.Len(evs, 1))
	assert.Check(t, is.Contains(evs[0], "Cluster/lab Warning GateClosed No turn is granted: spec.disruption.gates[0] (prometheus) is shut"))
}
