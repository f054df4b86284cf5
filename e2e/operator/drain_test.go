package operator

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// A machine whose pod is under a PodDisruptionBudget that allows no
// disruption is passed over: the real cluster-operator grants the rest of
// the fleet its turns around it, says why in Progressing and in an event
// on the Machine, and grants it its turn once the budget is gone. About
// 40 s.
func TestBlockedDrainIsPassedOver(t *testing.T) {
	e := setup(t, fleetSpec{leaders: 1, workers: 3, maxUnavailable: "1", rebootFor: time.Second, renewEvery: time.Second})
	rec := e.record()

	_, err := e.kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = e.kube.CoreV1().Pods("shop").Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-3", Containers: []corev1.Container{{Name: "web", Image: "web"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	// The same pod on node-2, but run by a DaemonSet: the drain leaves it
	// where it is, so it does not hold node-2 back.
	yes := true
	_, err = e.kube.CoreV1().Pods("shop").Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-1", Labels: map[string]string{"app": "web"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "agent-uid", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: "node-2", Containers: []corev1.Container{{Name: "agent", Image: "agent"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	none := intstr.FromInt32(0)
	_, err = e.kube.PolicyV1().PodDisruptionBudgets("shop").Create(e.ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &none, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	e.waitFor("pod shop/web-1 to run on node-3", time.Minute, func() bool {
		p, err := e.kube.CoreV1().Pods("shop").Get(e.ctx, "web-1", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})

	e.startOperator("op-a", "--startup-grace=2s")
	e.waitFor("the Cluster to read Ready 4/4", time.Minute, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == "4/4"
	})
	e.setVersion(version2)

	// Everyone but node-3 upgrades; node-3 waits and the Cluster says why.
	e.waitFor("node-1, node-2 and node-4 to run "+version2, time.Minute, func() bool {
		for _, n := range []string{"node-1", "node-2", "node-4"} {
			if m := e.machine(n); m.Status.Version != version2 || m.Status.Phase != likenv1.MachineReady {
				return false
			}
		}
		return e.cluster().Status.Turns == ""
	})
	c := e.cluster()
	p := progressing(c)
	t.Logf("Progressing: %s %s: %s", p.Status, p.Reason, p.Message)
	assert.Equal(t, p.Reason, likenv1.ReasonDrainBlocked)
	assert.Assert(t, is.Contains(p.Message,
		"node-3 waits: its drain would be blocked by PodDisruptionBudget shop/web (0 disruptions allowed) covering pods shop/web-1."))
	assert.Equal(t, e.machine("node-3").Status.Phase, likenv1.MachineUpdatePending)
	for _, g := range rec.grants() {
		assert.Assert(t, g.machine != "node-3", "node-3 got a turn its drain could not use")
	}
	evs, err := e.kube.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	found := false
	for _, ev := range evs.Items {
		if ev.Reason == "DrainWouldBlock" && ev.Regarding.Kind == "Machine" && ev.Regarding.Name == "node-3" {
			found = true
			assert.Assert(t, strings.Contains(ev.Note, "PodDisruptionBudget shop/web"), ev.Note)
		}
	}
	assert.Assert(t, found, "no DrainWouldBlock event about Machine node-3")

	// Without the budget, node-3 takes its turn.
	assert.NilError(t, e.kube.PolicyV1().PodDisruptionBudgets("shop").Delete(e.ctx, "web", metav1.DeleteOptions{}))
	e.waitRolledOut(version2, time.Minute)
	n := rec.check(t)
	t.Logf("%d versions of the Cluster checked", n)
}
