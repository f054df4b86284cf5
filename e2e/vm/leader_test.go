//go:build vmfaults

package vme2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/internal/srctree"
)

// TestLeaderServesItsOwnControlPlane: a Leader installed with leader/ on
// its disk starts etcd, the API server, the controller manager and the
// scheduler from liken's image, bootstraps a one-member datastore, and
// its own kubelet and liken-node join through it (the Cluster's endpoint
// is the leader itself). What was written survives a power cut: etcd's
// data is on the slot store.
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
	fleetFile := filepath.Join(l.dir, "fleet.yaml")
	assert.NilError(t, os.WriteFile(fleetFile, []byte(docs), 0o644))
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(t, len(errs) == 0, "%v", errs)
	cluster, ms, errs := layer.CheckFleet(parsed)
	assert.Assert(t, len(errs) == 0, "%v", errs)
	layerFile := filepath.Join(l.dir, "layer.tgz")
	assert.NilError(t, (&layer.Layer{Cluster: cluster, Machines: ms, Identity: l.identity}).WriteFile(layerFile, true))

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
	clientCA, err := pki.ParseCA(l.identity.Files["client-ca.crt"], l.identity.Files["client-ca.key"])
	assert.NilError(t, err)
	admin, err := clientCA.Issue(pki.Request{CommonName: "liken-e2e-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth, Now: time.Now(), Validity: time.Hour})
	assert.NilError(t, err)
	kubeconfig := filepath.Join(l.dir, "admin.kubeconfig")
	assert.NilError(t, pki.WriteKubeconfig(kubeconfig, pki.Kubeconfig{Server: server, CA: l.identity.Files["server-ca.crt"], Client: admin}))
	keyPEM, err := admin.KeyPEM()
	assert.NilError(t, err)
	cfg := &rest.Config{Host: server, Timeout: 10 * time.Second, TLSClientConfig: rest.TLSClientConfig{
		CAData: l.identity.Files["server-ca.crt"], CertData: admin.CertPEM(), KeyData: keyPEM}}
	kube, err := kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	liken, err := versioned.NewForConfig(cfg)
	assert.NilError(t, err)

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
	repo, err := srctree.Find()
	assert.NilError(t, err)
	for _, f := range []string{"00-namespace.yaml", "10-crd-cluster.yaml", "11-crd-machine.yaml", "20-rbac-operator.yaml", "21-rbac-machine.yaml", "22-admission-machine.yaml"} {
		out, err := l.cp.KubectlAs(ctx, kubeconfig, "apply", "--server-side", "-f", filepath.Join(repo, "manifests", f))
		assert.NilError(t, err, out)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		// The CRDs take a moment to be served.
		if _, err := l.cp.KubectlAs(ctx, kubeconfig, "apply", "--server-side", "-f", fleetFile); err != nil {
			return poll.Continue("the fleet's documents: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(2*time.Second))

	// The join token's Secret was made by liken-control-plane-init, so the
	// leader's kubelet joins its own API server through TLS bootstrap.
	nodeReady := func(bootID string) {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			n, err := kube.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{})
			if err != nil {
				return poll.Continue("Node vm-1: %v", err)
			}
			if bootID != "" && n.Status.NodeInfo.BootID == bootID {
				return poll.Continue("Node vm-1 still shows the boot before the power cut")
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return poll.Success()
				}
			}
			return poll.Continue("Node vm-1 is not Ready")
		}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
	}
	nodeReady("")
	t.Logf("vm-1: Node Ready on its own API server %s after power on", time.Since(m.qemu.Started).Round(time.Second))
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
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
