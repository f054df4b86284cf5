// Package prometheus runs a real Prometheus server for tests: Debian's package, unpacked under _output/prometheus, on a loopback port, firing the alerts a test names.
package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"liken.sh/liken/internal/debpkg"
	"liken.sh/liken/internal/srctree"
)

// Server is a running Prometheus.
type Server struct {
	// URL is the server's address, such as http://127.0.0.1:41234.
	URL   string
	t     testing.TB
	rules string // the rule file
	log   string // its log file
}

// Start fetches Debian's prometheus package (once; later runs reuse
// _output/prometheus), starts the server on a loopback port, evaluating its
// rules every second, and returns once the alerts named fire. The server
// stops when the test ends.
func Start(t testing.TB, alerts ...string) *Server {
	t.Helper()
	repo, err := srctree.Find()
	assert.NilError(t, err)
	root, err := debpkg.Unpack(filepath.Join(repo, "_output", "prometheus"), []string{"prometheus"}, t.Logf)
	assert.NilError(t, err, "Prometheus comes from Debian's prometheus package")
	dir := t.TempDir()
	s := &Server{t: t, rules: filepath.Join(dir, "rules.yml"), log: filepath.Join(dir, "prometheus.log")}
	config := filepath.Join(dir, "prometheus.yml")
	assert.NilError(t, os.WriteFile(config, []byte("global:\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n"), 0o644))
	s.writeRules(alerts)

	// A free port, which another process may take before the server
	// binds it: then again with another.
	for try := 1; ; try++ {
		err := s.run(filepath.Join(root, "usr", "bin", "prometheus"), config, dir)
		if err == nil {
			break
		}
		if try == 3 || !strings.Contains(s.lastLog(), "address already in use") {
			t.Fatalf("starting prometheus: %v", err)
		}
	}
	s.waitFiring(alerts)
	return s
}

// run starts the server on a free loopback port and returns once it is
// ready, or why it is not.
func (s *Server) run(bin, config, dir string) error {
	t := s.t
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	s.URL = "http://" + addr
	logFile, err := os.Create(s.log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(bin,
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--web.enable-lifecycle",
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// It dies with the test binary, even one killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-exited:
			return fmt.Errorf("prometheus exited: %s", s.lastLog())
		case <-time.After(100 * time.Millisecond):
		}
		if resp, err := http.Get(s.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prometheus at %s was not ready within a minute: %s", s.URL, s.lastLog())
		}
	}
}

// Fire sets the alerts that fire: each named one has a rule that always
// holds, and no other rule is left. It returns once the server's
// /api/v1/alerts says exactly these fire.
func (s *Server) Fire(alerts ...string) {
	s.t.Helper()
	s.writeRules(alerts)
	resp, err := http.Post(s.URL+"/-/reload", "", nil)
	assert.NilError(s.t, err)
	resp.Body.Close()
	assert.Equal(s.t, resp.StatusCode, http.StatusOK, "prometheus refused to reload its rules: %s", s.lastLog())
	s.waitFiring(alerts)
}

func (s *Server) writeRules(alerts []string) {
	var b strings.Builder
	b.WriteString("groups:\n- name: liken-test\n  rules:")
	if len(alerts) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, a := range alerts {
		fmt.Fprintf(&b, "  - alert: %s\n    expr: vector(1)\n", a)
	}
	assert.NilError(s.t, os.WriteFile(s.rules, []byte(b.String()), 0o644))
}

// waitFiring waits until /api/v1/alerts lists exactly alerts as firing.
func (s *Server) waitFiring(alerts []string) {
	s.t.Helper()
	want := slices.Sorted(slices.Values(alerts))
	poll.WaitOn(s.t, func(poll.LogT) poll.Result {
		got, err := s.firing()
		if err != nil {
			return poll.Continue("%v", err)
		}
		if !slices.Equal(got, want) {
			return poll.Continue("firing %v, want %v", got, want)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
}

// firing reads the names of the alerts that fire, sorted.
func (s *Server) firing() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/alerts", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var a struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, err
	}
	var names []string
	for _, al := range a.Data.Alerts {
		if al.State == "firing" {
			names = append(names, al.Labels["alertname"])
		}
	}
	slices.Sort(names)
	return names, nil
}

// lastLog is the end of the server's log.
func (s *Server) lastLog() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
