package turns

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	tu "liken.sh/liken/controllers/internal/testutil"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

// scaleFleet is a cluster of n machines in the middle of a rollout to
// Version2, as the benchmarks of e2e/bench see it: 3 leaders done, two
// fifths of the workers done (2,000 of 5,000), 5 workers in their turn,
// the rest waiting; maxUnavailable 6, so every decision grants one turn.
// Machines come in a random order, as an informer index returns them.
func scaleFleet(n int, withNodes bool) (*likenv1.Cluster, []*likenv1.Machine, []*corev1.Node) {
	var turns []likenv1.RebootTurn
	var machines []*likenv1.Machine
	var nodes []*corev1.Node
	for i := range 3 {
		machines = append(machines, tu.Machine(fmt.Sprintf("leader-%d", i), tu.Leader, tu.FinishedOn(tu.Version2)))
	}
	done := (n - 3) * 2 / 5
	for i := range n - 3 {
		name := fmt.Sprintf("machine-%05d", i)
		switch {
		case i < done:
			machines = append(machines, tu.Machine(name, tu.FinishedOn(tu.Version2)))
		case i < done+5:
			machines = append(machines, tu.Machine(name, tu.WantsRelease, tu.Phase(likenv1.MachineUpdating)))
			turns = append(turns, tu.Turn(name, likenv1.TurnRelease, false, after.Add(-time.Minute)))
		default:
			machines = append(machines, tu.Machine(name, tu.WantsRelease))
		}
	}
	if withNodes {
		for _, m := range machines {
			var opts []func(*corev1.Node)
			if m.Status.Phase == likenv1.MachineUpdating {
				opts = append(opts, tu.Cordoned)
			}
			nodes = append(nodes, tu.Node(m.Name, true, opts...))
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(machines), func(i, j int) { machines[i], machines[j] = machines[j], machines[i] })
	c := tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("6"), tu.Turns(turns...))
	return c, machines, nodes
}

// benchSizes are the fleet sizes the benchmarks decide at: how a
// decision's cost grows with the fleet.
var benchSizes = []int{1000, 5000, 10000, 50000}

