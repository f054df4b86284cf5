package vme2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/e2e/internal/apiprobe"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/internal/srctree"
	nodecp "liken.sh/liken/node/controlplane"
)

// The helpers of the scenarios whose leaders run their own control plane
// from liken's image (leader/ on their disks).

// admin is the host's administrator of a self-hosted control plane: a
// certificate of the cluster's client CA in system:masters, for the API
// at server.
type admin struct {
	kubeconfig string
	kube       kubernetes.Interface
	liken      versioned.Interface
}

func newAdmin(t *testing.T, l *lab, server string) *admin {
	t.Helper()
	clientCA, err := pki.ParseCA(l.identity.Files["client-ca.crt"], l.identity.Files["client-ca.key"])
	assert.NilError(t, err)
	cert, err := clientCA.Issue(pki.Request{CommonName: "liken-e2e-admin", Organizations: []string{"system:masters"}, Usage: pki.ClientAuth, Now: time.Now(), Validity: 2 * time.Hour})
	assert.NilError(t, err)
	a := &admin{kubeconfig: filepath.Join(l.dir, "admin.kubeconfig")}
	assert.NilError(t, pki.WriteKubeconfig(a.kubeconfig, pki.Kubeconfig{Server: server, CA: l.identity.Files["server-ca.crt"], Client: cert}))
	keyPEM, err := cert.KeyPEM()
	assert.NilError(t, err)
	cfg := &rest.Config{Host: server, Timeout: 10 * time.Second, TLSClientConfig: rest.TLSClientConfig{
		CAData: l.identity.Files["server-ca.crt"], CertData: cert.CertPEM(), KeyData: keyPEM}}
	a.kube, err = kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	a.liken, err = versioned.NewForConfig(cfg)
	assert.NilError(t, err)
	return a
}

