package lab

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// readyAfter is how long the pods of the scenario's Deployment take to
// start (the lab's annotation liken.sh/lab-ready-after): well past the
// few seconds a lab machine takes to reboot.
const readyAfter = 30 * time.Second

// A Deployment whose pods take half a minute to start holds the next turn: the
// machine whose drain evicted one of its pods keeps its place until the
// replacement runs elsewhere and the PodDisruptionBudget has all of its
// pods healthy again (Progressing reason Settling, naming the budget), and
// only then does the next machine get its turn. The Deployment never has
// fewer ready pods than its budget leaves.
func TestNextTurnWaitsForTheWorkloads(t *testing.T) {
	l := startLab(t, "e2e-settle", labOptions{policy: "Auto"})
	ctx := context.Background()
	_, err := l.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	assert.NilError(t, err)
	replicas, one := int32(3), intstr.FromInt32(1)
	labels := map[string]string{"app": "web"}
	_, err = l.kube.AppsV1().Deployments("shop").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"liken.sh/lab-ready-after": readyAfter.String()}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = l.kube.PolicyV1().PodDisruptionBudgets("shop").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	l.waitFor("the Deployment's three pods to be ready", 3*time.Minute, func() (bool, string) {
		pdb, err := l.kube.PolicyV1().PodDisruptionBudgets("shop").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return pdb.Status.CurrentHealthy == 3 && pdb.Status.ExpectedPods == 3, fmt.Sprintf("%d of %d healthy", pdb.Status.CurrentHealthy, pdb.Status.ExpectedPods)
	})

	// Every change of the budget's health, as this computer's clock sees
	// it arrive, until the end.
	type sample struct {
		at      time.Time
		healthy int32
	}
	var (
		mu      sync.Mutex
		samples []sample
	)
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := l.kube.PolicyV1().PodDisruptionBudgets("shop").Watch(watchCtx, metav1.ListOptions{FieldSelector: "metadata.name=web"})
	assert.NilError(t, err)
	var watching sync.WaitGroup
	watching.Add(1)
	go func() {
		defer watching.Done()
		for ev := range w.ResultChan() {
			if pdb, ok := ev.Object.(*policyv1.PodDisruptionBudget); ok {
				mu.Lock()
				samples = append(samples, sample{time.Now(), pdb.Status.CurrentHealthy})
				mu.Unlock()
			}
		}
	}()

	// first runs a pod of the Deployment; second is another machine.
	pods, err := l.kube.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	assert.NilError(t, err)
	assert.Assert(t, len(pods.Items) > 0)
	first := pods.Items[0].Spec.NodeName
	var second string
	for _, m := range l.machines() {
		if m.Name != first {
			second = m.Name
			break
		}
	}
	from := l.w.settle(t)
	t.Logf("liken request-reboot %s %s: %s", l.name, first, strings.TrimSpace(l.mustLiken("request-reboot", l.name, first)))
	l.waitFor(first+" to hold its turn", 2*time.Minute, func() (bool, string) {
		c := l.cluster()
		return c.Status.Turns == first, "turns " + c.Status.Turns
	})
	t.Logf("liken request-reboot %s %s: %s", l.name, second, strings.TrimSpace(l.mustLiken("request-reboot", l.name, second)))

	var settling string
	l.waitFor(first+" to settle while the Deployment's pods start elsewhere", 3*time.Minute, func() (bool, string) {
		c := l.cluster()
		p := condition(c.Status.Conditions, likenv1.ConditionProgressing)
		if p.Reason == likenv1.ReasonSettling {
			settling = p.Message
		}
		return strings.Contains(settling, first+" waits for PodDisruptionBudget shop/web to have all of its pods healthy"),
			fmt.Sprintf("turns %q; Progressing %s: %s", c.Status.Turns, p.Reason, p.Message)
	})
	l.waitFor(second+"'s turn to end", 4*time.Minute, func() (bool, string) {
		m := l.machine(second)
		return m.Status.Phase == likenv1.MachineReady && m.Status.Change == "" && l.cluster().Status.Turns == "", string(m.Status.Phase)
	})
	l.w.settle(t)
	stop()
	watching.Wait()

	grants := l.w.grants(from)
	assert.DeepEqual(t, grantNames(grants), []string{first, second})
	// When the second machine got its turn, the budget had every pod
	// healthy again: the last change seen before the grant says so.
	mu.Lock()
	defer mu.Unlock()
	i := slices.IndexFunc(samples, func(s sample) bool { return !s.at.Before(grants[1].at) })
	if i < 0 {
		i = len(samples)
	}
	assert.Assert(t, i > 0, "the budget never changed before the second grant")
	assert.Check(t, is.Equal(samples[i-1].healthy, int32(3)), "the budget had %d of 3 pods healthy when %s got its turn", samples[i-1].healthy, second)
	assert.Check(t, slices.ContainsFunc(samples[:i], func(s sample) bool { return s.healthy < 3 }), "the drain of %s took no pod of the budget", first)
	least := int32(3)
	for _, s := range samples {
		least = min(least, s.healthy)
	}
	assert.Check(t, least >= 2, "the Deployment had %d ready pods, below its budget", least)
	// The first machine was back before the replacement ran: it settled
	// after its turn ended, not with it.
	var returned, settled time.Time
	for _, r := range l.w.clusterHistory(from) {
		in := slices.ContainsFunc(r.obj.Status.Settling, func(s likenv1.SettlingMachine) bool { return s.Machine == first })
		switch {
		case in && returned.IsZero():
			returned = r.at
		case !in && !returned.IsZero() && settled.IsZero():
			settled = r.at
		}
	}
	assert.Assert(t, !returned.IsZero() && !settled.IsZero(), "the Cluster never listed %s as settling", first)
	t.Logf("%s settled %s after it came back; %s got its turn %s after that", first, settled.Sub(returned).Round(100*time.Millisecond), second, grants[1].at.Sub(settled).Round(100*time.Millisecond))
	evs, err := l.kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Check(t, slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
		return e.Reason == "Settled" && e.Regarding.Name == first
	}), "no Settled event on Machine %s", first)
}
