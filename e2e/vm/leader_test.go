//go:build vmfaults

package vme2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/install"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/internal/qemu"
)

// TestLeaderServesItsOwnControlPlane: a Leader installed with leader/ on
// its disk starts etcd, the API server, the controller manager and the
// scheduler from liken's image, bootstraps a one-member datastore, and
// its own kubelet and liken-node join through it (the Cluster's endpoint
// is the leader itself). What was written survives a power cut: etcd's
// data is on the slot store. A RestartK3s change restarts its control
// plane with the node agent, and an upgrade's trial commits on its own
// control plane, the datastore kept.
func TestLeaderServesItsOwnControlPlane(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	r1 := l.variant("2026.12.01-001", nil)

	docs := fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata: {name: vm}
spec:
  version: %q
  releases:
    source: %s
    catalog: [{version: %q, digest: %q}]
  network: {endpoint: "127.0.0.1:6443"}
  disruption: {maxUnavailable: 1}
---
apiVersion: liken.sh/v1alpha1
kind: Machine
metadata: {name: vm-1}
spec: {cluster: vm, role: Leader, rebootPolicy: Auto}
`, r1.Version, l.source, r1.Version, r1.Digest)
	layerFile := l.selfHostedLayer(docs)

	m := &vm{l: l, name: "vm-1", disk: filepath.Join(l.dir, "vm-1.img")}
	_, err := install.Install(ctx, install.Options{
		Disk: m.disk, Release: r1.Dir, Layer: layerFile, Machine: m.name, Size: 3 << 30,
		GRUB: l.grub, TempDir: l.dir,
	})
	assert.NilError(t, err)

	// The host reaches the leader's API server through a forwarded port,
	// as an administrator with a certificate of the cluster's client CA.
	port := freePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	a := newAdmin(t, l, server)
	kube, liken, kubeconfig := a.kube, a.liken, a.kubeconfig

	powerOn := func() {
		m.boots++
		m.log = filepath.Join(l.dir, fmt.Sprintf("vm-1-console-%d.log", m.boots))
		q, err := l.kit.Start(m.disk, m.log, qemu.Hardware{MemoryMiB: 2048, CPUs: 2, Network: true, Forwards: map[int]int{port: 6443}})
		assert.NilError(t, err)
		m.qemu = q
		t.Cleanup(func() {
			q.Kill()
			if t.Failed() {
				b, _ := os.ReadFile(m.log)
				t.Logf("vm-1 console (boot %d), last 8000 bytes:\n%s", m.boots, tail(string(b), 8000))
			}
		})
	}
	apiReady := func() time.Duration {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if exited, err := m.qemu.Exited(); exited {
				return poll.Error(fmt.Errorf("the virtual machine stopped: %v", err))
			}
			r, err := hc.Get(server + "/readyz")
			if err != nil {
				return poll.Continue("%s/readyz: %v", server, err)
			}
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				return poll.Continue("%s/readyz: %s", server, r.Status)
			}
			return poll.Success()
		}, poll.WithTimeout(12*time.Minute), poll.WithDelay(2*time.Second))
		return time.Since(m.qemu.Started)
	}

	powerOn()
	t.Logf("vm-1: its API server ready %s after power on", apiReady().Round(time.Second))
	a.adopt(t, l, "vm", 1)

	// The join token's Secret was made by liken-control-plane-init, so the
	// leader's kubelet joins its own API server through TLS bootstrap.
	nodeReady := func(bootID string) { a.nodeReady(t, m, bootID, 10*time.Minute) }
	nodeReady("")
	t.Logf("vm-1: Node Ready on its own API server %s after power on", time.Since(m.qemu.Started).Round(time.Second))
	m.consoleClean()
	machineOn := func() {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			got, err := liken.LikenV1alpha1().Machines().Get(ctx, "vm-1", metav1.GetOptions{})
			if err != nil {
				return poll.Continue("Machine vm-1: %v", err)
			}
			if got.Status.Version != r1.Version || got.Status.Slot != "A" {
				return poll.Continue("Machine vm-1 reports %q on slot %q", got.Status.Version, got.Status.Slot)
			}
			return poll.Success()
		}, poll.WithTimeout(5*time.Minute), poll.WithDelay(2*time.Second))
	}
	machineOn()
	t.Logf("vm-1: liken-node reports its release through its own API server %s after power on", time.Since(m.qemu.Started).Round(time.Second))

	// A power cut: the datastore comes back from the slot store.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-power-cut", Namespace: "default"}, Data: map[string]string{"written": "before"}}
	_, err = kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
	assert.NilError(t, err)
	n, err := kube.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{})
	assert.NilError(t, err)
	bootID := n.Status.NodeInfo.BootID
	m.qemu.Kill()
	powerOn()
	t.Logf("vm-1: after a power cut, its API server ready %s after power on", apiReady().Round(time.Second))
	got, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "before-power-cut", metav1.GetOptions{})
	assert.NilError(t, err, "what was written before the power cut is gone: etcd's data did not survive")
	assert.Equal(t, got.Data["written"], "before")
	nodeReady(bootID)
	machineOn()
	t.Logf("vm-1: Node Ready again %s after power on", time.Since(m.qemu.Started).Round(time.Second))

	// cluster-operator grants the turns through the leader's own API
	// server. It exits when it loses its lease, as it may while the only
	// API server restarts; a new copy takes over.
	var op *fleetsim.Operator
	operator := func() {
		if op == nil || op.Exited() {
			op = fleetsim.RunOperator(t, l.cp, fleetsim.OperatorOptions{ID: fmt.Sprintf("op-%d", time.Now().Unix()), Kubeconfig: kubeconfig, Verbosity: 2, Flags: []string{"--startup-grace", "2s"}})
		}
	}
	operator()

	// A RestartK3s change: in the leader's turn its control plane restarts
	// with the node agent (the API server's identity Lease gets a new
	// holder, one per process), with no reboot, and the turn ends once it
	// is healthy again.
	identities := func() (map[string]bool, error) {
		ls, err := kube.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
		if err != nil {
			return nil, err
		}
		ids := map[string]bool{}
		for _, l := range ls.Items {
			if l.Spec.HolderIdentity != nil {
				ids[*l.Spec.HolderIdentity] = true
			}
		}
		return ids, nil
	}
	before, err := identities()
	assert.NilError(t, err)
	n, err = kube.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{})
	assert.NilError(t, err)
	bootID = n.Status.NodeInfo.BootID
	c, err := liken.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	c.Spec.Settings.K3sArgs = []string{"--max-pods=150"}
	_, err = liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	began := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		operator()
		n, err := kube.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Node vm-1: %v", err)
		}
		if n.Status.NodeInfo.BootID != bootID {
			return poll.Error(fmt.Errorf("vm-1 rebooted for a change of its node agent's settings"))
		}
		if got := n.Status.Allocatable.Pods().String(); got != "150" {
			return poll.Continue("Node vm-1 allows %s pods", got)
		}
		got, err := liken.LikenV1alpha1().Machines().Get(ctx, "vm-1", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Machine vm-1: %v", err)
		}
		if got.Status.Phase != likenv1.MachineReady || len(got.Status.Pending) > 0 {
			return poll.Continue("Machine vm-1: %s, pending %v", got.Status.Phase, got.Status.Pending)
		}
		ids, err := identities()
		if err != nil {
			return poll.Continue("the API servers' identity Leases: %v", err)
		}
		for id := range ids {
			if !before[id] {
				return poll.Success()
			}
		}
		return poll.Continue("no new API server identity: the control plane was not restarted (holders %v)", ids)
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("vm-1: RestartK3s on the leader, its control plane restarted with the node agent, Ready again %s after the edit", time.Since(began).Round(time.Second))

	// An upgrade: the leader's trial commits only once its own control
	// plane (its etcd member a healthy voter, its API server ready) is
	// back on the new slot.
	r2 := l.variant("2026.12.01-002", nil)
	c, err = liken.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: r2.Version, Digest: r2.Digest})
	c.Spec.Version = r2.Version
	_, err = liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	began = time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		operator()
		if exited, err := m.qemu.Exited(); exited {
			return poll.Error(fmt.Errorf("the virtual machine stopped: %v", err))
		}
		got, err := liken.LikenV1alpha1().Machines().Get(ctx, "vm-1", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Machine vm-1: %v", err)
		}
		st := got.Status
		if st.Version != r2.Version || st.Slot != "B" || st.Phase != likenv1.MachineReady {
			return poll.Continue("vm-1: %s on %q from slot %q, staged %q", st.Phase, st.Version, st.Slot, st.Staged)
		}
		return poll.Success()
	}, poll.WithTimeout(15*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("vm-1: the leader upgraded to %s on slot B, its trial committed on its own control plane, %s after the edit", r2.Version, time.Since(began).Round(time.Second))
	got, err = kube.CoreV1().ConfigMaps("default").Get(ctx, "before-power-cut", metav1.GetOptions{})
	assert.NilError(t, err, "the datastore lost what it held before the upgrade")
	assert.Equal(t, got.Data["written"], "before")
}