// decideAtScale is the input of one decision at n machines.
func decideAtScale(n int, withNodes bool) Input {
	c, machines, nodes := scaleFleet(n, withNodes)
	slices.SortFunc(machines, func(a, b *likenv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	byName := map[string]Node{}
	for _, n := range nodes {
		byName[n.Name] = Node{State: fleet.NodeReady, CordonedByLiken: fleet.CordonedByLiken(n)}
	}
	return input(c, machines, byName)
}

// BenchmarkDecide is one decision (the pure part) at each of benchSizes.
func BenchmarkDecide(b *testing.B) {
	for _, n := range benchSizes {
		for _, withNodes := range []bool{false, true} {
			b.Run(fmt.Sprintf("machines=%d/nodes=%t", n, withNodes), func(b *testing.B) {
				in := decideAtScale(n, withNodes)
				b.ReportAllocs()
				for b.Loop() {
					if d := Decide(in); len(d.Granted) != 1 {
						b.Fatalf("granted %d turns, want 1", len(d.Granted))
					}
				}
			})
		}
	}
	// The most windows a Cluster may declare, one of them open: what the
	// windows add to a decision.
	b.Run("machines=5000/nodes=false/windows=32", func(b *testing.B) {
		in := decideAtScale(5000, false)
		in.Cluster = in.Cluster.DeepCopy()
		in.Cluster.Spec.Disruption.Windows = manyWindows()
		b.ReportAllocs()
		for b.Loop() {
			if d := Decide(in); len(d.Granted) != 1 {
				b.Fatalf("granted %d turns, want 1", len(d.Granted))
			}
		}
	})
}

// grantWriter accepts every write without storing it or returning it, so
// that each sync of the benchmark decides again from the same cache.
type grantWriter struct{ writes int }

func (w *grantWriter) UpdateStatus(context.Context, *likenv1.Cluster, metav1.UpdateOptions) (*likenv1.Cluster, error) {
	w.writes++
	return nil, nil
}

// syncAtScale is a turn controller whose caches hold a fleet of n
// machines, and the stub its writes go to.
func syncAtScale(tb testing.TB, n int, withNodes bool) (*Controller, *grantWriter) {
	tb.Helper()
	c, machines, nodes := scaleFleet(n, withNodes)
	lf := likeninformers.NewSharedInformerFactory(likenfake.NewSimpleClientset(), 0)
	kube := kubefake.NewClientset()
	kf := kubeinformers.NewSharedInformerFactory(kube, 0)
	w := &grantWriter{}
	ctrl, err := New(Config{
		Clusters: lf.Liken().V1alpha1().Clusters(),
		Machines: lf.Liken().V1alpha1().Machines(),
		Nodes:    kf.Core().V1().Nodes(),
		Pods:     NewPodInformer(kube),
		Budgets:  kf.Policy().V1().PodDisruptionBudgets(),
		Writer:   w,
		Recorder: &events.FakeRecorder{},
		Metrics:  metrics.New(),
		Clock:    clocktesting.NewFakeClock(after),
		Term: leadership.Term{Identity: "op-1", Since: tu.Epoch,
			Fence: leadership.FenceFunc(func(context.Context, string) error { return nil })},
		StartupGrace: 40 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := lf.Liken().V1alpha1().Clusters().Informer().GetIndexer().Add(c); err != nil {
		tb.Fatal(err)
	}
	for _, m := range machines {
		if err := lf.Liken().V1alpha1().Machines().Informer().GetIndexer().Add(m); err != nil {
			tb.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := kf.Core().V1().Nodes().Informer().GetIndexer().Add(n); err != nil {
			tb.Fatal(err)
		}
	}
	return ctrl, w
}

// BenchmarkSync is one sync of the turn controller at each of benchSizes,
// from the informer caches to the write: read the fleet, decide, compare,
// write (to a stub), report. Every sync grants one turn.
func BenchmarkSync(b *testing.B) {
	for _, n := range benchSizes {
		for _, withNodes := range []bool{false, true} {
			b.Run(fmt.Sprintf("machines=%d/nodes=%t", n, withNodes), func(b *testing.B) {
				ctrl, w := syncAtScale(b, n, withNodes)
				ctx := klog.NewContext(context.Background(), logr.Discard())
				b.ReportAllocs()
				syncs := 0
				for b.Loop() {
					if _, err := ctrl.sync(ctx, "lab"); err != nil {
						b.Fatal(err)
					}
					syncs++
				}
				if w.writes != syncs {
					b.Fatalf("%d writes in %d syncs: every sync should grant", w.writes, syncs)
				}
			})
		}
	}
}

// manyWindows are 32 maintenance windows in 8 time zones, one of them open
// at the tests' now (Monday 11:00 UTC).
func manyWindows() []likenv1.MaintenanceWindow {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney", "America/Sao_Paulo", "Asia/Tokyo", "Africa/Cairo"}
	var ws []likenv1.MaintenanceWindow
	for i := range 31 {
		ws = append(ws, tu.Window("Tue,Thu,Sat", fmt.Sprintf("%02d:%02d", i%24, i), 90*time.Minute, zones[i%len(zones)]))
	}
	return append(ws, tu.Window("Mon", "10:00", 2*time.Hour, "UTC"))
}

// TestBenchmarkSmoke runs what BenchmarkDecide and BenchmarkSync measure,
// a few times each, so that they keep working: at 5,000 machines every
// decision grants exactly one turn, and every sync writes it.
func TestBenchmarkSmoke(t *testing.T) {
	ctx := klog.NewContext(context.Background(), logr.Discard())
	for _, withNodes := range []bool{false, true} {
		t.Run(fmt.Sprintf("nodes=%t", withNodes), func(t *testing.T) {
			in := decideAtScale(5000, withNodes)
			for range 3 {
				assert.Equal(t, len(Decide(in).Granted), 1, "one decision at 5,000 machines")
			}
			in.Cluster = in.Cluster.DeepCopy()
			in.Cluster.Spec.Disruption.Windows = manyWindows()
			assert.Equal(t, len(Decide(in).Granted), 1, "one decision at 5,000 machines inside one of 32 windows")
			ctrl, w := syncAtScale(t, 5000, withNodes)
			for range 3 {
				_, err := ctrl.sync(ctx, "lab")
				assert.NilError(t, err)
			}
			assert.Equal(t, w.writes, 3, "every sync at 5,000 machines grants a turn and writes it")
		})
	}
}
