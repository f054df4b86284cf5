package bench

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/e2e/internal/fleetsim"
)

// BenchmarkOperatorPods measures cluster-operator's memory with many pods
// in the cluster, which its drain check watches (through a transform that
// keeps only what the check reads). 1,000 machines without Nodes, and
// 50,000 pods under LIKEN_BENCH=full (2,000 otherwise), 50 per machine,
// bound to the machines' names: a real API server serves them to the
// operator's informer. When LIKEN_BENCH_BASELINE_BIN names a folder that
// holds an earlier cluster-operator (one without the pod informer), it
// runs too, on the same control plane, right before: its RSS is today's
// figure.
//
//	LIKEN_BENCH=full LIKEN_BIN=$PWD/_output/bin LIKEN_BENCH_BASELINE_BIN=/tmp/base/bin \
//	  go test -count=1 -run '^$' -bench OperatorPods -benchtime 1x -timeout 30m -v ./e2e/bench
func BenchmarkOperatorPods(b *testing.B) {
	o := podsOptions{machines: 1000, pods: 2000, settle: 10 * time.Second, sample: 30 * time.Second, baseline: os.Getenv("LIKEN_BENCH_BASELINE_BIN")}
	if full() {
		o.pods = 50000
	}
	for b.Loop() {
		u, base := runOperatorPods(b, o)
		b.ReportMetric(MiB(u.RSSMedian), "MiB-RSS")
		if base.Samples > 0 {
			b.ReportMetric(MiB(base.RSSMedian), "MiB-RSS-baseline")
			ratio := float64(u.RSSMedian) / float64(base.RSSMedian)
			b.ReportMetric(ratio, "x-baseline")
			if ratio >= 2 {
				b.Errorf("cluster-operator's RSS with %d pods is %.0f MiB, %.2f x the %.0f MiB of the operator without the pod informer: the target is under 2 x",
					o.pods, MiB(u.RSSMedian), ratio, MiB(base.RSSMedian))
			}
		}
	}
}

// TestOperatorPodsSmoke runs the pod benchmark small (20 machines, 500
// pods) so that it keeps working: the operator syncs its pod cache and
// stays under the smokes' RSS bound.
func TestOperatorPodsSmoke(t *testing.T) {
	u, _ := runOperatorPods(t, podsOptions{machines: 20, pods: 500, settle: time.Second, sample: 3 * time.Second})
	assert.Assert(t, u.Samples >= 2, "no sample of the operator: %+v", u)
	assert.Assert(t, MiB(u.RSSMax) < 200, "cluster-operator's RSS with 500 pods reached %.0f MiB: the smokes' bound is 200 MiB", MiB(u.RSSMax))
}

// podsOptions shape one pod benchmark run.
type podsOptions struct {
	machines, pods int
	// settle is how long the operator runs once ready before it is
	// sampled, once a second, for sample (counted in samples).
	settle, sample time.Duration
	// baseline, when set, is a folder holding an earlier cluster-operator
	// that is measured first, on the same control plane.
	baseline string
}

// runOperatorPods creates the pods, then measures cluster-operator (and
// the baseline's, when set).
func runOperatorPods(b testing.TB, o podsOptions) (u, base Usage) {
	pods, machines := o.pods, o.machines
	f := fleetsim.NewFleet(b, fleetsim.FleetOptions{Machines: machines, Leaders: 3, MaxUnavailable: "1", RenewEvery: 30 * time.Second, RebootFor: time.Second, KeepDir: os.Getenv("LIKEN_BENCH_LOGS")})
	start := time.Now()
	names := make([]string, pods)
	for i := range names {
		names[i] = fmt.Sprintf("web-%05d", i)
	}
	_, err := f.Kube.CoreV1().Namespaces().Create(f.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	must(b, err)
	must(b, fleetsim.Parallel(names, 16, func(i int, name string) error {
		_, err := f.Kube.CoreV1().Pods("shop").Create(f.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"app.kubernetes.io/name": fmt.Sprintf("web-%d", i%100), "app.kubernetes.io/instance": "shop", "pod-template-hash": "7c9f8d6b5d"}},
			Spec: corev1.PodSpec{NodeName: fleetsim.MachineName(i % machines), Containers: []corev1.Container{{Name: "web", Image: "registry.example/shop/web:1.42.0"}}},
		}, metav1.CreateOptions{})
		return err
	}))
	b.Logf("%d pods created in %s", pods, time.Since(start).Round(time.Second))

	measure := func(label string) Usage {
		op := fleetsim.RunOperator(b, f.CP, fleetsim.OperatorOptions{ID: label, Flags: []string{"--startup-grace", "5s", "--machine-lost-after", "2m"}})
		began := time.Now()
		poll.WaitOn(b, func(poll.LogT) poll.Result {
			if err := op.ExitError(); err != nil {
				return poll.Error(err)
			}
			if op.Ready() {
				return poll.Success()
			}
			return poll.Continue("%s operator not ready", label)
		}, poll.WithTimeout(5*time.Minute), poll.WithDelay(200*time.Millisecond))
		synced := time.Since(began)
		// Sampled once a second: o.settle's samples are left out, the
		// next o.sample's are the figure.
		sampled := func(s *Sampler, d time.Duration) Usage {
			want := int(d/time.Second) + 1
			poll.WaitOn(b, func(poll.LogT) poll.Result {
				if n := s.Samples(); n < want {
					return poll.Continue("%s operator: %d of %d samples", label, n, want)
				}
				return poll.Success()
			}, poll.WithTimeout(d+time.Minute), poll.WithDelay(100*time.Millisecond))
			return stopSampler(b, s)
		}
		sampled(StartSampler(op.PID, time.Second), o.settle)
		u := sampled(StartSampler(op.PID, time.Second), o.sample)
		must(b, syscall.Kill(op.PID, syscall.SIGTERM))
		poll.WaitOn(b, func(poll.LogT) poll.Result {
			if op.Exited() {
				return poll.Success()
			}
			return poll.Continue("%s operator still running", label)
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
		b.Logf("%s cluster-operator, %d machines, %d pods: caches synced in %s; RSS median %.0f MiB, max %.0f MiB (%d samples)",
			label, machines, pods, synced.Round(100*time.Millisecond), MiB(u.RSSMedian), MiB(u.RSSMax), u.Samples)
		return u
	}
	if o.baseline != "" {
		now := os.Getenv("LIKEN_BIN")
		b.Setenv("LIKEN_BIN", o.baseline)
		base = measure("baseline")
		b.Setenv("LIKEN_BIN", now)
	}
	return measure("liken"), base
}
