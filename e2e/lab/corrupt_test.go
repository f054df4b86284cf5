package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// A release whose served image does not match its release document is
// never staged anywhere: every machine refuses it, says which artifact
// failed and why, and keeps running its release. No turn is granted.
func TestCorruptReleaseIsNeverStaged(t *testing.T) {
	l := startLab(t, "e2e-corrupt", labOptions{policy: "Auto"})
	good := l.cluster().Spec.Version
	bad := l.publish("corrupt")
	from := l.setVersion(bad.Version, bad)

	l.waitFor("every machine to refuse "+bad.Version, 2*time.Minute, func() (bool, string) {
		var not []string
		for _, m := range l.machines() {
			c := condition(m.Status.Conditions, likenv1.ConditionReleaseVerified)
			if c.Status != metav1.ConditionFalse || c.Reason != "ChecksumMismatch" {
				not = append(not, fmt.Sprintf("%s ReleaseVerified=%s/%s", m.Name, c.Status, c.Reason))
			}
		}
		return len(not) == 0, strings.Join(not, ", ")
	})
	for _, m := range l.machines() {
		c := condition(m.Status.Conditions, likenv1.ConditionReleaseVerified)
		assert.Assert(t, is.Contains(c.Message, "rootfs.squashfs"), "machine %s", m.Name)
		assert.Assert(t, is.Contains(c.Message, bad.Version), "machine %s", m.Name)
		assert.Assert(t, is.Contains(c.Message, "nothing staged"), "machine %s", m.Name)
		assert.Equal(t, m.Status.Version, good, "machine %s", m.Name)
		assert.Equal(t, m.Status.Staged, "", "machine %s", m.Name)
		assert.Equal(t, m.Status.Phase, likenv1.MachineDownloading, "machine %s keeps trying", m.Name)
	}
	t.Logf("node-1 ReleaseVerified: %s", condition(l.machine("node-1").Status.Conditions, likenv1.ConditionReleaseVerified).Message)

	// Each machine also said so in an event.
	evs, err := l.kube.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	assert.NilError(t, err)
	warned := map[string]string{}
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "Machine" && ev.Type == "Warning" && strings.Contains(ev.Note, bad.Version) && strings.Contains(ev.Note, "rootfs.squashfs") {
			warned[ev.Regarding.Name] = ev.Reason + ": " + ev.Note
		}
	}
	for _, n := range machineNames(l) {
		assert.Assert(t, warned[n] != "", "no Warning event on Machine %s names %s and rootfs.squashfs", n, bad.Version)
	}
	t.Logf("node-1 event: %s", warned["node-1"])

	l.w.settle(t)
	assert.Equal(t, len(l.w.grants(from)), 0, "turns granted for a corrupt release: %v", grantNames(l.w.grants(from)))
	for _, n := range machineNames(l) {
		for _, p := range l.w.phases(n, from) {
			assert.Equal(t, p, string(likenv1.MachineDownloading), "machine %s", n)
		}
	}
	l.checkBootedAndStaged()
}
