package bench

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BinDir is $LIKEN_BIN, or _output/bin of the source tree holding the
// working directory.
func BinDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("LIKEN_BIN"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	must(t, err)
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "_output", "bin")
		}
	}
	t.Fatalf("no go.mod above %s: set LIKEN_BIN to the folder that holds liken's binaries", wd)
	return ""
}

// Binary is the path of one of liken's binaries; a missing one fails the
// test with what to do.
func Binary(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(BinDir(t), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found (%v): run make build, or set LIKEN_BIN to the folder that holds it", p, err)
	}
	return p
}

// Operator is one cluster-operator process.
type Operator struct {
	// PID is its process ID.
	PID int
	// Log is the file its output goes to.
	Log string
	// Metrics is the address of its /metrics.
	Metrics string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartOperator runs cluster-operator with kubeconfig and extra flags; it
// is stopped (SIGTERM) when the test ends.
func StartOperator(t testing.TB, kubeconfig, logPath string, flags ...string) *Operator {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close()
	logFile, err := os.Create(logPath)
	must(t, err)
	defer logFile.Close()
	args := append([]string{"--kubeconfig", kubeconfig, "--identity", "bench", "--metrics-bind-address", addr}, flags...)
	cmd := exec.Command(Binary(t, "cluster-operator"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	o := &Operator{PID: cmd.Process.Pid, Log: logPath, Metrics: addr, cmd: cmd, done: make(chan struct{})}
	go func() {
		o.err = cmd.Wait()
		close(o.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-o.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-o.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("===== cluster-operator log (%s) =====\n%s", logPath, b)
		}
	})
	return o
}

// Exited returns an error when the process is gone.
func (o *Operator) Exited() error {
	select {
	case <-o.done:
		var exit *exec.ExitError
		if errors.As(o.err, &exit) {
			return fmt.Errorf("cluster-operator exited with code %d; see %s", exit.ExitCode(), o.Log)
		}
		return fmt.Errorf("cluster-operator exited (%v); see %s", o.err, o.Log)
	default:
		return nil
	}
}

// Ready is true once the operator answers /readyz.
func (o *Operator) Ready() bool {
	resp, err := http.Get("http://" + o.Metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
