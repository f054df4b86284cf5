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
	// PID is its process ID.
	PID int
	// LogPath is the file its output goes to.
	LogPath string
	// Metrics is the address of its metrics, health and readiness server.
	Metrics string
	// Started is when the process started.
	Started time.Time
	// Code is its exit code, once Exited.
	Code int

	cmd  *exec.Cmd
	err  error
	done chan struct{}
}

// OperatorOptions shape a cluster-operator process.
type OperatorOptions struct {
	// ID is its --identity.
	ID string
	// Kubeconfig is the kubeconfig it runs with; empty: the control
	// plane's, as liken:cluster-operator.
	Kubeconfig string
	// Verbosity is its -v.
	Verbosity int
	// Flags are extra flags, after the others.
	Flags []string
}

// StartOperator runs the cluster-operator binary (see Binary) as
// liken:cluster-operator on cp with identity id, verbosity 2 and the given
// extra flags. When the test ends it is sent SIGCONT and SIGTERM (SIGKILL
// after 15 s); a failed test gets the tail of its log.
func StartOperator(t testing.TB, cp *controlplane.ControlPlane, id string, flags ...string) *Operator {
	t.Helper()
	return RunOperator(t, cp, OperatorOptions{ID: id, Verbosity: 2, Flags: flags})
}

// RunOperator runs the cluster-operator binary (see Binary) on cp as o
// says, its log in cp's logs folder. When the test ends it is sent SIGCONT
// and SIGTERM (SIGKILL after 15 s); a failed test gets the tail of its log.
func RunOperator(t testing.TB, cp *controlplane.ControlPlane, o OperatorOptions) *Operator {
	t.Helper()
	bin := Binary(t, "cluster-operator")
	if o.Kubeconfig == "" {
		o.Kubeconfig = cp.OperatorKubeconfig
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	logPath := filepath.Join(cp.Dir, "logs", fmt.Sprintf("operator-%s-%d.log", o.ID, time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	assert.NilError(t, err)
	defer logFile.Close()
	args := append([]string{"--kubeconfig", o.Kubeconfig, "--identity", o.ID, "--metrics-bind-address", addr, "-v", fmt.Sprint(o.Verbosity)}, o.Flags...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	p := &Operator{ID: o.ID, PID: cmd.Process.Pid, LogPath: logPath, Metrics: addr, Started: time.Now(), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		var exit *exec.ExitError
		if errors.As(p.err, &exit) {
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
			t.Logf("===== cluster-operator %s (%s) =====\n%s", o.ID, logPath, b)
		}
	})
	t.Logf("started cluster-operator %s (pid %d) %s", o.ID, cmd.Process.Pid, strings.Join(o.Flags, " "))
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

// ExitError is nil while the process runs, and once it exited an error
// that says how and where its log is.
func (p *Operator) ExitError() error {
	if !p.Exited() {
		return nil
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) {
		return fmt.Errorf("cluster-operator %s exited with code %d; see %s", p.ID, exit.ExitCode(), p.LogPath)
	}
	return fmt.Errorf("cluster-operator %s exited (%v); see %s", p.ID, p.err, p.LogPath)
}

// Log is everything the process has logged so far.
func (p *Operator) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(p.LogPath)
	assert.NilError(t, err)
	return string(b)
}

// Ready is true once the process answers /readyz with 200.
func (p *Operator) Ready() bool {
	resp, err := http.Get("http://" + p.Metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
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
