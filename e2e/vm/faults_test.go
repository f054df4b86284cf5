//go:build vmfaults

// The fault scenarios run with make test-vm (go test -tags vmfaults): each
// boots its own machine and takes minutes in software emulation.

package vme2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	clirelease "liken.sh/liken/cli/release"
	"liken.sh/liken/node/watchdog"
)

// oneMachine boots vm-1 on a first release, with cluster-operator running
// and the Cluster's trial timeout set to trialTimeout.
func oneMachine(t *testing.T, trialTimeout time.Duration) (*lab, *vm, *clirelease.Result) {
	l := newLab(t)
	l.trialTimeout = trialTimeout
	r1 := l.variant("2026.12.01-001", nil)
	m := l.install("vm-1", l.fleet(r1, "vm-1"), r1)
	// It approves the machine's certificate.
	l.startOperator()
	m.powerOn()
	t.Logf("vm-1: Node Ready %s after power on", m.waitNodeReady(8*time.Minute).Round(time.Second))
	l.waitRelease([]*vm{m}, r1.Version, "A", 3*time.Minute)
	return l, m, r1
}

// waitTrialFailed waits until the machine reports a failed trial, back on
// version from slot A.
func (m *vm) waitTrialFailed(version string, timeout time.Duration) string {
	m.l.t.Helper()
	var reason string
	poll.WaitOn(m.l.t, func(poll.LogT) poll.Result {
		st := m.machine().Status
		for _, c := range st.Conditions {
			if c.Type == likenv1.ConditionTrialFailed && c.Status == metav1.ConditionTrue && st.Version == version && st.Slot == "A" {
				reason = c.Message
				return poll.Success()
			}
		}
		return poll.Continue("%s: %s on %q from slot %q, no failed trial yet", m.name, st.Phase, st.Version, st.Slot)
	}, poll.WithTimeout(timeout), poll.WithDelay(2*time.Second))
	return reason
}

// waitConsole waits until the machine's console shows marker and returns
// that line.
func (m *vm) waitConsole(marker string, timeout time.Duration) string {
	m.l.t.Helper()
	var line string
	poll.WaitOn(m.l.t, func(poll.LogT) poll.Result {
		if l, ok := m.qemu.Find(marker); ok {
			line = l
			return poll.Success()
		}
		return poll.Continue("%s: console does not show %q yet", m.name, marker)
	}, poll.WithTimeout(timeout), poll.WithDelay(200*time.Millisecond))
	return line
}

// TestHungTrialEndsByTheWatchdog: a trial boot whose liken-node never
// starts hangs as far as liken is concerned; the watchdog liken-boot armed
// with what is left of the Cluster's trial timeout (longer than its own
// first 180 s, so a slow boot is not cut short) resets the machine, and
// GRUB boots the proven slot.
func TestHungTrialEndsByTheWatchdog(t *testing.T) {
	l, m, r1 := oneMachine(t, 5*time.Minute)
	hung := l.variant("2026.12.01-002", func(root string) {
		assert.NilError(t, os.Remove(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/liken-node.service")))
	})
	l.moveTo(hung)
	m.waitConsole("liken-boot: booting slot B (trial true)", 10*time.Minute)
	began := time.Now()
	line := m.waitConsole(watchdogArmed, 2*time.Minute)
	armed := time.Now()
	within, _, _ := strings.Cut(strings.TrimSpace(line[strings.Index(line, watchdogArmed)+len(watchdogArmed):]), " ")
	timeout, err := time.ParseDuration(within)
	assert.NilError(t, err, "%q", line)
	assert.Check(t, is.Contains(line, "(what is left of the trial timeout of 5m0s)"))
	assert.Assert(t, timeout > watchdog.InitTimeout && timeout <= 5*time.Minute, "%s", line)
	m.waitConsole("liken-boot: booting slot A (trial false)", timeout+3*time.Minute)
	// Not before the watchdog was due (the console's timing is coarse).
	assert.Assert(t, time.Since(armed) > timeout-15*time.Second, "reset %s after the watchdog was armed for %s", time.Since(armed), timeout)
	t.Logf("vm-1: the watchdog reset the hung trial %s after the trial boot began (armed for %s)", time.Since(began).Round(time.Second), timeout)
	t.Logf("vm-1: reports %q", m.waitTrialFailed(r1.Version, 5*time.Minute))
}

// TestKubeletThatNeverStartsIsNeverProven: the trial boot's kubelet never
// starts, so the Node still reads Ready from the boot before. liken-node
// does not commit on that stale status; the trial timeout reboots the
// machine into the proven slot.
func TestKubeletThatNeverStartsIsNeverProven(t *testing.T) {
	l, m, r1 := oneMachine(t, 2*time.Minute)
	noKubelet := l.variant("2026.12.01-002", func(root string) {
		assert.NilError(t, os.Remove(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/kubelet.service")))
	})
	l.moveTo(noKubelet)
	m.waitConsole("liken-boot: booting slot B (trial true)", 10*time.Minute)
	reason := m.waitTrialFailed(r1.Version, 10*time.Minute)
	t.Logf("vm-1: reports %q", reason)
	_, committed := m.qemu.Find("Trial succeeded")
	assert.Assert(t, !committed, "the trial committed without a kubelet")
	slots := m.machine().Status.Slots
	named := false
	for _, s := range slots {
		if s.Version == noKubelet.Version {
			named = true
			assert.Equal(t, s.State, likenv1.SlotFailed)
		}
	}
	assert.Assert(t, named, "no slot names release %s: %+v", noKubelet.Version, slots)
}

// TestPowerLossDuringTrialBoot: the power goes while the trial slot
// boots; on power on, GRUB boots the proven slot, and the machine reports
// the failed trial there.
func TestPowerLossDuringTrialBoot(t *testing.T) {
	l, m, r1 := oneMachine(t, 10*time.Minute)
	r2 := l.variant("2026.12.01-002", nil)
	l.moveTo(r2)
	m.waitConsole("liken-boot: booting slot B (trial true)", 10*time.Minute)
	m.qemu.Kill()
	m.powerOn()
	m.waitConsole("liken-boot: booting slot A (trial false)", 2*time.Minute)
	t.Logf("vm-1: reports %q", m.waitTrialFailed(r1.Version, 5*time.Minute))
}

// TestPowerLossDuringDownload: the power goes while the machine downloads
// the next release; on power on it boots its proven slot, downloads again,
// and completes the upgrade.
func TestPowerLossDuringDownload(t *testing.T) {
	l, m, _ := oneMachine(t, 10*time.Minute)
	r2 := l.variant("2026.12.01-002", nil)
	l.moveTo(r2)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if d := m.machine().Status.Download; d != nil && d.BytesDone > 0 {
			return poll.Success()
		}
		return poll.Continue("vm-1 has not reported download progress")
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(500*time.Millisecond))
	m.qemu.Kill()
	m.powerOn()
	m.waitConsole("liken-boot: booting slot A (trial false)", 2*time.Minute)
	start := time.Now()
	l.waitRelease([]*vm{m}, r2.Version, "B", 15*time.Minute)
	t.Logf("vm-1: upgraded %s after the power came back", time.Since(start).Round(time.Second))
	_, ok := m.qemu.Find("liken-boot: booting slot B (trial true)")
	assert.Assert(t, ok)
}
