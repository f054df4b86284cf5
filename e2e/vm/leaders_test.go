//go:build vmleaders

package vme2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/lab/endpoint"
	"liken.sh/liken/e2e/internal/userlab"
	"liken.sh/liken/internal/qemu"
)

// TestThreeLeadersKeepTheirQuorum: three Leaders run the datastore and the
// API from liken's image behind one endpoint (the lab's forwarder on the
// host). The first bootstraps the datastore, the other two join it one at
// a time as learners and are promoted; every machine's kubelet joins
// through the endpoint. One leader loses its power: the API stays up on
// the other two, and the leader comes back with its member.
func TestThreeLeadersKeepTheirQuorum(t *testing.T) {
	l := newLab(t)
	_, ctx := ktesting.NewTestContext(t)
	r1 := l.variant("2026.12.01-001", nil)
	names := []string{"vm-1", "vm-2", "vm-3"}
	ports := freePorts(t, 1+3*len(names))
	ep := ports[0]
	type reach struct{ api, client, peer int }
	reaches := map[string]reach{}
	var docs strings.Builder
	fmt.Fprintf(&docs, `apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata: {name: vm}
spec:
  version: %q
  releases:
    source: %s
    catalog: [{version: %q, digest: %q}]
  network: {endpoint: "%s:%d"}
  disruption: {maxUnavailable: 1}
`, r1.Version, l.source, r1.Version, r1.Digest, qemu.HostAddress, ep)
	for i, n := range names {
		r := reach{ports[1+3*i], ports[2+3*i], ports[3+3*i]}
		reaches[n] = r
		fmt.Fprintf(&docs, `---
apiVersion: liken.sh/v1alpha1
kind: Machine
metadata:
  name: %s
  annotations:
    %s: https://%s:%d
    %s: https://%s:%d
    %s: https://%s:%d
spec: {cluster: vm, role: Leader, rebootPolicy: Auto}
`, n, likenv1.AnnotationAPIServerURL, qemu.HostAddress, r.api, likenv1.AnnotationEtcdClientURL, qemu.HostAddress, r.client, likenv1.AnnotationEtcdPeerURL, qemu.HostAddress, r.peer)
	}
	layerFile := l.selfHostedLayer(docs.String())

	var vms []*vm
	for _, n := range names {
		r := reaches[n]
		m := &vm{l: l, name: n, disk: filepath.Join(l.dir, n+".img"),
			hw: &qemu.Hardware{MemoryMiB: 2048, CPUs: 2, Network: true, Forwards: map[int]int{r.api: 6443, r.client: 2379, r.peer: 2380}}}
		_, err := install.Install(ctx, install.Options{Disk: m.disk, Release: r1.Dir, Layer: layerFile, Machine: n, Size: 3 << 30, GRUB: l.grub, TempDir: l.dir})
		assert.NilError(t, err)
		vms = append(vms, m)
	}

	// The endpoint: the host's loopback port ep, forwarded to a ready
	// leader's API server; the machines reach it at 10.0.2.2:ep.
	serverCA := x509.NewCertPool()
	assert.Assert(t, serverCA.AppendCertsFromPEM(l.identity.Files["server-ca.crt"]))
	var backends []string
	for _, n := range names {
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", reaches[n].api))
	}
	fw, err := endpoint.New(backends, serverCA)
	assert.NilError(t, err)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ep))
	assert.NilError(t, err)
	fwCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = fw.Serve(fwCtx, ln) }()
	a := newAdmin(t, l, fmt.Sprintf("https://127.0.0.1:%d", ep))

	// The host's view of the datastore: each leader's forwarded client
	// port.
	etcd := userlab.EtcdClient(t, l.identity)
	urls := map[string]string{}
	for _, n := range names {
		urls[n] = fmt.Sprintf("https://127.0.0.1:%d", reaches[n].client)
	}

	// The first leader alone bootstraps the datastore; the two others
	// then boot together and join one at a time.
	start := time.Now()
	vms[0].powerOn()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if exited, err := vms[0].qemu.Exited(); exited {
			return poll.Error(fmt.Errorf("vm-1 stopped: %v", err))
		}
		if len(fw.Ready()) == 0 {
			return poll.Continue("no API server ready behind the endpoint")
		}
		return poll.Success()
	}, poll.WithTimeout(15*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("vm-1: the API ready behind the endpoint %s after power on", time.Since(start).Round(time.Second))
	a.adopt(t, l, "vm", len(names))
	joined := time.Now()
	vms[1].powerOn()
	vms[2].powerOn()
	userlab.WaitDatastore(t, etcd, urls, 25*time.Minute)
	t.Logf("vm-2 and vm-3 joined: three voters, all healthy, %s after their power on", time.Since(joined).Round(time.Second))
	for _, m := range vms {
		a.nodeReady(t, m, "", 15*time.Minute)
	}
	t.Logf("three Nodes Ready through the endpoint %s after the first power on; ready behind the endpoint: %v", time.Since(start).Round(time.Second), fw.Ready())

	// vm-2 loses its power: the API answers on the two others.
	n, err := a.kube.CoreV1().Nodes().Get(ctx, "vm-2", metav1.GetOptions{})
	assert.NilError(t, err)
	bootID := n.Status.NodeInfo.BootID
	vms[1].qemu.Kill()
	cut := time.Now()
	var failures []string
	tick := time.NewTicker(time.Second) // the probe's pace
	defer tick.Stop()
	for i := 0; time.Since(cut) < time.Minute; i++ {
		<-tick.C
		name := fmt.Sprintf("probe-%d", i)
		_, err := a.kube.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"at": time.Now().UTC().Format(time.RFC3339Nano)}}, metav1.CreateOptions{})
		if err == nil {
			_, err = a.kube.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v", time.Since(cut).Round(time.Millisecond), err))
		}
	}
	t.Logf("a minute after vm-2's power cut: %d failed writes or reads %v", len(failures), failures)
	assert.Assert(t, len(failures) <= 5, "the API did not stay up on two leaders of three: %v", failures)

	vms[1].powerOn()
	back := time.Now()
	userlab.WaitDatastore(t, etcd, urls, 20*time.Minute)
	a.nodeReady(t, vms[1], bootID, 15*time.Minute)
	t.Logf("vm-2: its member votes again and its Node is Ready %s after power on", time.Since(back).Round(time.Second))
}
