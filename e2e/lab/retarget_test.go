package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// spec.version changes while every machine is still downloading the first
// target, over a slow channel: each machine stops that download, withdraws
// it, and downloads the second target into the same slot, where it is
// staged and, once approved, booted. The first target is never staged.
func TestRetargetMidDownload(t *testing.T) {
	// 8 MiB images served at 512 KiB/s per download: about 16 s each.
	l := startLab(t, "e2e-retarget", labOptions{env: []string{"LIKEN_LAB_IMAGE_MIB=8", "LIKEN_LAB_CHANNEL_RATE=524288"}})
	first, second := l.publish(""), l.publish("")
	from := l.setVersion(first.Version, first, second)

	l.waitFor("every machine to be part way through downloading "+first.Version, 2*time.Minute, func() (bool, string) {
		var not []string
		for _, m := range l.machines() {
			d := m.Status.Download
			if m.Status.Phase != likenv1.MachineDownloading || d == nil || d.Version != first.Version || d.BytesDone == 0 || d.BytesDone >= d.BytesTotal {
				not = append(not, fmt.Sprintf("%s %s %+v", m.Name, m.Status.Phase, d))
			}
		}
		return len(not) == 0, strings.Join(not, ", ")
	})
	var progress []string
	for _, m := range l.machines() {
		d := m.Status.Download
		progress = append(progress, fmt.Sprintf("%s %d/%d", m.Name, d.BytesDone, d.BytesTotal))
	}
	retarget := l.setVersion(second.Version)
	t.Logf("retargeted to %s with bytes of %s downloaded: %s", second.Version, first.Version, strings.Join(progress, ", "))

	l.waitFor("every machine to stage "+second.Version+" in slot B", 2*time.Minute, func() (bool, string) {
		var not []string
		for _, m := range l.machines() {
			if m.Status.Phase != likenv1.MachineUpdatePending || m.Status.Staged != second.Version || slotOf(&m, "B").State != likenv1.SlotStaged {
				not = append(not, fmt.Sprintf("%s %s staged %q slot B %+v", m.Name, m.Status.Phase, m.Status.Staged, slotOf(&m, "B")))
			}
		}
		return len(not) == 0, strings.Join(not, ", ")
	})
	l.w.settle(t)
	catalog, _ := l.w.trusted()
	for _, n := range machineNames(l) {
		// Slot B went (leaving out any moment it read Empty): the first
		// target downloading, the second target downloading, the second
		// target staged; the first was never staged, and slot A stayed
		// the machine's Active slot.
		var seq []string
		for _, r := range l.w.machineHistory(n, from) {
			m := r.obj
			s := slotOf(m, "B")
			step := string(s.State) + " " + s.Version
			if s.State != likenv1.SlotEmpty && (len(seq) == 0 || seq[len(seq)-1] != step) {
				seq = append(seq, step)
			}
			assert.Assert(t, !(s.Version == first.Version && s.State == likenv1.SlotStaged), "machine %s staged %s (revision %d)", n, first.Version, r.rv)
			assert.Equal(t, m.Status.Staged != first.Version, true, "machine %s reports %s staged (revision %d)", n, first.Version, r.rv)
			a := slotOf(m, "A")
			assert.Equal(t, a.State, likenv1.SlotActive, "machine %s slot A (revision %d)", n, r.rv)
		}
		t.Logf("%s slot B: %s", n, strings.Join(seq, " → "))
		assert.DeepEqual(t, seq, []string{"Downloading " + first.Version, "Downloading " + second.Version, "Staged " + second.Version})
		assert.Equal(t, slotOf(l.machine(n), "B").Digest, catalog[second.Version])
	}

	// Each machine said it stopped the first download.
	evs, err := l.kube.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	assert.NilError(t, err)
	stopped := map[string]string{}
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "Machine" && ev.Reason == "ReleaseWithdrawn" && strings.Contains(ev.Note, first.Version) {
			stopped[ev.Regarding.Name] = ev.Note
		}
	}
	for _, n := range machineNames(l) {
		assert.Assert(t, stopped[n] != "", "no ReleaseWithdrawn event on Machine %s names %s", n, first.Version)
	}
	t.Logf("node-1 event: %s", stopped["node-1"])

	// Approved, node-1 boots the second target from slot B.
	l.mustLiken("approve-reboot", l.name, "node-1")
	l.waitFor("node-1 to run "+second.Version+" from slot B", 2*time.Minute, func() (bool, string) {
		m := l.machine("node-1")
		return m.Status.Phase == likenv1.MachineReady && m.Status.Version == second.Version && m.Status.Slot == "B",
			fmt.Sprintf("%s %s slot %s", m.Status.Phase, m.Status.Version, m.Status.Slot)
	})
	l.w.settle(t)
	for _, g := range l.w.grants(retarget) {
		assert.Equal(t, g.spec, second.Version)
	}
	l.checkBootedAndStaged()
}

// slotOf returns a Machine's report of one slot.
func slotOf(m *likenv1.Machine, name string) likenv1.SlotStatus {
	for _, s := range m.Status.Slots {
		if s.Name == name {
			return s
		}
	}
	return likenv1.SlotStatus{Name: name}
}
