package daemon

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A trial commits only on a Ready this boot's kubelet posted: after a
// reboot Kubernetes keeps a silent Node Ready for about 40 s.
func TestReadyThisBoot(t *testing.T) {
	booted := time.Date(2026, 11, 20, 10, 0, 0, 500e6, time.UTC)
	node := func(bootID string, status corev1.ConditionStatus, heartbeat time.Time) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "m1"}}
		n.Status.NodeInfo.BootID = bootID
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(heartbeat)}}
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		node  *corev1.Node
		ready bool
		why   string
	}{
		{"no Node", nil, false, "the Node does not exist"},
		{"Ready kept from the previous boot", node("boot-1", corev1.ConditionTrue, booted.Add(-10*time.Second)), false, `its boot ID is "boot-1", this boot is "boot-2"`},
		{"Ready of the previous boot, heartbeat after this boot started", node("boot-1", corev1.ConditionTrue, booted.Add(10*time.Second)), false, "the kubelet of this boot has not posted"},
		{"no boot ID posted", node("", corev1.ConditionTrue, booted.Add(10*time.Second)), false, "the kubelet of this boot has not posted"},
		{"this boot, not Ready", node("boot-2", corev1.ConditionFalse, booted.Add(10*time.Second)), false, "is not Ready"},
		{"this boot, no Ready condition", node("boot-2", "", time.Time{}), false, "no Ready condition"},
		{"this boot, heartbeat older than the boot", node("boot-2", corev1.ConditionTrue, booted.Add(-2*time.Second)), false, "older than this boot"},
		{"this boot, heartbeat in the second the boot started", node("boot-2", corev1.ConditionTrue, booted.Truncate(time.Second)), true, ""},
		{"this boot, fresh heartbeat", node("boot-2", corev1.ConditionTrue, booted.Add(20*time.Second)), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready, why := readyThisBoot(tc.node, "boot-2", booted)
			assert.Equal(t, ready, tc.ready)
			assert.Assert(t, tc.why == "" && why == "" || tc.why != "" && strings.Contains(why, tc.why), "why: %q", why)
		})
	}
}
