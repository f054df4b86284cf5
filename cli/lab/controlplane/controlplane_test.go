package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func nodeReady(cs kubernetes.Interface, name string, want bool) poll.Check {
	return func(poll.LogT) poll.Result {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("%v", err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && (c.Status == corev1.ConditionTrue) == want {
				return poll.Success()
			}
		}
		return poll.Continue("node %s: conditions %v", name, n.Status.Conditions)
	}
}

// TestNodesPodsAndPower: kwok's nodes go Ready, pods bound to them run,
// power off makes a node NotReady and power on makes it Ready again, and
// Stop ends exactly the processes the control plane started.
func TestNodesPodsAndPower(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	start := time.Now()
	cp, err := Start(ctx, Options{Dir: dir, Machines: []string{"m1"}, Log: t.Logf})
	assert.NilError(t, err)
	t.Logf("ready in %s", time.Since(start))
	stopped := false
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(cp.Logs(3000))
		}
		if !stopped {
			cp.Stop()
		}
	})
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)

	// The datastore answers the API server's certificate and nobody else.
	pool := x509.NewCertPool()
	assert.Assert(t, pool.AppendCertsFromPEM(cp.caPEM))
	etcdGet := func(certs ...tls.Certificate) error {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
		resp, err := c.Get(cp.EtcdURL + "/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("etcd answered %s", resp.Status)
			}
		}
		return err
	}
	assert.ErrorContains(t, etcdGet(), "certificate required", "etcd answered a client without a certificate")
	apiserverCert, err := tls.LoadX509KeyPair(filepath.Join(dir, "pki", "apiserver-etcd-client.crt"), filepath.Join(dir, "pki", "apiserver-etcd-client.key"))
	assert.NilError(t, err)
	assert.NilError(t, etcdGet(apiserverCert))

	assert.NilError(t, cp.AddNode(ctx, "m1", nil))
	poll.WaitOn(t, nodeReady(cs, "m1", true), poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))

	_, err = cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{
			Containers:  []corev1.Container{{Name: "web", Image: "nginx"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return poll.Continue("%v", err)
		}
		if p.Spec.NodeName == "m1" && p.Status.Phase == corev1.PodRunning {
			return poll.Success()
		}
		return poll.Continue("pod on %q, phase %s", p.Spec.NodeName, p.Status.Phase)
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))

	// kwok renews the Node Lease while the machine is on, as a kubelet
	// does, and stops while it is off.
	first := renewTime(t, cs, "m1")
	poll.WaitOn(t, leaseRenewedAfter(cs, "m1", first), poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))

	assert.NilError(t, cp.SetPower(ctx, "m1", false))
	poll.WaitOn(t, nodeReady(cs, "m1", false), poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
	off, offAt := renewTime(t, cs, "m1"), time.Now()
	quiet := offAt.Add(25 * time.Second)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := renewTime(t, cs, "m1"); !got.Equal(off) {
			// A renewal kwok had scheduled before the power went off
			// (renewals are 10.4 s apart at most) may still land.
			if !got.Before(offAt.Add(11 * time.Second)) {
				return poll.Error(fmt.Errorf("the Node Lease of a powered-off machine was renewed at %s, %s after the power went off", got, got.Sub(offAt)))
			}
			off = got
		}
		if time.Now().Before(quiet) {
			return poll.Continue("watching the Node Lease of a powered-off machine")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(500*time.Millisecond))

	assert.NilError(t, cp.SetPower(ctx, "m1", true))
	poll.WaitOn(t, nodeReady(cs, "m1", true), poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
	poll.WaitOn(t, leaseRenewedAfter(cs, "m1", off), poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))

	out, err := cp.Kubectl(ctx, "version")
	assert.NilError(t, err)
	assert.Assert(t, contains(out, "Server Version: v1.37.2"), out)

	cp.Stop()
	stopped = true
	for _, p := range cp.Processes {
		assert.Assert(t, !Alive(p.PID), "%s (pid %d) still runs after Stop", p.Name, p.PID)
	}
}