// apply applies liken's manifests but cluster-operator's Deployment, then
// the fleet's documents once the CRDs are served.
func (a *admin) apply(t *testing.T, l *lab, fleetFile string) {
	t.Helper()
	ctx := context.Background()
	repo, err := srctree.Find()
	assert.NilError(t, err)
	for _, f := range []string{"00-namespace.yaml", "10-crd-cluster.yaml", "11-crd-machine.yaml", "20-rbac-operator.yaml", "21-rbac-machine.yaml", "22-admission-machine.yaml"} {
		out, err := l.cp.KubectlAs(ctx, a.kubeconfig, "apply", "--server-side", "-f", filepath.Join(repo, "manifests", f))
		assert.NilError(t, err, out)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := l.cp.KubectlAs(ctx, a.kubeconfig, "apply", "--server-side", "-f", fleetFile); err != nil {
			return poll.Continue("the fleet's documents: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(2*time.Second))
}

// selfHostedLayer writes the fleet's documents and their layer, whose
// Leaders liken install gives their control plane (leader/). It returns
// both files' paths.
func (l *lab) selfHostedLayer(docs string) (fleetFile, layerFile string) {
	l.t.Helper()
	fleetFile = filepath.Join(l.dir, "fleet.yaml")
	assert.NilError(l.t, os.WriteFile(fleetFile, []byte(docs), 0o644))
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	cluster, ms, errs := layer.CheckFleet(parsed)
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	layerFile = filepath.Join(l.dir, "layer.tgz")
	assert.NilError(l.t, (&layer.Layer{Cluster: cluster, Machines: ms, Identity: l.identity}).WriteFile(layerFile, true))
	return fleetFile, layerFile
}

// nodeReady waits until the Node of m is Ready with a boot ID other than
// notBoot (empty: any).
func (a *admin) nodeReady(t *testing.T, m *vm, notBoot string, timeout time.Duration) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if exited, err := m.qemu.Exited(); exited {
			return poll.Error(fmt.Errorf("%s stopped: %v", m.name, err))
		}
		n, err := a.kube.CoreV1().Nodes().Get(context.Background(), m.name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Node %s: %v", m.name, err)
		}
		switch {
		case notBoot != "" && n.Status.NodeInfo.BootID == notBoot:
			return poll.Continue("Node %s still shows the boot before", m.name)
		case !nodeReady(n):
			return poll.Continue("Node %s is not Ready", m.name)
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(2*time.Second))
}

// freePorts returns n distinct free ports of the host's loopback.
func freePorts(t *testing.T, n int) []int {
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		if p := freePort(t); !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// userLab is a lab that the user's commands run (liken lab up --vm), in a
// lab home of the test's own, with the clients of the kubeconfig it
// prints.
type userLab struct {
	t    *testing.T
	name string
	run  func(args ...string) string // runs liken; its output
	st   clilab.State                // liken lab status -o json
	// kubeconfig is the file of the KUBECONFIG lab up prints.
	kubeconfig string
	cfg        *rest.Config
	kube       kubernetes.Interface
	liken      versioned.Interface
}

// labUp runs liken lab up --vm with machines, leaders of them, Auto
// reboots, and liken lab down at the test's end; it logs the consoles'
// ends when the test fails. It checks what a user relies on: this
// computer runs only the channel, the endpoint and QEMU; every machine's
// real kubelet reports its Node Ready; the kubeconfig reaches the API
// through the endpoint; cluster-operator's two copies run on the fleet.
func labUp(t *testing.T, name string, machines, leaders int) *userLab {
	t.Helper()
	repo, err := srctree.Find()
	assert.NilError(t, err)
	bin := filepath.Dir(fleetsim.Binary(t, "liken"))
	env := append(os.Environ(), "LIKEN_LAB_HOME="+t.TempDir(), "LIKEN_BIN="+bin, "LIKEN_LAB_STARTUP_GRACE=2s")
	l := &userLab{t: t, name: name}
	l.run = func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "liken"), args...)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "liken %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	start := time.Now()
	out := l.run("lab", "up", "--name", name, "--vm", "--machines", fmt.Sprint(machines), "--leaders", fmt.Sprint(leaders), "--reboot-policy", "Auto")
	t.Cleanup(func() { l.run("lab", "down", "--name", name) })
	t.Logf("lab up --vm --machines %d --leaders %d: %s", machines, leaders, time.Since(start).Round(time.Second))
	m := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']+)'$`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "no export KUBECONFIG= line:\n%s", out)
	assert.NilError(t, json.Unmarshal([]byte(l.run("lab", "status", "--name", name, "-o", "json")), &l.st))
	assert.Assert(t, l.st.VM)
	// This computer runs only the channel, the endpoint, the segment's
	// switch, the lab's name server and registry, and QEMU.
	kinds := map[string]int{}
	for _, p := range l.st.Processes {
		kinds[p.Kind]++
	}
	assert.DeepEqual(t, kinds, map[string]int{clilab.KindChannel: 1, clilab.KindEndpoint: 1, clilab.KindSegment: 1, clilab.KindNames: 1, clilab.KindRegistry: 1, clilab.KindMachine: machines})
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range l.st.Machines {
				b, _ := os.ReadFile(filepath.Join(m.Dir, "machine.log"))
				t.Logf("%s console, last 4000 bytes:\n%s", m.Name, tail(string(b), 4000))
			}
		}
	})

	l.kubeconfig = m[1]
	l.cfg, err = clientcmd.BuildConfigFromFlags("", m[1])
	assert.NilError(t, err)
	// A request to a leader that went away fails rather than hangs; the
	// probe's own requests have their deadline. The probe and the test's
	// reads share the client: no client-side throttling between them.
	l.cfg.Timeout, l.cfg.QPS, l.cfg.Burst = 30*time.Second, 50, 100
	l.kube, err = kubernetes.NewForConfig(l.cfg)
	assert.NilError(t, err)
	l.liken, err = versioned.NewForConfig(l.cfg)
	assert.NilError(t, err)
	var nodes *corev1.NodeList
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ns, err := l.kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return poll.Continue("the Nodes: %v", err)
		}
		nodes = ns
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
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
	assert.Equal(t, l.cfg.Host, l.st.Endpoint)
	operatorOnFleet(t, l.kube, 2)
	return l
}

// publish runs liken lab publish (with --fault when fault is not empty)
// and returns the catalog entry it prints.
func (l *userLab) publish(fault string) (version, digest string) {
	l.t.Helper()
	args := []string{"lab", "publish", "--name", l.name}
	if fault != "" {
		args = append(args, "--fault", fault)
	}
	out := l.run(args...)
	v := regexp.MustCompile(`version: "([^"]+)"`).FindStringSubmatch(out)
	d := regexp.MustCompile(`digest: (sha256:[0-9a-f]+)`).FindStringSubmatch(out)
	assert.Assert(l.t, v != nil && d != nil, "lab publish printed no catalog entry:\n%s", out)
	return v[1], d[1]
}

// moveTo catalogues the release and sets the Cluster's spec.version to it.
func (l *userLab) moveTo(version, digest string) {
	l.t.Helper()
	clusters := l.liken.LikenV1alpha1().Clusters()
	assert.NilError(l.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := clusters.Get(l.t.Context(), l.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: version, Digest: digest})
		c.Spec.Version = version
		_, err = clusters.Update(l.t.Context(), c, metav1.UpdateOptions{})
		return err
	}))
}

