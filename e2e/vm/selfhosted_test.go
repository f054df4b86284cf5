package vme2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.sh/liken/cli/layer"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/pki"
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

// adopt waits for what the first leader's control-plane init creates from
// its layer, with no kubectl apply: liken's manifests and the fleet's
// documents (the Cluster, then its Machines). These tests run
// cluster-operator on the host (with its log and a short startup grace),
// so the Deployment init created is scaled to none.
func (a *admin) adopt(t *testing.T, l *lab, cluster string, machines int) {
	t.Helper()
	ctx := context.Background()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := a.liken.LikenV1alpha1().Clusters().Get(ctx, cluster, metav1.GetOptions{}); err != nil {
			return poll.Continue("Cluster %s, which the first leader creates from its layer: %v", cluster, err)
		}
		ms, err := a.liken.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
		if err != nil || len(ms.Items) < machines {
			return poll.Continue("the fleet's Machines: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
	out, err := l.cp.KubectlAs(ctx, a.kubeconfig, "-n", "liken-system", "scale", "deployment/cluster-operator", "--replicas", "0")
	assert.NilError(t, err, out)
}

// selfHostedLayer writes the layer of the fleet's documents, whose Leaders
// liken install gives their control plane (leader/) and the documents
// their init creates. It returns its path.
func (l *lab) selfHostedLayer(docs string) string {
	l.t.Helper()
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	cluster, ms, errs := layer.CheckFleet(parsed)
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	// Each machine's own join token: the leaders' init makes them tokens
	// of the cluster.
	tokens, err := layer.MachineTokens(ms, time.Now().Add(layer.DefaultJoinTokenTTL), nil)
	assert.NilError(l.t, err)
	layerFile := filepath.Join(l.dir, "layer.tgz")
	assert.NilError(l.t, (&layer.Layer{Cluster: cluster, Machines: ms, Identity: l.identity, Tokens: tokens}).WriteFile(layerFile, true))
	return layerFile
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
