//go:build vmfaults

package vme2e

import (
	"context"
	"encoding/json"
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
	"k8s.io/client-go/tools/clientcmd"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/e2e/internal/apiprobe"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/srctree"
)

// TestLabUpVM runs the user's commands: liken lab up --vm gives a fleet
// that runs its own control plane (its leader's etcd and API server behind
// the lab's endpoint, cluster-operator as the Deployment of manifests/ on
// the fleet) and whose virtual machines kubectl lists as Ready Nodes;
// liken lab publish and a new spec.version upgrade them through real
// reboots, the leader's included; liken lab power cycle pulls a machine's
// power and it comes back; a release that cannot boot fails the leader's
// trial, and the leader comes back on its proven slot with its datastore;
// liken lab down stops it all.
func TestLabUpVM(t *testing.T) {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	bin := filepath.Dir(fleetsim.Binary(t, "liken"))
	env := append(os.Environ(), "LIKEN_LAB_HOME="+t.TempDir(), "LIKEN_BIN="+bin, "LIKEN_LAB_STARTUP_GRACE=2s")
	liken := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "liken"), args...)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "liken %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	start := time.Now()
	out := liken("lab", "up", "--name", "vm", "--vm", "--machines", "2", "--leaders", "1", "--reboot-policy", "Auto")
	t.Cleanup(func() { liken("lab", "down", "--name", "vm") })
	t.Logf("lab up --vm with 2 machines: %s", time.Since(start).Round(time.Second))
	m := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']+)'$`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "no export KUBECONFIG= line:\n%s", out)
	var st struct {
		VM        bool   `json:"vm"`
		Endpoint  string `json:"endpoint"`
		Processes []struct {
			Kind string `json:"kind"`
		} `json:"processes"`
		Machines []struct {
			Name string `json:"name"`
			Dir  string `json:"dir"`
		} `json:"machines"`
	}
	assert.NilError(t, json.Unmarshal([]byte(liken("lab", "status", "--name", "vm", "-o", "json")), &st))
	assert.Assert(t, st.VM)
	// This computer runs only the channel, the endpoint and QEMU.
	kinds := map[string]int{}
	for _, p := range st.Processes {
		kinds[p.Kind]++
	}
	assert.DeepEqual(t, kinds, map[string]int{"channel": 1, "endpoint": 1, "machine": 2})
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range st.Machines {
				b, _ := os.ReadFile(filepath.Join(m.Dir, "machine.log"))
				t.Logf("%s console, last 4000 bytes:\n%s", m.Name, tail(string(b), 4000))
			}
		}
	})

	cfg, err := clientcmd.BuildConfigFromFlags("", m[1])
	assert.NilError(t, err)
	kube, err := kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	lk, err := versioned.NewForConfig(cfg)
	assert.NilError(t, err)
	ctx := t.Context()
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(nodes.Items), 2)
	for _, n := range nodes.Items {
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		assert.Assert(t, ready, "Node %s is not Ready", n.Name)
		// A real kubelet, not kwok's.
		assert.Assert(t, strings.HasPrefix(n.Status.NodeInfo.KubeletVersion, "v1.37"), n.Status.NodeInfo.KubeletVersion)
		assert.Assert(t, strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") && strings.Contains(n.Status.NodeInfo.ContainerRuntimeVersion, "2.2.9"), n.Status.NodeInfo.ContainerRuntimeVersion)
	}
	// The kubeconfig reaches the leader's own API server through the
	// endpoint, and cluster-operator runs on the fleet.
	assert.Equal(t, cfg.Host, st.Endpoint)
	operatorOnFleet(t, kube, 2)

	pub := liken("lab", "publish", "--name", "vm")
	ver := regexp.MustCompile(`version: "([^"]+)"`).FindStringSubmatch(pub)
	dig := regexp.MustCompile(`digest: (sha256:[0-9a-f]+)`).FindStringSubmatch(pub)
	assert.Assert(t, ver != nil && dig != nil, "lab publish printed no catalog entry:\n%s", pub)
	c, err := lk.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: ver[1], Digest: dig[1]})
	c.Spec.Version = ver[1]
	_, err = lk.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	start = time.Now()
	// The API probe writes and reads a ConfigMap through the endpoint
	// every 200 ms while the fleet upgrades.
	probe := &apiprobe.Probe{Client: kube}
	probeCtx, stopProbe := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() { defer close(probed); probe.Run(probeCtx) }()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ms, err := lk.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
		if err != nil {
			// The sole leader's API is down while it reboots.
			return poll.Continue("the API: %v", err)
		}
		for _, m := range ms.Items {
			if m.Status.Version != ver[1] || m.Status.Phase != likenv1.MachineReady {
				return poll.Continue("%s: %s on %q", m.Name, m.Status.Phase, m.Status.Version)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Minute), poll.WithDelay(5*time.Second))
	t.Logf("VM lab of 2 upgraded to %s in %s", ver[1], time.Since(start).Round(time.Second))
	stopProbe()
	<-probed
	rep := probe.Report()
	t.Logf("API probe through the upgrade: %s", rep.Timeline())
	// One leader: the API is down while it reboots, and only then; it
	// answers again once the leader is back.
	assert.Assert(t, rep.Rounds > 0 && !rep.Longest.Ongoing, "the API did not answer again after the upgrade: %s", rep)
	assert.Assert(t, rep.Longest.Duration() < 10*time.Minute, "the API was down longer than one leader's trial timeout: %s", rep)
	// cluster-operator's pods, evicted by the drains, run again.
	operatorOnFleet(t, kube, 2)

	// A power cut: the machine boots again and its Node reads Ready from
	// the new boot (a machine back within the Node's grace period never
	// reads NotReady, so the boot ID tells the boots apart).
	before, err := kube.CoreV1().Nodes().Get(ctx, st.Machines[1].Name, metav1.GetOptions{})
	assert.NilError(t, err)
	liken("lab", "power", "cycle", st.Machines[1].Name, "--name", "vm")
	cycled := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n, err := kube.CoreV1().Nodes().Get(ctx, st.Machines[1].Name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Node %s: %v", st.Machines[1].Name, err)
		}
		if n.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID {
			return poll.Continue("Node %s still shows the boot before the power cut", n.Name)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return poll.Success()
			}
		}
		return poll.Continue("Node %s has not come back Ready", n.Name)
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("%s: Ready again %s after a power cycle", st.Machines[1].Name, time.Since(cycled).Round(time.Second))

	// A release whose init cannot start, tried by the leader first: its
	// trial fails, it boots its proven slot again, its etcd member comes
	// back with what was written before (the probe's ConfigMap) and its
	// control plane reads ready; the rollout halts before the worker.
	kept, err := kube.CoreV1().ConfigMaps("default").Get(ctx, apiprobe.DefaultName, metav1.GetOptions{})
	assert.NilError(t, err)
	pub = liken("lab", "publish", "--name", "vm", "--fault", "panic")
	bad := regexp.MustCompile(`version: "([^"]+)"`).FindStringSubmatch(pub)
	badDigest := regexp.MustCompile(`digest: (sha256:[0-9a-f]+)`).FindStringSubmatch(pub)
	assert.Assert(t, bad != nil && badDigest != nil, "lab publish printed no catalog entry:\n%s", pub)
	leader := st.Machines[0].Name
	proven, err := lk.LikenV1alpha1().Machines().Get(ctx, leader, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, proven.Status.Observed.BootID != "", "%s reports no boot", leader)
	c, err = lk.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: bad[1], Digest: badDigest[1]})
	c.Spec.Version = bad[1]
	_, err = lk.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	start = time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		m, err := lk.LikenV1alpha1().Machines().Get(ctx, leader, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("the API (down while the leader tries %s): %v", bad[1], err)
		}
		failed, cpReady := false, false
		for _, c := range m.Status.Conditions {
			failed = failed || (c.Type == likenv1.ConditionTrialFailed && c.Status == metav1.ConditionTrue)
			cpReady = cpReady || (c.Type == likenv1.ConditionControlPlaneReady && c.Status == metav1.ConditionTrue)
		}
		if m.Status.Observed.BootID == proven.Status.Observed.BootID {
			return poll.Continue("%s: still the boot before the release", leader)
		}
		if !failed || !cpReady || m.Status.Version != ver[1] {
			return poll.Continue("%s: %s on %q from slot %q, trial failed %v, control plane ready %v", leader, m.Status.Phase, m.Status.Version, m.Status.Slot, failed, cpReady)
		}
		return poll.Success()
	}, poll.WithTimeout(15*time.Minute), poll.WithDelay(5*time.Second))
	t.Logf("%s: trial of %s failed; back on its proven slot with its control plane ready in %s", leader, bad[1], time.Since(start).Round(time.Second))
	back, err := lk.LikenV1alpha1().Machines().Get(ctx, leader, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, back.Status.Version, ver[1])
	assert.Equal(t, back.Status.Slot, proven.Status.Slot)
	after, err := kube.CoreV1().ConfigMaps("default").Get(ctx, apiprobe.DefaultName, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, after.Data, kept.Data)
	c, err = lk.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, c.Status.Halt != nil && c.Status.Halt.Reason == likenv1.ReasonTrialFailed, "Cluster halt: %+v", c.Status.Halt)
	w, err := lk.LikenV1alpha1().Machines().Get(ctx, st.Machines[1].Name, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, w.Status.Version, ver[1], "the worker tried the release the rollout halted on")
}

// operatorOnFleet waits until cluster-operator's Deployment has replicas
// available, each pod running on a Node of the fleet.
func operatorOnFleet(t *testing.T, kube kubernetes.Interface, replicas int32) {
	t.Helper()
	ctx := t.Context()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		d, err := kube.AppsV1().Deployments("liken-system").Get(ctx, "cluster-operator", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("cluster-operator's Deployment: %v", err)
		}
		if d.Status.AvailableReplicas != replicas {
			return poll.Continue("cluster-operator: %d of %d replicas available", d.Status.AvailableReplicas, replicas)
		}
		pods, err := kube.CoreV1().Pods("liken-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cluster-operator", FieldSelector: "status.phase=Running"})
		if err != nil {
			return poll.Continue("cluster-operator's pods: %v", err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" {
				return poll.Continue("pod %s runs on no Node", p.Name)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
}