// machine reads the Machine called name.
func (l *userLab) machine(name string) *likenv1.Machine {
	l.t.Helper()
	m, err := l.liken.LikenV1alpha1().Machines().Get(l.t.Context(), name, metav1.GetOptions{})
	assert.NilError(l.t, err)
	return m
}

// startProbe runs an API probe through kube until the returned function,
// which waits (a minute at most) for the API to answer if it does not,
// stops the probe and returns its report.
func startProbe(ctx context.Context, kube kubernetes.Interface) (*apiprobe.Probe, func(*testing.T) apiprobe.Report) {
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

// etcdClient is the host's client of the leaders' etcd members: a client
// certificate of the identity's etcd/server-ca, which the members verify
// clients with and which signs their serving certificates.
func etcdClient(t *testing.T, id *layer.Identity) *nodecp.EtcdClient {
	t.Helper()
	ca, err := pki.ParseCA(id.Files["etcd/server-ca.crt"], id.Files["etcd/server-ca.key"])
	assert.NilError(t, err)
	cert, err := ca.Issue(pki.Request{CommonName: "liken-e2e-etcd", Usage: pki.ClientAuth, Now: time.Now(), Validity: 6 * time.Hour})
	assert.NilError(t, err)
	key, err := cert.KeyPEM()
	assert.NilError(t, err)
	pair, err := tls.X509KeyPair(cert.CertPEM(), key)
	assert.NilError(t, err)
	roots := x509.NewCertPool()
	assert.Assert(t, roots.AppendCertsFromPEM(id.Files["etcd/server-ca.crt"]))
	return nodecp.NewEtcdClient(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12})
}

// checkDatastore reads the datastore as each leader's member sees it
// (urls: each leader's etcd client URL, by name). Every member that
// answers must list exactly the leaders, each a started voter, with the
// same member IDs; at least healthy of them must answer /health. It
// returns the members' IDs by name.
func checkDatastore(ctx context.Context, etcd *nodecp.EtcdClient, urls map[string]string, healthy int) (map[string]uint64, error) {
	var ids map[string]uint64
	var down []error
	ok := 0
	for _, n := range slices.Sorted(maps.Keys(urls)) {
		members, err := etcd.MemberList(ctx, urls[n])
		if err != nil {
			down = append(down, fmt.Errorf("%s: %w", n, err))
			continue
		}
		got := map[string]uint64{}
		for _, m := range members {
			if m.Name != "" && len(m.ClientURLs) > 0 && !m.IsLearner {
				got[m.Name] = m.ID
			}
		}
		if len(members) != len(urls) || !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(urls))) {
			return nil, fmt.Errorf("%s lists %d members, the started voters %v; want the voters %v", n, len(members), slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(urls)))
		}
		if ids != nil && !maps.Equal(ids, got) {
			return nil, fmt.Errorf("the members disagree on their IDs: %v, and %s lists %v", ids, n, got)
		}
		ids = got
		if _, err := etcd.Health(ctx, urls[n]); err != nil {
			down = append(down, fmt.Errorf("%s: %w", n, err))
			continue
		}
		ok++
	}
	if ok < healthy {
		return nil, fmt.Errorf("%d of %d members healthy, want %d: %w", ok, len(urls), healthy, errors.Join(down...))
	}
	return ids, nil
}

// waitDatastore waits until every leader's member is a healthy voter, as
// each member sees them, and returns their IDs by name.
func waitDatastore(t *testing.T, etcd *nodecp.EtcdClient, urls map[string]string, timeout time.Duration) map[string]uint64 {
	t.Helper()
	var ids map[string]uint64
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var err error
		if ids, err = checkDatastore(t.Context(), etcd, urls, len(urls)); err != nil {
			return poll.Continue("%v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(3*time.Second))
	return ids
}

// trialFailedBack tells whether m, which tried a release after the boot
// proven shows, failed the trial and is back: a later boot, on proven's
// slot and release, TrialFailed and its control plane ready.
func trialFailedBack(m, proven *likenv1.Machine) poll.Result {
	failed := meta.IsStatusConditionTrue(m.Status.Conditions, likenv1.ConditionTrialFailed)
	cpReady := meta.IsStatusConditionTrue(m.Status.Conditions, likenv1.ConditionControlPlaneReady)
	switch {
	case m.Status.Observed.BootID == proven.Status.Observed.BootID:
		return poll.Continue("%s: still the boot before the release", m.Name)
	case !failed || !cpReady || m.Status.Version != proven.Status.Version || m.Status.Slot != proven.Status.Slot:
		return poll.Continue("%s: %s on %q from slot %q, trial failed %v, control plane ready %v", m.Name, m.Status.Phase, m.Status.Version, m.Status.Slot, failed, cpReady)
	}
	return poll.Success()
}
