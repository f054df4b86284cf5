package turns

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	tu "liken.sh/liken/controllers/internal/testutil"
)

// settling is machine's settling entry: back from its Release turn at
// returned, its drain having taken from budgets.
func settling(machine string, leader bool, returned time.Time, budgets ...string) likenv1.SettlingMachine {
	return likenv1.SettlingMachine{
		Machine: machine, Reason: likenv1.TurnRelease, Leader: leader, Budgets: budgets,
		GrantedAt: metav1.NewTime(returned.Add(-5 * time.Minute)), ReturnedAt: metav1.NewTime(returned),
	}
}

func dur(d time.Duration) *time.Duration { return &d }

// check is one assertion on a decision, for the tables of decisions.
type check func(t *testing.T, d Decision)

// grants checks which machines the decision granted turns to.
func grants(names ...string) check {
	return func(t *testing.T, d Decision) { assert.DeepEqual(t, granted(d), names) }
}

// says checks the reason of the decision's Progressing condition and
// parts of its message.
func says(reason string, parts ...string) check {
	return func(t *testing.T, d Decision) {
		p := progressing(t, d.Status)
		assert.Check(t, is.Equal(p.Reason, reason), p.Message)
		for _, part := range parts {
			assert.Check(t, is.Contains(p.Message, part))
		}
	}
}

