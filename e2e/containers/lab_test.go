package containers

import (
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
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/internal/srctree"
)

// TestLabUpContainers runs the user's commands on a namespace lab of two
// machines, one of them the leader running the fleet's control plane:
// liken lab up --containers gives a Ready Cluster whose Nodes are real
// kubelets on liken's image, with this computer running only the lab's
// servers; liken lab power cycle pulls a machine's power and it comes
// back with a new boot; liken lab down leaves no process, mount, network
// namespace or cgroup behind. (An upgrade through this lab, measured in
// docs/benchmarks.md, runs the same node agent, slots and firmware as
// TestFirmwareBootsATrialOnce and the VM and process labs' upgrades.)
func TestLabUpContainers(t *testing.T) {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	liken, err := srctree.Binary("liken")
	assert.NilError(t, err)
	home := t.TempDir()
	env := append(os.Environ(), "LIKEN_LAB_HOME="+home, "LIKEN_BIN="+filepath.Dir(liken), "LIKEN_LAB_STARTUP_GRACE=2s")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(liken, args...)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "liken %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	const name = "ns"
	start := time.Now()
	out := run("lab", "up", "--name", name, "--containers", "--machines", "2", "--leaders", "1", "--reboot-policy", "Auto")
	downed := false
	t.Cleanup(func() {
		if !downed {
			run("lab", "down", "--name", name)
		}
	})
	t.Logf("lab up --containers --machines 2 --leaders 1: %s", time.Since(start).Round(time.Second))
	var st clilab.State
	assert.NilError(t, json.Unmarshal([]byte(run("lab", "status", "--name", name, "-o", "json")), &st))
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range st.Machines {
				b, _ := os.ReadFile(filepath.Join(m.Dir, "machine.log"))
				s := string(b)
				t.Logf("%s console, last 3000 bytes:\n%s", m.Name, s[max(0, len(s)-3000):])
			}
		}
	})
	// This computer runs the lab's servers and one process per machine;
	// the control plane runs on the leader.
	kinds := map[string]int{}
	for _, p := range st.Processes {
		kinds[p.Kind]++
	}
	assert.DeepEqual(t, kinds, map[string]int{clilab.KindChannel: 1, clilab.KindEndpoint: 1, clilab.KindNames: 1, clilab.KindRegistry: 1, clilab.KindMachine: 2})

	m := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']+)'$`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "no export KUBECONFIG= line:\n%s", out)
	cfg, err := clientcmd.BuildConfigFromFlags("", m[1])
	assert.NilError(t, err)
	cfg.Timeout = 30 * time.Second
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx := t.Context()
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(nodes.Items), 2)
	for _, n := range nodes.Items {
		assert.Check(t, ready(&n), "Node %s", n.Name)
		assert.Check(t, strings.HasPrefix(n.Status.NodeInfo.KubeletVersion, "v1.37"), n.Status.NodeInfo.KubeletVersion)
		assert.Check(t, strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://"), n.Status.NodeInfo.ContainerRuntimeVersion)
	}

	// A power cut: the worker boots again, and its Node reads Ready from
	// the new boot.
	worker := st.Machines[1].Name
	before, err := kube.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
	assert.NilError(t, err)
	run("lab", "power", "cycle", worker, "--name", name)
	cycled := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n, err := kube.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
		switch {
		case err != nil:
			return poll.Continue("Node %s: %v", worker, err)
		case n.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID:
			return poll.Continue("Node %s still shows the boot before the power cut", worker)
		case !ready(n):
			return poll.Continue("Node %s has not come back Ready", worker)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(time.Second))
	t.Logf("%s: Ready again %s after a power cycle", worker, time.Since(cycled).Round(time.Second))

	// Down: nothing of the lab is left.
	run("lab", "down", "--name", name)
	downed = true
	for _, p := range st.Processes {
		assert.Check(t, !p.Running(), "%s %s (pid %d) still runs", p.Kind, p.Name, p.PID)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(mounts), st.Dir), "mounts of the lab are left")
	_, err = os.Stat(st.Dir)
	assert.Check(t, os.IsNotExist(err), "the lab's folder is left: %v", err)
	left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/liken-lab/%s", name))
	if _, err := os.Stat("/sys/fs/cgroup/liken-lab/" + name); err == nil {
		left = append(left, "/sys/fs/cgroup/liken-lab/"+name)
	}
	assert.Check(t, is.Len(left, 0), "the lab's cgroups are left")
}

// ready tells whether a Node reads Ready.
func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
