package drain

import (
	"context"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/eviction"

	"liken.sh/liken/internal/eviction/evictiontest"
)

// The pods of the drain's rule (shared with the other package's tests).
var (
	pod       = evictiontest.Pod
	withClaim = evictiontest.WithClaim
	ownedBy   = evictiontest.OwnedBy
	hostPath  = evictiontest.HostPath
)

func node(mut ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	for _, m := range mut {
		m(n)
	}
	return n
}

func TestCordonRecordsAndUncordonOnlyOurs(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(node())
	ours, err := Cordon(ctx, c, "node-1", "chg1")
	assert.NilError(t, err)
	assert.Assert(t, ours)
	n, _ := c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.Assert(t, n.Spec.Unschedulable)
	assert.Equal(t, n.Annotations[likenv1.AnnotationCordoned], "chg1")
	ours, err = Cordon(ctx, c, "node-1", "chg2")
	assert.NilError(t, err)
	assert.Assert(t, ours, "a node liken cordoned stays liken's")
	done, err := Uncordon(ctx, c, "node-1")
	assert.NilError(t, err)
	assert.Assert(t, done)
	n, _ = c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.Assert(t, !n.Spec.Unschedulable)
	assert.Assert(t, is.Len(n.Annotations, 0))

	// Someone else's cordon: liken neither claims nor lifts it.
	c = fake.NewClientset(node(func(n *corev1.Node) { n.Spec.Unschedulable = true }))
	ours, err = Cordon(ctx, c, "node-1", "chg1")
	assert.NilError(t, err)
	assert.Assert(t, !ours)
	done, err = Uncordon(ctx, c, "node-1")
	assert.NilError(t, err)
	assert.Assert(t, !done)
	n, _ = c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.Assert(t, n.Spec.Unschedulable)
}

// evictions wires a fake clientset's evictions: a refused pod gets 429,
// an accepted one is deleted at once. It records the order.
type evictions struct {
	mu      sync.Mutex
	order   []string
	refuse  map[string]bool
	tracker k8stesting.ObjectTracker
}

func (e *evictions) install(c *fake.Clientset) {
	e.tracker = c.Tracker()
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateAction)
		if ca.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := ca.GetObject().(*policyv1.Eviction)
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.refuse[ev.Name] {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		e.order = append(e.order, ev.Name)
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
		return true, nil, e.tracker.Delete(gvr, ev.Namespace, ev.Name)
	})
}

func (e *evictions) setRefuse(name string, v bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refuse[name] = v
}

func (e *evictions) got() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.order...)
}

func TestRunEvictsClaimHoldersFirstAndLeavesTheRest(t *testing.T) {
	objs := []runtime.Object{
		pod("web-1"), pod("web-2"),
		pod("gpu-job", withClaim),
		pod("ds", ownedBy("DaemonSet")),
		pod("driver", hostPath(eviction.KubeletPluginsRegistry)),
		pod("static", func(p *corev1.Pod) { p.Annotations = map[string]string{eviction.MirrorPodAnnotation: "x"} }),
	}
	c := fake.NewClientset(objs...)
	ev := &evictions{refuse: map[string]bool{}}
	ev.install(c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	assert.NilError(t, Run(ctx, Options{Client: c, Node: "node-1", Poll: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond}))
	got := ev.got()
	assert.Equal(t, len(got), 3, "evicted: %v", got)
	assert.Equal(t, got[0], "gpu-job", "the claim holder goes first")
	assert.Assert(t, is.Contains(got[1:], "web-1"))
	assert.Assert(t, is.Contains(got[1:], "web-2"))
	left, _ := c.CoreV1().Pods("app").List(ctx, metav1.ListOptions{})
	assert.Equal(t, len(left.Items), 3, "DaemonSet, driver and mirror pods stay")
}

func TestRunHoldsOthersWhileAClaimHolderIsRefused(t *testing.T) {
	c := fake.NewClientset(pod("web"), pod("gpu-job", withClaim),
		&policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-pdb", Namespace: "app"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MaxUnavailable: ptr(intstr.FromInt32(0)),
				Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "gpu-job"}},
			},
		})
	ev := &evictions{refuse: map[string]bool{"gpu-job": true}}
	ev.install(c)
	blocked := make(chan Blocked, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Client: c, Node: "node-1", Timeout: 20 * time.Millisecond,
			Poll: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond,
			OnBlocked: func(b Blocked) { blocked <- b },
		})
	}()
	b := <-blocked
	assert.DeepEqual(t, b.Pods, []string{"app/gpu-job"})
	assert.DeepEqual(t, b.PDBs, []string{"app/gpu-pdb"})
	assert.Assert(t, is.Contains(b.Message("node-1", time.Minute), "PodDisruptionBudgets app/gpu-pdb allow no more disruptions"))
	assert.Assert(t, is.Len(ev.got(), 0), "no other pod is touched while a claim holder stays")
	ev.setRefuse("gpu-job", false)
	assert.NilError(t, <-done)
	assert.DeepEqual(t, ev.got(), []string{"gpu-job", "web"})
}

func TestRunStopsWithItsContext(t *testing.T) {
	c := fake.NewClientset(pod("web"))
	ev := &evictions{refuse: map[string]bool{"web": true}}
	ev.install(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Options{Client: c, Node: "node-1", Poll: time.Millisecond}) }()
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

func ptr[T any](v T) *T { return &v }

// TestRunWakesWhenTheEvictedPodIsGone: an evicted pod turns terminating
// and then goes, as a kubelet stops it; the drain sees it gone through its
// watch, not at its next poll (the fake clock never reaches it).
func TestRunWakesWhenTheEvictedPodIsGone(t *testing.T) {
	c := fake.NewClientset(pod("web-1"), pod("web-2"))
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		obj, err := c.Tracker().Get(gvr, ev.Namespace, ev.Name)
		if err != nil {
			return true, nil, err
		}
		p := obj.(*corev1.Pod).DeepCopy()
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		if err := c.Tracker().Update(gvr, p, ev.Namespace); err != nil {
			return true, nil, err
		}
		// The kubelet stops the containers: the pod goes after its
		// eviction was accepted, through a terminating state the drain
		// only sees through its watch or its next list.
		return true, nil, c.Tracker().Delete(gvr, ev.Namespace, ev.Name)
	})
	clk := clocktesting.NewFakeClock(time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	assert.NilError(t, Run(ctx, Options{Client: c, Node: "node-1", Clock: clk, Poll: time.Hour}))
	left, err := c.CoreV1().Pods("app").List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(left.Items), 0)
}