func TestSettle(t *testing.T) {
	grantedAt := after.Add(-5 * time.Minute)
	shortOfPods := []string{"PodDisruptionBudget shop/web to have all of its pods healthy (2 of 3)"}
	settlingNames := func(names ...string) check {
		return func(t *testing.T, d Decision) {
			var got []string
			for _, s := range d.Status.Settling {
				got = append(got, s.Machine)
			}
			assert.DeepEqual(t, got, names)
		}
	}
	requeues := func(after time.Duration) check {
		return func(t *testing.T, d Decision) { assert.Check(t, is.Equal(d.RequeueAfter, after)) }
	}
	settled := func(want ...Settled) check {
		return func(t *testing.T, d Decision) { assert.DeepEqual(t, d.Settled, want) }
	}
	cases := []struct {
		name      string
		cluster   *likenv1.Cluster
		turns     []likenv1.RebootTurn
		settling  []likenv1.SettlingMachine
		machines  []*likenv1.Machine
		unsettled map[string][]string
		checks    []check
	}{
		{
			name:     "a machine back from its turn keeps its place for the default settle time",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil)),
			turns:    []likenv1.RebootTurn{withBudgets(tu.Turn("a", likenv1.TurnRelease, false, grantedAt), "shop/web")},
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants(), settlingNames("a"), requeues(likenv1.DefaultSettle),
				says(likenv1.ReasonSettling, "a waits for spec.disruption.settle (30s) to pass at "+after.Add(30*time.Second).UTC().Format(time.RFC3339)+".", "Waiting for a turn: b"),
				func(t *testing.T, d Decision) {
					assert.DeepEqual(t, d.Status.Settling[0], likenv1.SettlingMachine{
						Machine: "a", Reason: likenv1.TurnRelease, Budgets: []string{"shop/web"},
						GrantedAt: metav1.NewTime(grantedAt), ReturnedAt: metav1.NewTime(after),
					})
				}},
		},
		{
			name:     "once the settle time passed with its workloads healthy the next machine gets the place",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil)),
			settling: []likenv1.SettlingMachine{settling("a", false, after.Add(-likenv1.DefaultSettle), "shop/web")},
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants("b"), settlingNames(), settled(Settled{Machine: "a", After: likenv1.DefaultSettle}), says(likenv1.ReasonGranting)},
		},
		{
			name:      "a budget short of healthy pods holds the place past the settle time",
			cluster:   tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(dur(time.Minute))),
			settling:  []likenv1.SettlingMachine{settling("a", false, after.Add(-2*time.Minute), "shop/web")},
			machines:  []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			unsettled: map[string][]string{"a": shortOfPods},
			checks: []check{grants(), settlingNames("a"), settled(),
				says(likenv1.ReasonSettling, "a waits for PodDisruptionBudget shop/web to have all of its pods healthy (2 of 3)."),
				requeues(likenv1.DefaultStallTimeout - 2*time.Minute)},
		},
		{
			name:      "settle 0s waits for the workloads alone",
			cluster:   tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			turns:     []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, grantedAt)},
			machines:  []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			unsettled: map[string][]string{"a": {"DaemonSet pods kube-system/proxy-a to be Ready"}},
			checks:    []check{grants(), settlingNames("a"), says(likenv1.ReasonSettling, "a waits for DaemonSet pods kube-system/proxy-a to be Ready.")},
		},
		{
			name:     "settle 0s with healthy workloads passes the place on in the same decision, without an entry",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			turns:    []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, grantedAt)},
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants("b"), settlingNames(), settled()},
		},
		{
			name:     "with room in the budget another machine gets a turn while one settles",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil), tu.MaxUnavailable("2")),
			settling: []likenv1.SettlingMachine{settling("a", false, after.Add(-10*time.Second))},
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease), tu.Machine("c", tu.WantsRelease)},
			checks:   []check{grants("b"), settlingNames("a"), says(likenv1.ReasonSettling, "Holding a turn: b", "a waits for spec.disruption.settle (30s) to pass at "+after.Add(20*time.Second).UTC().Format(time.RFC3339))},
		},
		{
			name:     "a settling leader is a leader down: no other leader gets a turn",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil), tu.MaxUnavailable("3")),
			settling: []likenv1.SettlingMachine{settling("l1", true, after.Add(-10*time.Second))},
			machines: []*likenv1.Machine{tu.Machine("l1", tu.Leader, tu.FinishedOn(tu.Version2)), tu.Machine("l2", tu.Leader, tu.WantsRelease)},
			checks:   []check{grants(), settlingNames("l1")},
		},
		{
			name:     "a settling machine gets no new turn until it settled",
			cluster:  tu.Cluster("lab", tu.Settle(nil), tu.MaxUnavailable("2")),
			settling: []likenv1.SettlingMachine{settling("a", false, after.Add(-10*time.Second))},
			machines: []*likenv1.Machine{tu.Machine("a", tu.WantsReboot)},
			checks:   []check{grants(), settlingNames("a"), says(likenv1.ReasonSettling, "Waiting for a turn: a")},
		},
		{
			name:     "a restart of k3s settles too",
			cluster:  tu.Cluster("lab", tu.Settle(nil)),
			turns:    []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRestartK3s, false, grantedAt)},
			machines: []*likenv1.Machine{tu.Machine("a", tu.Runs(tu.Version1)), tu.Machine("b", tu.WantsReboot)},
			checks: []check{grants(), settlingNames("a"), func(t *testing.T, d Decision) {
				assert.Check(t, is.Equal(d.Status.Settling[0].Reason, likenv1.TurnRestartK3s))
			}},
		},
		{
			name:     "a turn taken back before it started does not settle",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil)),
			turns:    []likenv1.RebootTurn{tu.Turn("a", likenv1.TurnRelease, false, grantedAt)},
			machines: []*likenv1.Machine{tu.Machine("a", tu.Runs(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants("b"), settlingNames()},
		},
		{
			name:     "a deleted machine is not waited for",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil)),
			settling: []likenv1.SettlingMachine{settling("gone", false, after.Add(-time.Second))},
			machines: []*likenv1.Machine{tu.Machine("b", tu.WantsRelease)},
			checks:   []check{grants("b"), settlingNames(), settled()},
		},
		{
			name:      "a machine not settled within the stall timeout of its return halts the rollout",
			cluster:   tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil)),
			settling:  []likenv1.SettlingMachine{settling("a", false, after.Add(-likenv1.DefaultStallTimeout), "shop/web")},
			machines:  []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			unsettled: map[string][]string{"a": shortOfPods},
			checks: []check{grants(), settlingNames("a"),
				says(likenv1.ReasonRolloutStalled, "Machine a came back from its Release turn", "have not settled within the stall timeout (30m0s): it waits for PodDisruptionBudget shop/web to have all of its pods healthy (2 of 3)", "liken rollout resume lab"),
				func(t *testing.T, d Decision) {
					assert.Assert(t, d.Halted != nil)
					assert.Check(t, is.Equal(d.Halted.Reason, likenv1.ReasonRolloutStalled))
					assert.Check(t, is.Equal(d.Halted.Machine, "a"))
				}},
		},
		{
			name: "a resume stops waiting for a machine stalled in its settling",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil), func(c *likenv1.Cluster) {
				c.Annotations[likenv1.AnnotationResumeRollout] = "1"
				c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonRolloutStalled, Machine: "a", Since: metav1.NewTime(after.Add(-time.Minute))}
			}),
			settling:  []likenv1.SettlingMachine{settling("a", false, after.Add(-likenv1.DefaultStallTimeout-time.Minute), "shop/web")},
			machines:  []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			unsettled: map[string][]string{"a": shortOfPods},
			checks: []check{grants("b"), settlingNames(), settled(Settled{Machine: "a", After: likenv1.DefaultStallTimeout + time.Minute, Released: true}),
				func(t *testing.T, d Decision) {
					assert.Check(t, d.Lifted != nil && d.Status.Halt == nil)
				}},
		},
		{
			name:     "the halt lifts by itself once the stalled machine settled",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(nil), stalledOn("a")),
			settling: []likenv1.SettlingMachine{settling("a", false, after.Add(-likenv1.DefaultStallTimeout-time.Minute), "shop/web")},
			machines: []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)},
			checks: []check{grants("b"), settlingNames(), func(t *testing.T, d Decision) {
				assert.Assert(t, d.Lifted != nil)
				assert.Check(t, is.Contains(d.LiftedBecause, "machine a no longer holds a stalled turn nor waits to settle"))
			}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cluster
			c.Status.RebootTurns = tc.turns
			c.Status.Settling = tc.settling
			in := input(c, tc.machines, nil)
			in.Unsettled = tc.unsettled
			d := Decide(in)
			for _, check := range tc.checks {
				check(t, d)
			}
		})
	}
}

