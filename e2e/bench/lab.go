package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
)

// LabStatus is the JSON of `liken lab status -o json`.
type LabStatus struct {
	Name       string `json:"name"`
	Dir        string `json:"dir"`
	Kubeconfig string `json:"kubeconfig"`
	Channel    string `json:"channel"`
	Processes  []struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		PID  int    `json:"pid"`
	} `json:"processes"`
	Machines []struct {
		Name       string `json:"name"`
		Role       string `json:"role"`
		Kubeconfig string `json:"kubeconfig"`
	} `json:"machines"`
}

// Lab is a `liken lab` fleet driven through the liken binary, as a user
// drives it. liken lab down runs when the test ends.
type Lab struct {
	t    testing.TB
	name string
	bin  string
	env  []string
	// Status is what liken lab status said last.
	Status LabStatus
	// Config reaches the lab's API server as its admin.
	Config *rest.Config
	// Liken is an admin client.
	Liken versioned.Interface
}

// LabOptions are the flags of liken lab up.
type LabOptions struct {
	Name              string
	Machines, Leaders int
	// Timeout bounds liken lab up.
	Timeout time.Duration
}

// StartLab runs liken lab up --reboot-policy Auto with its own
// LIKEN_LAB_HOME.
func StartLab(t testing.TB, o LabOptions) *Lab {
	t.Helper()
	bin := fleetsim.BinDir(t, "liken", "liken-node", "cluster-operator", "kube", "kubectl")
	l := &Lab{t: t, name: o.Name, bin: bin}
	home := t.TempDir()
	if d := os.Getenv("LIKEN_BENCH_LOGS"); d != "" {
		must(t, os.MkdirAll(d, 0o755))
		var err error
		home, err = os.MkdirTemp(d, "lab-")
		must(t, err)
		t.Logf("the lab's files are kept in %s", home)
	}
	l.env = append(os.Environ(), "LIKEN_LAB_HOME="+home, "LIKEN_BIN="+bin)
	t.Cleanup(func() {
		if keep := os.Getenv("LIKEN_BENCH_LOGS"); keep != "" && l.Status.Dir != "" {
			// liken lab down removes the lab's folder: keep its logs.
			_ = filepath.WalkDir(l.Status.Dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") {
					return nil
				}
				rel, _ := filepath.Rel(l.Status.Dir, p)
				dst := filepath.Join(home, "logs", rel)
				if b, err := os.ReadFile(p); err == nil && os.MkdirAll(filepath.Dir(dst), 0o755) == nil {
					_ = os.WriteFile(dst, b, 0o644)
				}
				return nil
			})
		}
		if t.Failed() && l.Status.Dir != "" {
			logTails(t, l.Status.Dir)
		}
		if out, err := l.Run(2*time.Minute, "lab", "down", "--name", o.Name); err != nil {
			t.Errorf("liken lab down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	out, err := l.Run(o.Timeout+time.Minute, "lab", "up", "--name", o.Name, "--machines", fmt.Sprint(o.Machines),
		"--leaders", fmt.Sprint(o.Leaders), "--reboot-policy", "Auto", "--timeout", o.Timeout.String())
	must(t, err)
	if !regexp.MustCompile(`(?m)^export KUBECONFIG=\S+$`).MatchString(out) {
		t.Fatalf("liken lab up printed no export KUBECONFIG= line:\n%s", out)
	}
	t.Logf("lab %s of %d machines up in %s", o.Name, o.Machines, time.Since(start).Round(100*time.Millisecond))
	l.Refresh()
	l.Config, err = clientcmd.BuildConfigFromFlags("", l.Status.Kubeconfig)
	must(t, err)
	l.Config.QPS, l.Config.Burst = 100, 200
	l.Liken, err = versioned.NewForConfig(l.Config)
	must(t, err)
	return l
}

// logTails logs the last lines of the lab's cluster-operator and machine
// logs, for a failed test (liken lab down removes them).
func logTails(t testing.TB, dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasPrefix(d.Name(), "cluster-operator") || d.Name() == "machine.log") || !strings.HasSuffix(p, ".log") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		lines = lines[max(0, len(lines)-40):]
		rel, _ := filepath.Rel(dir, p)
		t.Logf("===== the last lines of %s =====\n%s", rel, strings.Join(lines, "\n"))
		return nil
	})
}

