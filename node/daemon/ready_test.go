package daemon

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A trial commits only on a Ready this boot's kubelet posted (after a
// reboot Kubernetes keeps a silent Node Ready for about 40 s), and a
// leader's k3s restart ends only on a heartbeat later than the restart.
func TestReadySince(t *testing.T) {
	booted := time.Date(2026, 11, 20, 10, 0, 0, 500e6, time.UTC)
	node := func(bootID string, status corev1.ConditionStatus, heartbeat time.Time) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "m1"}}
		n.Status.NodeInfo.BootID = bootID
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(heartbeat)}}
		}
		return n
	}
	// As the trial calls it: a heartbeat from the second the boot began on.
	thisBoot := func(n *corev1.Node) (bool, string) {
		return readySince(n, "boot-2", booted.Truncate(time.Second), "this boot", booted)
	}
	// As a leader's k3s restart calls it: a heartbeat in a later second.
	restarted := booted.Add(time.Minute)
	afterRestart := func(n *corev1.Node) (bool, string) {
		return readySince(n, "boot-2", restarted.Truncate(time.Second).Add(time.Second), "the restart of k3s", restarted)
	}
	for _, tc := range []struct {
		name  string
		check func(*corev1.Node) (bool, string)
		node  *corev1.Node
		ready bool
		why   string
	}{
		{"no Node", thisBoot, nil, false, "the Node does not exist"},
		{"Ready kept from the previous boot", thisBoot, node("boot-1", corev1.ConditionTrue, booted.Add(-10*time.Second)), false, `its boot ID is "boot-1", this boot is "boot-2"`},
		{"Ready of the previous boot, heartbeat after this boot started", thisBoot, node("boot-1", corev1.ConditionTrue, booted.Add(10*time.Second)), false, "the kubelet of this boot has not posted"},
		{"no boot ID posted", thisBoot, node("", corev1.ConditionTrue, booted.Add(10*time.Second)), false, "the kubelet of this boot has not posted"},
		{"this boot, not Ready", thisBoot, node("boot-2", corev1.ConditionFalse, booted.Add(10*time.Second)), false, "is not Ready"},
		{"this boot, no Ready condition", thisBoot, node("boot-2", "", time.Time{}), false, "no Ready condition"},
		{"this boot, heartbeat older than the boot", thisBoot, node("boot-2", corev1.ConditionTrue, booted.Add(-2*time.Second)), false, "is from before this boot"},
		{"this boot, heartbeat in the second the boot started", thisBoot, node("boot-2", corev1.ConditionTrue, booted.Truncate(time.Second)), true, ""},
		{"this boot, fresh heartbeat", thisBoot, node("boot-2", corev1.ConditionTrue, booted.Add(20*time.Second)), true, ""},
		{"k3s restart, Ready kept from before it", afterRestart, node("boot-2", corev1.ConditionTrue, restarted.Add(-5*time.Second)), false, "is from before the restart of k3s"},
		{"k3s restart, heartbeat in the restart's second", afterRestart, node("boot-2", corev1.ConditionTrue, restarted.Truncate(time.Second)), false, "is from before the restart of k3s"},
		{"k3s restart, heartbeat a second later", afterRestart, node("boot-2", corev1.ConditionTrue, restarted.Truncate(time.Second).Add(time.Second)), true, ""},
		{"k3s restart, kubelet of another boot", afterRestart, node("boot-1", corev1.ConditionTrue, restarted.Add(5*time.Second)), false, "the kubelet of this boot has not posted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready, why := tc.check(tc.node)
			assert.Equal(t, ready, tc.ready)
			assert.Assert(t, tc.why == "" && why == "" || tc.why != "" && strings.Contains(why, tc.why), "why: %q", why)
		})
	}
}
