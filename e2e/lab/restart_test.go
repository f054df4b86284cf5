package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"liken.sh/liken/e2e/internal/fleetsim"
)

// TestLabStartsAgainAfterItsProcessesExit: after every process of a lab
// dies at once, as when the computer restarts, liken lab status says the
// lab is down and exits non-zero, naming what to run; liken lab up over it
// stops what is left and starts the lab again by itself (what make lab
// does), and the new lab reads as running.
func TestLabStartsAgainAfterItsProcessesExit(t *testing.T) {
	bin := fleetsim.BinDir(t, "liken", "liken-node", "cluster-operator", "kube", "kubectl")
	l := &lab{t: t, name: "e2e-restart", bin: bin}
	l.env = append(os.Environ(), "LIKEN_LAB_HOME="+t.TempDir(), "LIKEN_BIN="+bin, startupGraceEnv+"="+testGrace.String())
	t.Cleanup(l.down)
	up := []string{"lab", "up", "--name", l.name, "--machines", "2", "--leaders", "1", "--reboot-policy", "Auto"}
	l.mustLiken(up...)
	status := func() (labStatus, string, error) {
		var st labStatus
		out, _, err := l.run(nil, filepath.Join(l.bin, "liken"), "lab", "status", "--name", l.name, "-o", "json")
		assert.NilError(t, json.Unmarshal([]byte(out), &st), "lab status -o json printed no state:\n%s", out)
		return st, out, err
	}
	st, _, err := status()
	assert.NilError(t, err, "a lab just started reads as down")

	judged := 0 // the cluster-operator copies are judged by their supervisors
	for _, p := range st.Processes {
		if p.Kind != "operator" {
			judged++
		}
		pid := p.PID
		if p.Kind == "machine" {
			pid = -pid // the firmware and its node daemon
		}
		assert.NilError(t, syscall.Kill(pid, syscall.SIGKILL), "%s %s", p.Kind, p.Name)
	}
	// SIGKILL is sent, not yet done: a large process takes a moment to
	// exit, and a computer that restarted has none left. Wait for all.
	var down error
	allGone := fmt.Sprintf("lab e2e-restart is down: all of its %d processes have exited", judged)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, _, down = status(); down == nil || !strings.Contains(down.Error(), allGone) {
			return poll.Continue("liken lab status says %v", down)
		}
		return poll.Success()
	}, poll.WithDelay(200*time.Millisecond), poll.WithTimeout(30*time.Second))
	assert.Check(t, is.Contains(down.Error(), "lab e2e-restart is down: "))
	assert.Check(t, is.Contains(down.Error(), "Start it again with liken lab up --name e2e-restart"))

	began := time.Now()
	out, err := l.liken(up...)
	assert.NilError(t, err, "liken lab up over a lab that is down:\n%s", out)
	t.Logf("liken lab up started the lab again in %s", time.Since(began).Round(100*time.Millisecond))
	assert.Check(t, is.Contains(out, "The "+allGone))
	assert.Check(t, is.Contains(out, "stopping what is left of it and starting it again."))
	assert.Check(t, strings.Contains(out, "export KUBECONFIG="), "liken lab up printed no export line:\n%s", out)
	again, _, err := status()
	assert.NilError(t, err, "the lab started again reads as down")
	assert.Check(t, again.Processes[0].PID != st.Processes[0].PID, "the same processes as before")

	// A lab that runs is not replaced.
	out, err = l.liken(up...)
	assert.Check(t, err != nil, "liken lab up replaced a running lab:\n%s", out)
	assert.Check(t, is.Contains(out, "lab e2e-restart is already running"))
}