// Run runs the liken binary with the lab's environment and returns its
// standard output (standard error too, on failure).
func (l *Lab) Run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(l.bin, "liken"), args...)
	cmd.Env = l.env
	// A killed command whose children still hold its output ends anyway.
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("liken %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Refresh reads liken lab status again.
func (l *Lab) Refresh() {
	l.t.Helper()
	must(l.t, l.refresh())
}

// refresh is Refresh returning its error, for a poll's check (which runs
// in a goroutine of its own, where t.Fatal would end only that goroutine).
func (l *Lab) refresh() error {
	out, err := l.Run(time.Minute, "lab", "status", "--name", l.name, "-o", "json")
	if err != nil {
		return err
	}
	var st LabStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return fmt.Errorf("liken lab status -o json: %w", err)
	}
	l.Status = st
	return nil
}

// MachinePID is the PID of the firmware process of a machine.
func (l *Lab) MachinePID(machine string) int {
	for _, p := range l.Status.Processes {
		if p.Kind == "machine" && p.Name == machine {
			return p.PID
		}
	}
	return 0
}

// OperatorPIDs are the PIDs of the lab's cluster-operator processes.
func (l *Lab) OperatorPIDs() []int {
	var out []int
	for _, p := range l.Status.Processes {
		if p.Kind == "operator" {
			out = append(out, p.PID)
		}
	}
	return out
}

// Publish builds the next release into the lab's channel and returns its
// catalog entry.
func (l *Lab) Publish() (version, digest string) {
	l.t.Helper()
	out, err := l.Run(5*time.Minute, "lab", "publish", "--name", l.name)
	must(l.t, err)
	v := regexp.MustCompile(`(?m)^- version: "([^"]+)"$`).FindStringSubmatch(out)
	d := regexp.MustCompile(`(?m)^  digest: (sha256:[0-9a-f]{64})$`).FindStringSubmatch(out)
	if v == nil || d == nil {
		l.t.Fatalf("liken lab publish printed no catalog entry:\n%s", out)
	}
	return v[1], d[1]
}

// Describe is where the rollout stands, as `liken rollout status
// --watch=false` prints it: for the message of a wait that failed.
func (l *Lab) Describe() string {
	out, err := l.Run(30*time.Second, "rollout", "status", l.name, "--watch=false", "--kubeconfig", l.Status.Kubeconfig)
	if err != nil {
		out = fmt.Sprintf("(liken rollout status: %v)", err)
	}
	// The pods and budgets, for a drain that does not end.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc, _ := exec.CommandContext(ctx, filepath.Join(l.bin, "kubectl"), "--kubeconfig", l.Status.Kubeconfig, "get", "nodes,pods,pdb", "-A", "-o", "wide").CombinedOutput()
	// A budget's status and the pods' conditions: what the Eviction API
	// and the disruption controller go by.
	detail, _ := exec.CommandContext(ctx, filepath.Join(l.bin, "kubectl"), "--kubeconfig", l.Status.Kubeconfig, "get", "pods,pdb", "-n", "liken-system", "-o",
		`jsonpath={range .items[*]}{.kind} {.metadata.name} on {.spec.nodeName}: {.status.conditions} {.status.disruptionsAllowed} {.status.currentHealthy}/{.status.expectedPods} observed {.status.observedGeneration} disrupted {.status.disruptedPods}{"\n"}{end}`).CombinedOutput()
	return out + "\n" + string(kc) + "\n" + string(detail)
}

// Patch applies a JSON patch to the lab's Cluster.
func (l *Lab) Patch(patch string) {
	l.t.Helper()
	_, err := l.Liken.LikenV1alpha1().Clusters().Patch(context.Background(), l.name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	must(l.t, err)
}
