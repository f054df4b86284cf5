package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/e2e/internal/prometheus"
)

// Each gate holds the rollout and lets it go, on the real API server and
// cluster-operator: a person's hold (liken rollout hold), an alert of a
// real Prometheus server (Debian's package), and a pod that keeps its
// machine out of its turn; then the canary of a release halts the rollout
// when it turns unhealthy during its time.
func TestGatesAndCanaryHoldTheRollout(t *testing.T) {
	l := startLab(t, "e2e-gates", labOptions{policy: "Auto"})
	ctx := context.Background()
	prom := prometheus.Start(t, "KubeNodeNotReady", "Watchdog")
	gates, err := json.Marshal(map[string]any{"spec": map[string]any{"disruption": map[string]any{"gates": []any{
		map[string]any{"prometheus": map[string]any{"url": prom.URL, "alerts": "Kube.*", "timeout": "2s"}},
		map[string]any{"blockingPods": map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"example.com/no-reboot": "true"}}}},
	}}}})
	assert.NilError(t, err)
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", string(gates))
	_, err = l.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "jobs"}}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = l.kube.CoreV1().Pods("jobs").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "batch", Labels: map[string]string{"example.com/no-reboot": "true"}},
		Spec:       corev1.PodSpec{NodeName: "node-4", Containers: []corev1.Container{{Name: "batch", Image: "registry.invalid/batch:1"}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)

	from := l.w.settle(t)
	t.Logf("liken rollout hold: %s", strings.TrimSpace(l.mustLiken("rollout", "hold", l.name, "--reason", "e2e freeze")))
	for _, m := range []string{"node-4", "node-5"} {
		l.mustLiken("request-reboot", l.name, m)
	}
	progressingIs := func(reason string, parts ...string) func() (bool, string) {
		return func() (bool, string) {
			c := l.cluster()
			p := condition(c.Status.Conditions, likenv1.ConditionProgressing)
			ok := p.Reason == reason && c.Status.Turns == ""
			for _, part := range parts {
				ok = ok && strings.Contains(p.Message, part)
			}
			return ok, fmt.Sprintf("turns %q; Progressing %s: %s", c.Status.Turns, p.Reason, p.Message)
		}
	}
	bothWait := func() (bool, string) {
		var out []string
		for _, m := range []string{"node-4", "node-5"} {
			if ph := l.machine(m).Status.Phase; ph != likenv1.MachineRebootPending {
				out = append(out, m+" "+string(ph))
			}
		}
		return len(out) == 0, strings.Join(out, ", ")
	}
	l.waitFor("node-4 and node-5 to wait for a turn", time.Minute, bothWait)
	l.waitFor("the hold to hold them", time.Minute, progressingIs(likenv1.ReasonHeld, `"e2e freeze", set by liken rollout hold`))

	t.Logf("liken rollout unhold: %s", strings.TrimSpace(l.mustLiken("rollout", "unhold", l.name)))
	l.waitFor("the firing alert to hold them", time.Minute, progressingIs(likenv1.ReasonGateClosed, "spec.disruption.gates[0] (prometheus) is shut: alerts fire on "+prom.URL+": KubeNodeNotReady"))
	l.w.settle(t)
	assert.Check(t, is.Len(l.w.grants(from), 0), "turns granted while a gate was shut")

	prom.Fire("Watchdog") // an alert the gate's pattern leaves out
	opened := time.Now()
	l.waitFor("node-5 to get its turn while the pod keeps node-4 out", time.Minute, func() (bool, string) {
		c := l.cluster()
		p := condition(c.Status.Conditions, likenv1.ConditionProgressing)
		return c.Status.Turns == "node-5" && strings.Contains(p.Message, "node-4 runs pod jobs/batch (spec.disruption.gates[1], blockingPods)"),
			fmt.Sprintf("turns %q; Progressing %s: %s", c.Status.Turns, p.Reason, p.Message)
	})
	l.waitFor("node-5's turn to end", 2*time.Minute, func() (bool, string) {
		c := l.cluster()
		return c.Status.Turns == "" && l.machine("node-5").Status.Phase == likenv1.MachineReady, "turns " + c.Status.Turns
	})
	l.waitFor("the pod alone to keep node-4 out", time.Minute, progressingIs(likenv1.ReasonGateClosed, "node-4 runs pod jobs/batch"))
	assert.NilError(t, l.kube.CoreV1().Pods("jobs").Delete(ctx, "batch", metav1.DeleteOptions{}))
	l.waitFor("node-4's turn to end", 3*time.Minute, func() (bool, string) {
		m := l.machine("node-4")
		return m.Status.Phase == likenv1.MachineReady && m.Status.Change == "" && l.cluster().Status.Turns == "", string(m.Status.Phase)
	})
	l.w.settle(t)
	grants := l.w.grants(from)
	assert.DeepEqual(t, grantNames(grants), []string{"node-5", "node-4"})
	assert.Check(t, !grants[0].at.Before(opened), "node-5 got its turn before the alert stopped")
	evs, err := l.kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	for _, want := range []struct{ kind, name, reason string }{
		{"Cluster", l.name, likenv1.ReasonHeld}, {"Cluster", l.name, "HoldLifted"}, {"Cluster", l.name, likenv1.ReasonGateClosed}, {"Machine", "node-4", likenv1.ReasonGateClosed},
	} {
		assert.Check(t, slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Kind == want.kind && e.Regarding.Name == want.name && e.Reason == want.reason
		}), "no %s event on %s %s", want.reason, want.kind, want.name)
	}

	// The canary: the first machine of a release's rollout, a leader, is
	// back on it; it loses power during its canary time, and the rollout
	// halts with CanaryFailed; nothing else gets a turn to the release.
	l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", `{"spec":{"disruption":{"gates":null,"canary":{"duration":"10m"}}}}`)
	next := l.publish("")
	from = l.setVersion(next.Version, next)
	var canary string
	l.waitFor("the canary to be back on the release", 4*time.Minute, func() (bool, string) {
		c := l.cluster()
		if c.Status.Canary == nil {
			return false, "no canary yet; turns " + c.Status.Turns
		}
		canary = c.Status.Canary.Machine
		return c.Status.Canary.ReturnedAt != nil, fmt.Sprintf("canary %s; turns %q", canary, c.Status.Turns)
	})
	l.waitFor("the others to wait for the canary", time.Minute, progressingIs(likenv1.ReasonCanary, "The canary "+canary+" runs "+next.Version))
	t.Logf("liken lab power off %s: %s", canary, strings.TrimSpace(l.mustLiken("lab", "power", "off", canary, "--name", l.name)))
	l.waitFor("the rollout to halt with CanaryFailed", 2*time.Minute, func() (bool, string) {
		c := l.cluster()
		h := c.Status.Halt
		return h != nil && h.Reason == likenv1.ReasonCanaryFailed && h.Machine == canary && h.Version == next.Version, fmt.Sprintf("halt %+v", h)
	})
	l.w.settle(t)
	assert.DeepEqual(t, grantNames(l.w.grants(from)), []string{canary})
	l.mustLiken("lab", "power", "on", canary, "--name", l.name)
}
