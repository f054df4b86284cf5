package turns

import (
	"context"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	tu "liken.sh/liken/controllers/internal/testutil"
	"liken.sh/liken/internal/eviction"
)

// podOn is a running pod of namespace shop on node, labelled app=app.
func podOn(node, name, app string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1", Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func daemonSetPod(p *corev1.Pod) {
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", Controller: &yes}}
}

func mirrorPod(p *corev1.Pod) {
	p.Annotations = map[string]string{eviction.MirrorPodAnnotation: "hash"}
}

// budget is a PodDisruptionBudget of namespace shop over app=app that
// allows allowed disruptions.
func budget(name, app string, allowed int32) *policyv1.PodDisruptionBudget {
	zero := intstr.FromInt32(0)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	}
}

// indexers hold pods and budgets as the controller's informers do: pods
// through the informer's transform and index, budgets by namespace.
func indexers(t *testing.T, pods []*corev1.Pod, budgets []*policyv1.PodDisruptionBudget) (podIdx, budgetIdx cache.Indexer) {
	t.Helper()
	podIdx = cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, PodIndexers)
	for _, p := range pods {
		trimmed, err := TrimPod(p)
		assert.NilError(t, err)
		assert.NilError(t, podIdx.Add(trimmed))
	}
	budgetIdx = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, b := range budgets {
		assert.NilError(t, budgetIdx.Add(b))
	}
	return podIdx, budgetIdx
}

// withDrains reads the drains of machines as the controller does.
func withDrains(t *testing.T, in Input, pods []*corev1.Pod, budgets []*policyv1.PodDisruptionBudget) Input {
	t.Helper()
	podIdx, budgetIdx := indexers(t, pods, budgets)
	c := &Controller{pods: podIdx, budgets: budgetIdx}
	var err error
	in.Drains, in.DisruptionsAllowed, err = c.drains(in.Cluster, in.Machines)
	assert.NilError(t, err)
	return in
}