// TestNodesGetPodRanges: the controller manager, with the flags a leader
// runs it with (node/controlplane ControllerManagerNetworkArgs), gives each
// Node a /24 of its own inside the Cluster's pod range, until the range has
// none left; the API server hands out Service addresses from the service
// range. Each machine's containerd writes its CNI configuration from its
// Node's range.
func TestNodesGetPodRanges(t *testing.T) {
	const podCIDR, serviceCIDR = "10.50.0.0/22", "10.60.0.0/16"
	ctx := context.Background()
	start := time.Now()
	cp, err := Start(ctx, Options{Dir: t.TempDir(), PodCIDR: podCIDR, ServiceCIDR: serviceCIDR, Log: t.Logf})
	assert.NilError(t, err)
	t.Logf("ready in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(cp.Logs(3000))
		}
		cp.Stop()
	})
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)

	// A /22 holds four Node ranges of /24; the fifth Node gets none.
	names := []string{"m1", "m2", "m3", "m4", "m5"}
	for _, n := range names {
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
	pool := netip.MustParsePrefix(podCIDR)
	ranges := map[string]string{} // range -> Node
	var left []string             // Nodes without a range
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		clear(ranges)
		left = nil
		for _, n := range names {
			node, err := cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return poll.Continue("%v", err)
			}
			if node.Spec.PodCIDR == "" {
				left = append(left, n)
				continue
			}
			ranges[node.Spec.PodCIDR] = n
		}
		if len(left) > 1 {
			return poll.Continue("Nodes %v have no pod range yet", left)
		}
		return poll.Success()
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))
	assert.Check(t, is.Len(ranges, 4), "each Node has a range of its own: %v", ranges)
	for r, n := range ranges {
		p, err := netip.ParsePrefix(r)
		if assert.Check(t, err, "Node %s", n) {
			assert.Check(t, is.Equal(p.Bits(), 24), "Node %s: %s", n, r)
			assert.Check(t, pool.Contains(p.Addr()), "Node %s: %s is outside %s", n, r, podCIDR)
		}
	}
	assert.Assert(t, is.Len(left, 1), "Nodes without a range: %v", left)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + left[0] + ",reason=CIDRNotAvailable"})
		if err != nil {
			return poll.Continue("%v", err)
		}
		if len(evs.Items) == 0 {
			return poll.Continue("no CIDRNotAvailable event for Node %s, left without a range", left[0])
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))

	svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(svc.Spec.ClusterIP, "10.60.0.1"))
}

func renewTime(t *testing.T, cs kubernetes.Interface, node string) time.Time {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, l.Spec.RenewTime != nil)
	return l.Spec.RenewTime.Time
}

func leaseRenewedAfter(cs kubernetes.Interface, node string, after time.Time) poll.Check {
	return func(poll.LogT) poll.Result {
		l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("%v", err)
		}
		if l.Spec.RenewTime != nil && l.Spec.RenewTime.After(after) {
			return poll.Success()
		}
		return poll.Continue("Node Lease %s not renewed since %s", node, after)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestProcessIdentity: a recorded process is signalled only while its PID
// still belongs to it. After a host reboot (another boot ID) or once its
// PID went to another program (another start time), Stop leaves that
// program alone.
func TestProcessIdentity(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	assert.NilError(t, err)
	p, err := StartProcess(sleep, []string{"60"}, filepath.Join(t.TempDir(), "sleep.log"), false)
	assert.NilError(t, err)
	t.Cleanup(func() { StopPID(p.PID, time.Second) })
	assert.Assert(t, p.Started != "", "the start of pid %d was not recorded", p.PID)
	assert.Check(t, p.Running())

	for _, other := range []string{
		"another-boot/" + p.Started[strings.IndexByte(p.Started, '/')+1:],
		p.Started[:strings.IndexByte(p.Started, '/')+1] + "1",
	} {
		reused := *p
		reused.Started = other
		assert.Check(t, !reused.Running(), "pid %d recorded as %s reads as the lab's", p.PID, other)
		reused.Stop(time.Second)
		assert.Check(t, Alive(p.PID), "Stop killed pid %d, which is not the recorded process", p.PID)
	}

	p.Stop(5 * time.Second)
	assert.Check(t, !Alive(p.PID))
	assert.Check(t, !p.Running())
}