func withBudgets(t likenv1.RebootTurn, budgets ...string) likenv1.RebootTurn {
	t.Budgets = budgets
	return t
}

func stalledOn(machine string) func(*likenv1.Cluster) {
	return func(c *likenv1.Cluster) {
		c.Status.Halt = &likenv1.RolloutHalt{Reason: likenv1.ReasonRolloutStalled, Machine: machine, Since: metav1.NewTime(after.Add(-time.Minute))}
	}
}

func TestGrantRecordsTheBudgetsItsDrainTakes(t *testing.T) {
	in := input(tu.Cluster("lab", tu.TargetVersion(tu.Version2)), []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)}, nil)
	in = withDrains(t, in,
		[]*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-1", "db-1", "db"), podOn("node-1", "agent-1", "web", daemonSetPod)},
		[]*policyv1.PodDisruptionBudget{budget("web", "web", 1), budget("db", "db", 1), budget("idle", "other", 1)})
	d := Decide(in)
	assert.DeepEqual(t, granted(d), []string{"node-1"})
	assert.DeepEqual(t, d.Granted[0].Budgets, []string{"shop/db", "shop/web"})
}

// TestUnsettled reads what a returned machine's workloads lack as the
// controller does: budgets and pods through the informers' indexers and
// transform.
func TestUnsettled(t *testing.T) {
	granted := after.Add(-5 * time.Minute)
	healthy := func(current, expected int32) func(*policyv1.PodDisruptionBudget) {
		return func(b *policyv1.PodDisruptionBudget) {
			b.Status.CurrentHealthy, b.Status.ExpectedPods = current, expected
		}
	}
	changed := func(b *policyv1.PodDisruptionBudget) { b.Generation = 2; b.Status.ObservedGeneration = 1 }
	ready := func(started time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{
				{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}},
				{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started.Add(-time.Hour))}}},
			}
		}
	}
	cases := []struct {
		name     string
		budgets  []*policyv1.PodDisruptionBudget
		pods     []*corev1.Pod
		rebooted bool
		want     []string
	}{
		{name: "budgets whole and DaemonSet pods ready since the reboot", rebooted: true,
			budgets: []*policyv1.PodDisruptionBudget{budgetWith("web", healthy(3, 3))},
			pods:    []*corev1.Pod{podOn("node-1", "agent", "agent", daemonSetPod, ready(after))}},
		{name: "a budget short of healthy pods",
			budgets: []*policyv1.PodDisruptionBudget{budgetWith("web", healthy(2, 3))},
			want:    []string{"PodDisruptionBudget shop/web to have all of its pods healthy (2 of 3)"}},
		{name: "a budget the disruption controller has not counted since its change",
			budgets: []*policyv1.PodDisruptionBudget{budgetWith("web", healthy(3, 3), changed)},
			want:    []string{"PodDisruptionBudget shop/web to be counted again since its last change"}},
		{name: "a deleted budget is not waited for"},
		{name: "a DaemonSet pod not ready",
			pods: []*corev1.Pod{podOn("node-1", "agent", "agent", daemonSetPod), podOn("node-2", "agent-2", "agent", daemonSetPod)},
			want: []string{"DaemonSet pods shop/agent to be Ready"}},
		{name: "after a reboot, a DaemonSet pod whose status is from before the grant", rebooted: true,
			pods: []*corev1.Pod{podOn("node-1", "agent", "agent", daemonSetPod, ready(granted.Add(-time.Second)))},
			want: []string{"DaemonSet pods shop/agent to start again since the reboot"}},
		{name: "without a reboot, a DaemonSet pod ready from before is settled",
			pods: []*corev1.Pod{podOn("node-1", "agent", "agent", daemonSetPod, ready(granted.Add(-time.Hour)))}},
		{name: "other pods are not waited for", rebooted: true,
			pods: []*corev1.Pod{podOn("node-1", "web-1", "web")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			podIdx, budgetIdx := indexers(t, tc.pods, tc.budgets)
			r := budgetsReader{pods: podIdx, budgets: budgetIdx}
			got, err := r.unsettled("node-1", []string{"shop/web"}, granted, tc.rebooted)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func budgetWith(name string, opts ...func(*policyv1.PodDisruptionBudget)) *policyv1.PodDisruptionBudget {
	b := budget(name, name, 1)
	for _, o := range opts {
		o(b)
	}
	return b
}

// TestSettlingWritesNothingWhileItWaits: decisions taken while a machine
// settles (every status write of another machine brings one) leave the
// Cluster's status as it was, so they cost no write.
func TestSettlingWritesNothingWhileItWaits(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.Settle(dur(time.Minute)))
	c.Status.Settling = []likenv1.SettlingMachine{settling("a", false, after.Add(-10*time.Second))}
	machines := []*likenv1.Machine{tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease)}
	first := Decide(input(c, machines, nil))
	c.Status = first.Status
	later := input(c, machines, nil)
	later.Now = after.Add(7 * time.Second)
	second := Decide(later)
	assert.DeepEqual(t, second.Status, first.Status)
}

// TestControllerWaitsForTheWorkloadsItWatches: the controller reads what a
// settling machine waits for from its informers, a change of a budget it
// waits for brings a decision, and the place goes on once the budget is
// whole and the machine's DaemonSet pod runs again since the reboot.
func TestControllerWaitsForTheWorkloadsItWatches(t *testing.T) {
	returned := after.Add(-time.Minute)
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	c.Status.Settling = []likenv1.SettlingMachine{settling("a", false, returned, "shop/web")}
	short := budgetWith("web", func(b *policyv1.PodDisruptionBudget) { b.Status.CurrentHealthy, b.Status.ExpectedPods = 2, 3 })
	agentStarted := func(at time.Time) *corev1.Pod {
		return podOn("a", "agent-a", "agent", daemonSetPod, func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at)}}}}
		})
	}
	f := newFixture(t, c,
		tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease),
		tu.Node("a", true, tu.NodeBootID("boot-2-a")), tu.Node("b", true),
		short, budgetWith("other"),
		// The pod's status is still the one from before the reboot.
		agentStarted(returned.Add(-10*time.Minute)))
	assert.Check(t, f.ctrl.settlesOn(short))
	assert.Check(t, !f.ctrl.settlesOn(budgetWith("other")))

	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	st := f.stored("lab").Status
	assert.Equal(t, st.Turns, "")
	p := progressing(t, st)
	assert.Check(t, is.Equal(p.Reason, likenv1.ReasonSettling))
	assert.Check(t, is.Contains(p.Message, "a waits for PodDisruptionBudget shop/web to have all of its pods healthy (2 of 3); DaemonSet pods shop/agent-a to start again since the reboot."))

	whole := short.DeepCopy()
	whole.Status.CurrentHealthy = 3
	assert.NilError(t, f.ctrl.budgets.Update(whole))
	assert.NilError(t, f.ctrl.pods.Update(must(TrimPod(agentStarted(returned.Add(-20*time.Second))))))
	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	st = f.stored("lab").Status
	assert.Equal(t, st.Turns, "b")
	assert.Equal(t, len(st.Settling), 0)
	evs := f.events()
	assert.Assert(t, len(evs) == 2, "%v", evs)
	assert.Check(t, is.Contains(evs[0], "Machine/a Normal Settled Machine a settled 1m0s after it came back from its turn"))
}

