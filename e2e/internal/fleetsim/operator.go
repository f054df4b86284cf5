package fleetsim

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"liken.sh/liken/cli/lab/controlplane"
)

// Operator is one cluster-operator process, stopped when the test ends.
type Operator struct {
	// ID is its --identity.
	ID string
	// Metrics is the address of its metrics, health and readiness server.
	Metrics string
	// Started is when the process started.
	Started time.Time
	// Code is its exit code, once Exited.
	Code int

	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// StartOperator runs the cluster-operator binary (see Binary) as
// liken:cluster-operator on cp with identity id, verbosity 2 and the given
// extra flags. When the test ends it is sent SIGCONT and SIGTERM (SIGKILL
// after 15 s); a failed test gets the tail of its log.
func StartOperator(t testing.TB, cp *controlplane.ControlPlane, id string, flags ...string) *Operator {
	t.Helper()
	bin := Binary(t, "cluster-operator")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	logPath := filepath.Join(cp.Dir, "logs", fmt.Sprintf("operator-%s-%d.log", id, time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	assert.NilError(t, err)
	defer logFile.Close()
	args := append([]string{"--kubeconfig", cp.OperatorKubeconfig, "--identity", id, "--metrics-bind-address", addr, "-v", "2"}, flags...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	p := &Operator{ID: id, Metrics: addr, Started: time.Now(), cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			p.Code = exit.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("===== cluster-operator %s (%s) =====\n%s", id, logPath, b)
		}
	})
	t.Logf("started cluster-operator %s (pid %d) %s", id, cmd.Process.Pid, strings.Join(flags, " "))
	return p
}

// Signal sends sig to the process.
func (p *Operator) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	assert.NilError(t, syscall.Kill(p.cmd.Process.Pid, sig))
}

// Exited reports whether the process has exited (Code is then set).
func (p *Operator) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log is everything the process has logged so far.
func (p *Operator) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	assert.NilError(t, err)
	return string(b)
}

// Fetch GETs a path of the process's metrics server, with token as its
// bearer token unless empty, and returns the status code and body.
func (p *Operator) Fetch(t testing.TB, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+p.Metrics+path, nil)
	assert.NilError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}