func TestDrainCheck(t *testing.T) {
	cases := []struct {
		name     string
		cluster  *likenv1.Cluster
		machines []*likenv1.Machine
		pods     []*corev1.Pod
		budgets  []*policyv1.PodDisruptionBudget
		want     []string
		skipped  []string
		reason   string
		message  []string
	}{
		{
			name:     "a machine under a 0-disruption budget is passed over; the next gets the turn",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease), tu.Machine("node-2", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-2", "db-1", "db")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 0), budget("db", "db", 1)},
			want:     []string{"node-2"}, skipped: []string{"node-1"}, reason: likenv1.ReasonGranting,
			message: []string{"Holding a turn: node-2 (maxUnavailable 1).",
				"node-1 waits: its drain would be blocked by PodDisruptionBudget shop/web (0 disruptions allowed) covering pods shop/web-1.",
				"The next machine in order takes each such turn"},
		},
		{
			name:    "one disruption allowed, two machines with a covered pod each: one turn",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease), tu.Machine("node-2", tu.WantsRelease),
				tu.Machine("node-3", tu.WantsRelease)},
			pods:    []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-2", "web-2", "web")},
			budgets: []*policyv1.PodDisruptionBudget{budget("web", "web", 1)},
			want:    []string{"node-1", "node-3"}, skipped: []string{"node-2"}, reason: likenv1.ReasonGranting,
			message: []string{"node-2 waits: its drain would be blocked by PodDisruptionBudget shop/web (1 disruption allowed, 1 of them taken by the drains of turns already granted) covering pods shop/web-2."},
		},
		{
			name: "a turn already held takes its disruptions",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3"),
				tu.Turns(tu.Turn("node-1", likenv1.TurnRelease, false, after))),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)), tu.Machine("node-2", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-2", "web-2", "web")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 1)},
			want:     nil, skipped: []string{"node-2"}, reason: likenv1.ReasonGranting,
		},
		{
			// The drain evicts one, and the next once the first runs
			// elsewhere: passing the machine over would keep it waiting
			// for ever, since its pods never move by themselves.
			name:     "two pods under a budget that allows one at a time: the drain takes them in turn",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-1", "web-2", "web")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 1)},
			want:     []string{"node-1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a machine granted with two pods under a budget takes what it allows from the next",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease), tu.Machine("node-2", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-1", "web-2", "web"), podOn("node-2", "web-3", "web")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 2)},
			want:     []string{"node-1"}, skipped: []string{"node-2"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "two pods under a budget that allows none: blocked",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web"), podOn("node-1", "web-2", "web")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:     nil, skipped: []string{"node-1"}, reason: likenv1.ReasonDrainBlocked,
			message: []string{"covering pods shop/web-1,shop/web-2."},
		},
		{
			name:    "a blocked leader holds the workers of an upgrade back, and says so",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("2")),
			machines: []*likenv1.Machine{tu.Machine("leader-1", tu.Leader, tu.WantsRelease),
				tu.Machine("worker-1", tu.WantsRelease), tu.Machine("worker-2", tu.WantsRelease)},
			pods:    []*corev1.Pod{podOn("leader-1", "web-1", "web")},
			budgets: []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:    nil, skipped: []string{"leader-1"}, reason: likenv1.ReasonDrainBlocked,
			message: []string{"Waiting for a turn: leader-1,worker-1,worker-2.",
				"leaders not on it yet: leader-1 (UpdatePending, its drain would be blocked by PodDisruptionBudget shop/web (0 disruptions allowed) covering pods shop/web-1).",
				"A leader passed over holds back the workers of an upgrade until it runs the new release."},
		},
		{
			name:    "a blocked leader lets the next leader go, one at a time",
			cluster: tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("3")),
			machines: []*likenv1.Machine{tu.Machine("leader-1", tu.Leader, tu.WantsRelease), tu.Machine("leader-2", tu.Leader, tu.WantsRelease),
				tu.Machine("leader-3", tu.Leader, tu.WantsRelease), tu.Machine("worker-1", tu.WantsRelease)},
			pods:    []*corev1.Pod{podOn("leader-1", "web-1", "web")},
			budgets: []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:    []string{"leader-2"}, skipped: []string{"leader-1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "DaemonSet and mirror pods stay: they do not block",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "agent-1", "web", daemonSetPod), podOn("node-1", "static-1", "web", mirrorPod)},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:     []string{"node-1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "finished, Pending and terminating pods take no disruption",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods: []*corev1.Pod{
				podOn("node-1", "done-1", "web", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				podOn("node-1", "new-1", "web", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
				podOn("node-1", "going-1", "web", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: after} }),
			},
			budgets: []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:    []string{"node-1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a budget of another namespace, or with an empty selector, covers nothing",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "web-1", "web")},
			budgets: []*policyv1.PodDisruptionBudget{
				func() *policyv1.PodDisruptionBudget { b := budget("web", "web", 0); b.Namespace = "other"; return b }(),
				func() *policyv1.PodDisruptionBudget {
					b := budget("all", "web", 0)
					b.Spec.Selector = &metav1.LabelSelector{}
					return b
				}(),
			},
			want: []string{"node-1"}, reason: likenv1.ReasonGranting,
		},
		{
			name:     "a pod that no budget covers does not block",
			cluster:  tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
			machines: []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)},
			pods:     []*corev1.Pod{podOn("node-1", "cache-1", "cache"), podOn("node-2", "web-1", "web")},
			budgets:  []*policyv1.PodDisruptionBudget{budget("web", "web", 0)},
			want:     []string{"node-1"}, reason: likenv1.ReasonGranting,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(withDrains(t, input(tc.cluster, tc.machines, nil), tc.pods, tc.budgets))
			assert.DeepEqual(t, granted(d), tc.want)
			var skipped []string
			for _, s := range d.Skipped {
				skipped = append(skipped, s.Machine)
			}
			assert.DeepEqual(t, skipped, tc.skipped)
			p := progressing(t, d.Status)
			assert.Equal(t, p.Reason, tc.reason, p.Message)
			for _, want := range tc.message {
				assert.Assert(t, is.Contains(p.Message, want))
			}
			if len(tc.skipped) == 0 {
				assert.Assert(t, !strings.Contains(p.Message, "drain"), p.Message)
			}
		})
	}
}

