// Package userlab runs the user's liken lab commands for end-to-end tests of fleets that run liken's OS image, and checks what must hold through them.
package userlab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/e2e/internal/apiprobe"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/srctree"
)

// Kind is the flag of liken lab up that chooses the lab's machines.
type Kind string

const (
	// VM: virtual machines under QEMU (liken lab up --vm).
	VM Kind = "--vm"
	// Containers: machines in Linux namespaces above the host's kernel
	// (liken lab up --containers).
	Containers Kind = "--containers"
)

// Lab is a lab that the user's commands run, in a lab home of the test's
// own, with the clients of the kubeconfig liken lab up prints.
type Lab struct {
	T    *testing.T
	Name string
	// St is what liken lab status -o json printed after lab up.
	St clilab.State
	// Kubeconfig is the file of the KUBECONFIG lab up prints.
	Kubeconfig string
	Cfg        *rest.Config
	Kube       kubernetes.Interface
	Liken      versioned.Interface

	bin, repo string
	env       []string
	down      bool
}

// Up runs liken lab up with the kind's flag, machines, leaders of them
// and Auto reboots, and liken lab down at the test's end; it logs the
// consoles' ends when the test fails. It checks what a user relies on:
// this computer runs only the lab's servers and its machines; every
// machine's real kubelet reports its Node Ready; the kubeconfig reaches
// the API through the endpoint; cluster-operator's two copies run on the
// fleet.
func Up(t *testing.T, kind Kind, name string, machines, leaders int) *Lab {
	t.Helper()
	repo, err := srctree.Find()
	assert.NilError(t, err)
	bin := filepath.Dir(fleetsim.Binary(t, "liken"))
	home := t.TempDir()
	l := &Lab{T: t, Name: name, bin: bin, repo: repo,
		env: append(os.Environ(), "LIKEN_LAB_HOME="+home, "LIKEN_BIN="+bin, "LIKEN_LAB_STARTUP_GRACE=2s")}
	start := time.Now()
	up := []string{"lab", "up", "--name", name, string(kind), "--machines", fmt.Sprint(machines), "--leaders", fmt.Sprint(leaders), "--reboot-policy", "Auto"}
	b, err := l.command(up...).CombinedOutput()
	out := string(b)
	if err != nil {
		// The lab's folder goes with the test's: its consoles are the
		// only account of why the machines did not come up.
		logConsoles(t, filepath.Join(home, name, "machines"))
		// A lab that failed to come up stopped its processes; down
		// removes what is left, and may find nothing to remove.
		_ = l.command("lab", "down", "--name", name).Run()
		t.Fatalf("liken %s: %v\n%s", strings.Join(up, " "), err, out)
	}
	t.Cleanup(func() {
		if !l.down {
			l.Run("lab", "down", "--name", name)
		}
	})
	t.Logf("lab up %s --machines %d --leaders %d: %s", kind, machines, leaders, time.Since(start).Round(time.Second))
	m := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']+)'$`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "no export KUBECONFIG= line:\n%s", out)
	assert.NilError(t, json.Unmarshal([]byte(l.Run("lab", "status", "--name", name, "-o", "json")), &l.St))
	// This computer runs only the channel, the endpoint, the lab's name
	// server and registry, the machines and, for virtual machines, the
	// segment's switch.
	want := map[string]int{clilab.KindChannel: 1, clilab.KindEndpoint: 1, clilab.KindNames: 1, clilab.KindRegistry: 1, clilab.KindMachine: machines}
	switch kind {
	case VM:
		assert.Assert(t, l.St.VM)
		want[clilab.KindSegment] = 1
	case Containers:
		assert.Assert(t, l.St.Containers)
	}
	kinds := map[string]int{}
	for _, p := range l.St.Processes {
		kinds[p.Kind]++
	}
	assert.DeepEqual(t, kinds, want)
	t.Cleanup(func() {
		if t.Failed() {
			logConsoles(t, filepath.Join(home, name, "machines"))
		}
	})

	l.Kubeconfig = m[1]
	l.Cfg, err = clientcmd.BuildConfigFromFlags("", m[1])
	assert.NilError(t, err)
	// A request to a leader that went away fails rather than hangs; the
	// probe's own requests have their deadline. The probe and the test's
	// reads share the client: no client-side throttling between them.
	l.Cfg.Timeout, l.Cfg.QPS, l.Cfg.Burst = 30*time.Second, 50, 100
	l.Kube, err = kubernetes.NewForConfig(l.Cfg)
	assert.NilError(t, err)
	l.Liken, err = versioned.NewForConfig(l.Cfg)
	assert.NilError(t, err)
	var nodes *corev1.NodeList
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ns, err := l.Kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return poll.Continue("the Nodes: %v", err)
		}
		nodes = ns
		for _, n := range nodes.Items {
			if !NodeReady(&n) {
				return poll.Continue("Node %s is not Ready", n.Name)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(2*time.Second))
	assert.Equal(t, len(nodes.Items), machines)
	for _, n := range nodes.Items {
		// A real kubelet, not kwok's.
		assert.Assert(t, strings.HasPrefix(n.Status.NodeInfo.KubeletVersion, "v1.37"), n.Status.NodeInfo.KubeletVersion)
		assert.Assert(t, strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") && strings.Contains(n.Status.NodeInfo.ContainerRuntimeVersion, "2.2.9"), n.Status.NodeInfo.ContainerRuntimeVersion)
	}
	// The kubeconfig reaches the leaders' own API servers through the
	// endpoint, and cluster-operator runs on the fleet.
	assert.Equal(t, l.Cfg.Host, l.St.Endpoint)
	OperatorOnFleet(t, l.Kube, 2)
	return l
}

// controlPlaneLine is a console line about a leader's datastore or API
// server: what a lab whose API never answered needs first.
var controlPlaneLine = regexp.MustCompile(`etcd|kube-apiserver|liken-control-plane`)

// logConsoles logs each machine's console in dir (a lab's machines
// folder): its last 40 lines about the control plane, then its last
// 4,000 bytes.
func logConsoles(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "machine.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Logf("%s: %v", f, err)
			continue
		}
		name, s := filepath.Base(filepath.Dir(f)), string(b)
		var cp []string
		for _, line := range strings.Split(s, "\n") {
			if controlPlaneLine.MatchString(line) {
				cp = append(cp, line)
			}
		}
		t.Logf("%s console, its last 40 lines about the control plane:\n%s", name, strings.Join(cp[max(0, len(cp)-40):], "\n"))
		t.Logf("%s console, last 4000 bytes:\n%s", name, s[max(0, len(s)-4000):])
	}
}

// command is liken with args in the lab's environment.
func (l *Lab) command(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(l.bin, "liken"), args...)
	cmd.Dir, cmd.Env = l.repo, l.env
	return cmd
}

// Run runs liken with args in the lab's environment, fails the test if
// it fails, and returns its output.
func (l *Lab) Run(args ...string) string {
	l.T.Helper()
	out, err := l.command(args...).CombinedOutput()
	assert.NilError(l.T, err, "liken %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// Down runs liken lab down, which Up otherwise runs at the test's end.
func (l *Lab) Down() {
	l.T.Helper()
	l.Run("lab", "down", "--name", l.Name)
	l.down = true
}

// Publish runs liken lab publish (with --fault when fault is not empty)
// and returns the catalog entry it prints.
func (l *Lab) Publish(fault string) (version, digest string) {
	l.T.Helper()
	args := []string{"lab", "publish", "--name", l.Name}
	if fault != "" {
		args = append(args, "--fault", fault)
	}
	out := l.Run(args...)
	v := regexp.MustCompile(`version: "([^"]+)"`).FindStringSubmatch(out)
	d := regexp.MustCompile(`digest: (sha256:[0-9a-f]+)`).FindStringSubmatch(out)
	assert.Assert(l.T, v != nil && d != nil, "lab publish printed no catalog entry:\n%s", out)
	return v[1], d[1]
}

