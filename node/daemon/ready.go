package daemon

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// readySince tells whether the kubelet of this boot posted Ready with a
// heartbeat at notBefore or later (a silent Node stays Ready for about 40 s,
// docs/design/protocol.md#the-machine-takes-its-turn), and if not, what it
// waits for; event and at name notBefore in that message.
func readySince(n *corev1.Node, bootID string, notBefore time.Time, event string, at time.Time) (bool, string) {
	if n == nil {
		return false, "the Node does not exist"
	}
	if got := n.Status.NodeInfo.BootID; got != bootID {
		return false, fmt.Sprintf("the kubelet of this boot has not posted the Node's status (its boot ID is %q, this boot is %q)", got, bootID)
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status != corev1.ConditionTrue {
			if c.Reason == "" && c.Message == "" {
				return false, fmt.Sprintf("the node %s is not Ready", n.Name)
			}
			return false, fmt.Sprintf("the node %s is not Ready (%s: %s)", n.Name, c.Reason, c.Message)
		}
		if c.LastHeartbeatTime.Time.Before(notBefore) {
			return false, fmt.Sprintf("the node's Ready heartbeat (%s) is from before %s (%s)", c.LastHeartbeatTime.UTC().Format(time.RFC3339), event, at.UTC().Format(time.RFC3339))
		}
		return true, ""
	}
	return false, fmt.Sprintf("the node %s is not Ready (no Ready condition)", n.Name)
}