// Once the budget allows the eviction, the machine passed over gets its
// turn, with no other change.
func TestDrainCheckLetsTheMachineGoOnceTheBudgetAllows(t *testing.T) {
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2))
	machines := []*likenv1.Machine{tu.Machine("node-1", tu.WantsRelease)}
	pods := []*corev1.Pod{podOn("node-1", "web-1", "web")}
	d := Decide(withDrains(t, input(c, machines, nil), pods, []*policyv1.PodDisruptionBudget{budget("web", "web", 0)}))
	assert.Equal(t, len(d.Granted), 0)
	p := progressing(t, d.Status)
	assert.Equal(t, p.Status, metav1.ConditionFalse)
	assert.Equal(t, p.Reason, likenv1.ReasonDrainBlocked)

	d = Decide(withDrains(t, input(c, machines, nil), pods, []*policyv1.PodDisruptionBudget{budget("web", "web", 1)}))
	assert.Equal(t, fleet.TurnsString(d.Granted), "node-1")
	assert.Equal(t, len(d.Skipped), 0)
}

// The transform keeps what the drain's own rule reads: for every kind of
// pod, the trimmed pod says what eviction.Evicts says of the whole one.
func TestTrimPodKeepsTheDrainsVerdict(t *testing.T) {
	claim := func(p *corev1.Pod) {
		n := "gpu"
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &n}}
	}
	driver := func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "reg", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: eviction.KubeletPluginsRegistry}}}}
	}
	pods := []*corev1.Pod{
		podOn("n", "plain", "web"),
		podOn("n", "ds", "web", daemonSetPod),
		podOn("n", "mirror", "web", mirrorPod),
		podOn("n", "claim", "web", claim),
		podOn("n", "driver", "web", driver),
		podOn("n", "pending", "web", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
		podOn("n", "failed", "web", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		podOn("n", "going", "web", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)} }),
	}
	for _, p := range pods {
		evicted, takes := eviction.Evicts(p)
		obj, err := TrimPod(p)
		assert.NilError(t, err)
		tp := obj.(*Pod)
		assert.Equal(t, tp.Evicted, evicted, p.Name)
		assert.Equal(t, tp.TakesDisruption, takes, p.Name)
		assert.Equal(t, tp.NodeName(), "n")
		assert.Equal(t, tp.Namespace(), "shop")
		assert.Equal(t, tp.ResourceVersion, "1")
		again, err := TrimPod(obj)
		assert.NilError(t, err)
		assert.Equal(t, again, obj, "the transform is idempotent")
	}
}

func TestPodLabelsMatchLikeAMap(t *testing.T) {
	m := map[string]string{"app": "web", "tier": "front", "a": ""}
	l := podLabels(m)
	for _, sel := range []string{"app=web", "app=web,tier=front", "app!=db", "a", "!b", "tier in (front,back)", "app=db", "b", "tier notin (front)", "!a"} {
		s, err := labels.Parse(sel)
		assert.NilError(t, err)
		assert.Equal(t, s.Matches(l), s.Matches(labels.Set(m)), sel)
	}
	assert.Equal(t, podLabels(nil).Has("app"), false)
}

// The controller reads pods and budgets from its informers, passes the
// machine whose drain would be blocked over, and says so once in an event
// on the Cluster and on the Machine, not at every sync.
func TestControllerPassesOverABlockedDrainAndSaysSoOnce(t *testing.T) {
	f := newFixture(t,
		tu.Cluster("lab", tu.TargetVersion(tu.Version2)),
		tu.Machine("node-1", tu.WantsRelease), tu.Machine("node-2", tu.WantsRelease),
		tu.Node("node-1", true), tu.Node("node-2", true),
		podOn("node-1", "web-1", "web"), budget("web", "web", 0))
	_, err := f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	c := f.stored("lab")
	assert.Equal(t, c.Status.Turns, "node-2")
	assert.Assert(t, is.Contains(progressing(t, c.Status).Message, "node-1 waits: its drain would be blocked by PodDisruptionBudget shop/web (0 disruptions allowed) covering pods shop/web-1."))
	var blocked []string
	for _, e := range f.events() {
		if strings.Contains(e, EventDrainWouldBlock) {
			blocked = append(blocked, e)
		}
	}
	assert.Equal(t, len(blocked), 1, "one event, on the Machine: %v", blocked)
	assert.Assert(t, is.Contains(blocked[0], "Machine/node-1 Warning DrainWouldBlock node-1 waits: its drain would be blocked by PodDisruptionBudget shop/web"))

	f.refresh("lab")
	_, err = f.ctrl.sync(context.Background(), "lab")
	assert.NilError(t, err)
	for _, e := range f.events() {
		assert.Assert(t, !strings.Contains(e, EventDrainWouldBlock), "reported again: %s", e)
	}
}