// operatorCopy is a pod of cluster-operator's Deployment on node ("" while
// it is Pending), ready or not.
func operatorCopy(name, node string, ready bool, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := podOn(node, name, "", func(p *corev1.Pod) {
		p.Namespace = likenv1.SystemNamespace
		p.Labels = map[string]string{"app.kubernetes.io/name": likenv1.OperatorAppLabel}
		if node == "" {
			p.Status.Phase = corev1.PodPending
		}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
	})
	for _, o := range opts {
		o(p)
	}
	return p
}

// operatorDeployment is cluster-operator's Deployment asking for replicas.
func operatorDeployment(replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: likenv1.SystemNamespace, Name: likenv1.OperatorDeploymentName},
		Spec:       appsv1.DeploymentSpec{Replicas: &replicas},
	}
}

// TestCopiesWait counts the ready copies of cluster-operator a leader back
// from its turn waits for: a copy being deleted, one that ended, one not
// ready and a look-alike in another namespace are not ready copies.
func TestCopiesWait(t *testing.T) {
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: after} }
	finished := func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }
	elsewhere := func(p *corev1.Pod) { p.Namespace = "shop" }
	cases := []struct {
		name string
		pods []*corev1.Pod
		want string
	}{
		{name: "both copies ready", pods: []*corev1.Pod{operatorCopy("op-1", "b", true), operatorCopy("op-2", "c", true)}},
		{name: "the replacement of the drained copy not scheduled yet",
			pods: []*corev1.Pod{operatorCopy("op-1", "b", true), operatorCopy("op-3", "", false)},
			want: "cluster-operator to have all of its copies ready (1 of 2)"},
		{name: "the replacement not created yet",
			pods: []*corev1.Pod{operatorCopy("op-1", "b", true)},
			want: "cluster-operator to have all of its copies ready (1 of 2)"},
		{name: "a copy being deleted, one that ended, one not ready, one elsewhere",
			pods: []*corev1.Pod{operatorCopy("op-1", "b", true, deleting), operatorCopy("op-2", "c", true, finished),
				operatorCopy("op-3", "a", false), operatorCopy("op-4", "a", true, elsewhere)},
			want: "cluster-operator to have all of its copies ready (0 of 2)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			podIdx, budgetIdx := indexers(t, tc.pods, nil)
			r := budgetsReader{pods: podIdx, budgets: budgetIdx}
			got, err := r.copiesWait(2)
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

// TestLeaderSettlesOnceTheCopiesAreBack: consecutive leaders' drains would
// take both copies of cluster-operator away, so a leader back from its
// turn settles only once the Deployment's copies are all ready again; a
// worker does not wait for them, and neither does a leader when no
// Deployment of cluster-operator exists (an operator run outside the
// cluster).
func TestLeaderSettlesOnceTheCopiesAreBack(t *testing.T) {
	returned := after.Add(-time.Minute)
	cases := []struct {
		name   string
		leader bool
		objs   []runtime.Object
		waits  bool
	}{
		{name: "a leader, a copy not scheduled yet", leader: true, waits: true,
			objs: []runtime.Object{operatorDeployment(2), operatorCopy("op-1", "c", true), operatorCopy("op-2", "", false)}},
		{name: "a leader, both copies ready", leader: true,
			objs: []runtime.Object{operatorDeployment(2), operatorCopy("op-1", "c", true), operatorCopy("op-2", "a", true)}},
		{name: "a worker, a copy not scheduled yet",
			objs: []runtime.Object{operatorDeployment(2), operatorCopy("op-1", "c", true), operatorCopy("op-2", "", false)}},
		{name: "a leader, no Deployment of cluster-operator", leader: true,
			objs: []runtime.Object{operatorCopy("op-2", "", false)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
			c.Status.Settling = []likenv1.SettlingMachine{settling("a", tc.leader, returned)}
			objs := append([]runtime.Object{c, tu.Machine("a", tu.FinishedOn(tu.Version2)), tu.Machine("b", tu.WantsRelease),
				tu.Node("a", true, tu.NodeBootID("boot-2-a")), tu.Node("b", true)}, tc.objs...)
			f := newFixture(t, objs...)
			_, err := f.ctrl.sync(context.Background(), "lab")
			assert.NilError(t, err)
			st := f.stored("lab").Status
			if !tc.waits {
				assert.Equal(t, st.Turns, "b")
				return
			}
			assert.Equal(t, st.Turns, "")
			p := progressing(t, st)
			assert.Check(t, is.Equal(p.Reason, likenv1.ReasonSettling))
			assert.Check(t, is.Contains(p.Message, "a waits for cluster-operator to have all of its copies ready (1 of 2)."))
		})
	}
}

func must(obj any, err error) any {
	if err != nil {
		panic(err)
	}
	return obj
}

// TestSettleDefault: unset, settle is 30 s, or half of a stall timeout
// shorter than a minute, so that the settle time alone never stalls a
// machine.
func TestSettleDefault(t *testing.T) {
	for _, tc := range []struct {
		stall, want time.Duration
	}{
		{0, 30 * time.Second}, // the default stall timeout, 30m
		{time.Minute, 30 * time.Second},
		{20 * time.Second, 10 * time.Second},
	} {
		d := likenv1.DisruptionSpec{}
		if tc.stall > 0 {
			d.StallTimeout = &metav1.Duration{Duration: tc.stall}
		}
		assert.Check(t, is.Equal(d.SettleOrDefault(), tc.want), "stallTimeout %s", tc.stall)
	}
}