// MoveTo catalogues the release and sets the Cluster's spec.version to it.
func (l *Lab) MoveTo(version, digest string) {
	l.T.Helper()
	clusters := l.Liken.LikenV1alpha1().Clusters()
	assert.NilError(l.T, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := clusters.Get(l.T.Context(), l.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: version, Digest: digest})
		c.Spec.Version = version
		_, err = clusters.Update(l.T.Context(), c, metav1.UpdateOptions{})
		return err
	}))
}

// Machine reads the Machine called name.
func (l *Lab) Machine(name string) *likenv1.Machine {
	l.T.Helper()
	m, err := l.Liken.LikenV1alpha1().Machines().Get(l.T.Context(), name, metav1.GetOptions{})
	assert.NilError(l.T, err)
	return m
}

// StartProbe runs an API probe through kube until the returned function,
// which waits (a minute at most) for the API to answer if it does not,
// stops the probe and returns its report.
func StartProbe(ctx context.Context, kube kubernetes.Interface) (*apiprobe.Probe, func(*testing.T) apiprobe.Report) {
	probe := &apiprobe.Probe{Client: kube}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); probe.Run(ctx) }()
	return probe, func(t *testing.T) apiprobe.Report {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if r := probe.Report(); r.Longest.Ongoing {
				return poll.Continue("the API does not answer the probe: %s", r)
			}
			return poll.Success()
		}, poll.WithTimeout(time.Minute), poll.WithDelay(apiprobe.DefaultInterval))
		cancel()
		<-done
		return probe.Report()
	}
}

// OperatorOnFleet waits until cluster-operator's Deployment has replicas
// available, each pod running on a leader of the fleet (a Node labelled
// likenv1.LeaderNodeLabel), never on a worker.
func OperatorOnFleet(t *testing.T, kube kubernetes.Interface, replicas int32) {
	t.Helper()
	ctx := t.Context()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		d, err := kube.AppsV1().Deployments(likenv1.SystemNamespace).Get(ctx, "cluster-operator", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("cluster-operator's Deployment: %v", err)
		}
		if d.Status.AvailableReplicas != replicas {
			return poll.Continue("cluster-operator: %d of %d replicas available", d.Status.AvailableReplicas, replicas)
		}
		pods, err := kube.CoreV1().Pods(likenv1.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cluster-operator", FieldSelector: "status.phase=Running"})
		if err != nil {
			return poll.Continue("cluster-operator's pods: %v", err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" {
				return poll.Continue("pod %s runs on no Node", p.Name)
			}
			// Only on leaders, which their control-plane init labelled.
			n, err := kube.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
			if err != nil {
				return poll.Continue("Node %s: %v", p.Spec.NodeName, err)
			}
			if _, ok := n.Labels[likenv1.LeaderNodeLabel]; !ok {
				return poll.Error(fmt.Errorf("cluster-operator's pod %s runs on %s, which is not labelled %s (a worker)", p.Name, n.Name, likenv1.LeaderNodeLabel))
			}
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
}

// NodeReady tells whether a Node reads Ready.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
