// Package controlplane starts a real Kubernetes control plane on loopback:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok's
// simulated kubelets, all from the multi-call binary that `make kube` builds
// from pinned upstream sources. The lab and the e2e tests run on it.
package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/internal/srctree"
	nodecontrolplane "liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/join"
)

//go:embed stages.yaml
var stages []byte

// Identities the control plane accepts (static tokens).
const (
	// AdminUser is in group system:masters.
	AdminUser = "liken-admin"
	// OperatorUser is the identity cluster-operator runs as outside the
	// cluster: its service account's name, so that the manifests' RBAC,
	// which binds only the service account, applies to it.
	OperatorUser = "system:serviceaccount:liken-system:cluster-operator"
	// NodeGroup is the group of every machine identity.
	NodeGroup = join.NodeGroup
	// PowerLabel on a Node makes kwok report it NotReady while its value is
	// "off"; on its Node Lease it stops kwok's renewals.
	PowerLabel = "liken.sh/power"
	// KwokHolder is the holder of the Node Leases kwok renews for the
	// machines it simulates. A kubelet (or a test that plays one) holds its
	// Lease under its node name, and kwok leaves that Lease alone.
	KwokHolder = "kwok"
	// KwokAnnotation marks the nodes kwok simulates.
	KwokAnnotation = "kwok.x-k8s.io/node"
)

// Options configures a control plane.
type Options struct {
	// Dir holds every file of the control plane: certificates, kubeconfigs,
	// etcd's data and the logs. It must exist.
	Dir string
	// Binary is the multi-call binary built by `make kube`. Empty: found by
	// srctree.Binary.
	Binary string
	// Machines are the machine names given, when the control plane starts,
	// a key and a certificate of their own (system:node:<name> in group
	// system:nodes) issued by the control plane's CA, as a leader's setup
	// issues its own, in MachineKubeconfig. Joining with a join token is
	// liken-node's (node/join), tested on its own.
	Machines []string
	// TokenMachines are machine identities (system:node:<name> in group
	// system:nodes) given a static token instead of a joined certificate,
	// for load generators that play thousands of machines: one join and one
	// TLS connection each would outweigh what they measure.
	TokenMachines []string
	// CA is the certificate authority of the control plane (its serving
	// certificate, client certificates, machine certificates): a cluster
	// identity's server CA, so machines that join with that identity's
	// layer trust the API server. Nil: a throw-away CA.
	CA *CA
	// JoinTokens are machines' own join tokens, such as those of a layer,
	// which the control plane makes tokens of the cluster, as a leader's
	// control-plane init does.
	JoinTokens []nodecontrolplane.MachineToken
	// PodCIDR is the range the controller manager gives each Node a pod
	// range of (spec.network.podCIDR of the Clusters it runs). Empty:
	// v1alpha1.DefaultPodCIDR.
	PodCIDR string
	// ServiceCIDR is the range Services take their addresses from
	// (spec.network.serviceCIDR). Empty: v1alpha1.DefaultServiceCIDR.
	ServiceCIDR string
	// Detach starts the processes in their own session, so they outlive the
	// process that started them (the lab). Tests leave it false.
	Detach bool
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
}

// CA is a certificate authority: its certificate and private key, PEM.
type CA struct {
	Cert, Key []byte
}

// Process is one process the control plane started.
type Process struct {
	// Kind is the component: etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler or kwok.
	Kind string `json:"kind"`
	// Name names the process within the lab.
	Name string `json:"name"`
	// PID is its process ID.
	PID int `json:"pid"`
	// Log is the file its output goes to.
	Log string `json:"log"`
	// Started identifies the process beyond its PID, which the system
	// reuses: the host's boot ID and the process's start time in clock
	// ticks after that boot (empty: not recorded).
	Started string `json:"started,omitempty"`

	cmd *exec.Cmd
}

// ServerFromVM is the API server's URL as virtual machines on QEMU's user
// network reach it (its certificate names that address too).
func (cp *ControlPlane) ServerFromVM() string {
	return "https://" + qemu.HostAddress + cp.Server[strings.LastIndex(cp.Server, ":"):]
}

// ProcessStart is what Process.Started records of the running process
// pid, or "" when it does not exist.
func ProcessStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	// After the command name: state is field 3, starttime field 22.
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + f[19]
}

// Running reports whether the process is alive and still the one that was
// started: after a host reboot, or once it exited, its PID may belong to
// another program, which liken must never signal.
func (p Process) Running() bool {
	if p.PID <= 0 || !Alive(p.PID) {
		return false
	}
	return p.Started == "" || ProcessStart(p.PID) == p.Started
}

// Stop stops the process (SIGTERM, then SIGKILL after grace) if it is
// still the one that was started.
func (p Process) Stop(grace time.Duration) {
	if p.Running() {
		StopPID(p.PID, grace)
	}
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Dir is Options.Dir.
	Dir string
	// Server is the API server's URL.
	Server string
	// EtcdURL is the datastore's client URL. It serves TLS and takes only
	// clients with a certificate of the control plane's CA (the API
	// server's), so no local user reaches the data around RBAC.
	EtcdURL string
	// AdminKubeconfig is the path of the admin's kubeconfig.
	AdminKubeconfig string
	// OperatorKubeconfig is the path of cluster-operator's kubeconfig.
	OperatorKubeconfig string
	// Processes are the processes started, in start order.
	Processes []*Process

	caPEM  []byte
	tokens map[string]string // user -> token
	opts   Options
}

// Start brings up etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok, and returns once the API server is ready. On
// error, everything started so far is stopped.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if opts.Binary == "" {
		if opts.Binary, err = srctree.Binary("kube"); err != nil {
			return nil, err
		}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	network := likenv1.NetworkSpec{PodCIDR: opts.PodCIDR, ServiceCIDR: opts.ServiceCIDR}
	opts.PodCIDR, opts.ServiceCIDR = network.PodCIDROrDefault(), network.ServiceCIDROrDefault()
	// The leaders' flags (node/controlplane): each Node gets its pod range.
	nodeRanges, err := nodecontrolplane.ControllerManagerNetworkArgs(opts.PodCIDR, opts.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"pki", "logs", "kubeconfigs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	cp := &ControlPlane{Dir: dir, opts: opts, tokens: map[string]string{}}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()

	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort, kwokPort := ports[0], ports[1], ports[2], ports[3]
	cp.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)

	if err := cp.writePKI(); err != nil {
		return nil, fmt.Errorf("writing certificates: %w", err)
	}
	if err := cp.writeTokens(); err != nil {
		return nil, fmt.Errorf("writing tokens: %w", err)
	}

	pki := func(f string) string { return filepath.Join(dir, "pki", f) }
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", etcdClient)
	cp.EtcdURL = etcdURL
	peerURL := fmt.Sprintf("https://127.0.0.1:%d", etcdPeer)
	if err := cp.start("etcd", "etcd",
		"--name", "default",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL,
		"--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--cert-file", pki("etcd.crt"),
		"--key-file", pki("etcd.key"),
		"--trusted-ca-file", pki("ca.crt"),
		"--client-cert-auth",
		"--peer-cert-file", pki("etcd.crt"),
		"--peer-key-file", pki("etcd.key"),
		"--peer-trusted-ca-file", pki("ca.crt"),
		"--peer-client-cert-auth",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	); err != nil {
		return nil, err
	}
	apiserverArgs := []string{
		"--etcd-servers", etcdURL,
		"--etcd-cafile", pki("ca.crt"),
		"--etcd-certfile", pki("apiserver-etcd-client.crt"),
		"--etcd-keyfile", pki("apiserver-etcd-client.key"),
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none",
		"--secure-port", fmt.Sprint(apiPort),
		"--tls-cert-file", pki("apiserver.crt"),
		"--tls-private-key-file", pki("apiserver.key"),
		"--client-ca-file", pki("ca.crt"),
		"--token-auth-file", pki("tokens.csv"),
		"--enable-bootstrap-token-auth",
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pki("sa.key"),
		"--service-account-signing-key-file", pki("sa.key"),
		"--service-cluster-ip-range", opts.ServiceCIDR,
		"--allow-privileged",
		"--v", "1",
	}
	if err := cp.start("kube-apiserver", "kube-apiserver", apiserverArgs...); err != nil {
		return nil, err
	}

	cp.AdminKubeconfig = filepath.Join(dir, "kubeconfigs", "admin.kubeconfig")
	cp.OperatorKubeconfig = filepath.Join(dir, "kubeconfigs", "cluster-operator.kubeconfig")
	if err := cp.writeKubeconfig(cp.AdminKubeconfig, AdminUser); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(cp.OperatorKubeconfig, OperatorUser); err != nil {
		return nil, err
	}
	if err := cp.waitReady(ctx, 90*time.Second); err != nil {
		return nil, err
	}
	opts.Log("kube-apiserver ready at %s", cp.Server)
	if err := cp.setUpJoin(ctx); err != nil {
		return nil, fmt.Errorf("setting up the join token: %w", err)
	}

	common := []string{
		"--kubeconfig", cp.AdminKubeconfig,
		"--authentication-kubeconfig", cp.AdminKubeconfig,
		"--authorization-kubeconfig", cp.AdminKubeconfig,
		"--leader-elect=false",
		"--secure-port", "0",
	}
	if err := cp.start("kube-controller-manager", "kube-controller-manager", append(append(common,
		"--service-account-private-key-file", pki("sa.key"),
		"--root-ca-file", pki("ca.crt"),
		// Machines join through TLS bootstrap: the controller manager
		// approves their requests for a kubelet client certificate and
		// signs them with the CA the API server trusts for clients.
		"--cluster-signing-cert-file", pki("ca.crt"),
		"--cluster-signing-key-file", pki("ca.key"),
		"--controllers", "*,-serviceaccount-token",
		"--use-service-account-credentials=false",
	), nodeRanges...)...); err != nil {
		return nil, err
	}
	if err := cp.start("kube-scheduler", "kube-scheduler", common...); err != nil {
		return nil, err
	}
	stagesFile := filepath.Join(dir, "kwok-stages.yaml")
	if err := os.WriteFile(stagesFile, stages, 0o600); err != nil {
		return nil, err
	}
	if err := cp.start("kwok", "kwok",
		"--kubeconfig", cp.AdminKubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector", KwokAnnotation+"=fake",
		"--server-address", fmt.Sprintf("127.0.0.1:%d", kwokPort),
		// The Node Leases are renewed by liken's stages (stages.yaml), which
		// stop while a machine is powered off; kwok's own lease controller
		// would renew them regardless.
		"--node-lease-duration-seconds", "0",
		"--cidr", opts.PodCIDR,
		"--node-ip", "10.0.0.1",
		"--config", stagesFile,
	); err != nil {
		return nil, err
	}
	if err := cp.issueMachines(opts.Machines); err != nil {
		return nil, err
	}
	return cp, nil
}

// MachineKubeconfig is the path of a machine's kubeconfig.
func (cp *ControlPlane) MachineKubeconfig(machine string) string {
	return filepath.Join(cp.Dir, "kubeconfigs", "machine-"+machine+".kubeconfig")
}

// Config is a rest.Config for one of the identities the control plane
// knows: AdminUser, OperatorUser or "system:node:<machine>" for a machine
// of Options.Machines (its joined certificate) or Options.TokenMachines.
func (cp *ControlPlane) Config(user string) *rest.Config {
	if m, ok := strings.CutPrefix(user, "system:node:"); ok && cp.tokens[user] == "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", cp.MachineKubeconfig(m))
		if err != nil {
			// Only a programming error gets here: the machine did not join.
			panic(fmt.Sprintf("machine %s has no kubeconfig: %v", m, err))
		}
		cfg.QPS, cfg.Burst = 200, 400
		return cfg
	}
	return &rest.Config{
		Host:            cp.Server,
		BearerToken:     cp.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             200,
		Burst:           400,
	}
}

// AdminConfig is the admin's rest.Config.
func (cp *ControlPlane) AdminConfig() *rest.Config { return cp.Config(AdminUser) }

// AddNode registers a Node that kwok simulates, Ready within seconds, and
// its Node Lease in kube-node-lease, which kwok renews every 10 s as a
// kubelet would (held by KwokHolder) while the Node is powered on. A test
// that renews the Lease itself, as system:node:<name>, takes it over: kwok
// renews only the Leases KwokHolder holds.
func (cp *ControlPlane) AddNode(ctx context.Context, name string, labels map[string]string) error {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return err
	}
	l := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
	for k, v := range labels {
		l[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      l,
			Annotations: map[string]string{KwokAnnotation: "fake"},
		},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{"cpu": mustQuantity("32"), "memory": mustQuantity("256Gi"), "pods": mustQuantity("110")},
			Capacity:    corev1.ResourceList{"cpu": mustQuantity("32"), "memory": mustQuantity("256Gi"), "pods": mustQuantity("110")},
		},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("registering node %s: %w", name, err)
	}
	leaseLabels := map[string]string{}
	if v, ok := labels[PowerLabel]; ok {
		leaseLabels[PowerLabel] = v
	}
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: corev1.NamespaceNodeLease, Labels: leaseLabels,
			// Deleted with its Node, as the kubelet's is.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: created.UID}},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(KwokHolder), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, lease, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering the Node Lease of node %s: %w", name, err)
	}
	return nil
}

// SetPower turns a node's simulated power on or off: while off, kwok
// reports the Node NotReady and stops renewing its Node Lease.
func (cp *ControlPlane) SetPower(ctx context.Context, name string, on bool) error {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return err
	}
	return SetNodePower(ctx, cs, name, on)
}

// SetNodePower turns a kwok node's simulated power on or off (its Node and
// Node Lease), in an order that never shows Ready with a silent Lease
// (docs/development.md#the-fixture).
func SetNodePower(ctx context.Context, cs kubernetes.Interface, name string, on bool) error {
	if on {
		now := metav1.Now().UTC().Format(time.RFC3339)
		status := `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletStarting",` +
			`"message":"the machine is powered on; its kubelet is starting","lastHeartbeatTime":"` + now + `","lastTransitionTime":"` + now + `"}]}}`
		if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{}, "status"); err != nil {
			return err
		}
	}
	patch := []byte(`{"metadata":{"labels":{"` + PowerLabel + `":"off"}}}`)
	if on {
		patch = []byte(`{"metadata":{"labels":{"` + PowerLabel + `":null}}}`)
	}
	node := func() error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	leasePatch := patch
	if on {
		// A kubelet renews its Lease as soon as it starts: the machine
		// is not silent for kwok's first renewal, 10 to 20 s later.
		now := metav1.NewMicroTime(time.Now()).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
		leasePatch = []byte(`{"metadata":{"labels":{"` + PowerLabel + `":null}},"spec":{"renewTime":"` + now + `"}}`)
	}
	lease := func() error {
		_, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Patch(ctx, name, types.MergePatchType, leasePatch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil // no Lease: nothing renews it
		}
		return err
	}
	steps := []func() error{lease, node}
	if on {
		steps = []func() error{node, lease}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// PostNodeBoot does what a kubelet does when it starts in a new boot: it
// posts the Node's status with the boot's ID (status.nodeInfo.bootID) and
// a Ready heartbeat of now. Call it once the node's power is on.
func PostNodeBoot(ctx context.Context, cs kubernetes.Interface, name, bootID string) error {
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"nodeInfo":{"bootID":%q},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":%q}]}}`, bootID, now)
	_, err := cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	return err
}

// Kubectl runs kubectl as the admin and returns its combined output.
func (cp *ControlPlane) Kubectl(ctx context.Context, args ...string) (string, error) {
	return cp.KubectlAs(ctx, cp.AdminKubeconfig, args...)
}

// KubectlAs runs kubectl with the given kubeconfig.
func (cp *ControlPlane) KubectlAs(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	return Kubectl(ctx, kubeconfig, args...)
}

// Kubectl runs kubectl with the given kubeconfig; an error holds its
// output. It runs the kubectl make build writes beside the control plane
// (srctree.Binary), of the control plane's own version, never another one
// the computer may have installed.
func Kubectl(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	kubectl, err := srctree.Binary("kubectl")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Stop ends every process the control plane started, newest first: SIGTERM,
// then SIGKILL after 10 s.
func (cp *ControlPlane) Stop() {
	for i := len(cp.Processes) - 1; i >= 0; i-- {
		StopPID(cp.Processes[i].PID, 10*time.Second)
		if c := cp.Processes[i].cmd; c != nil {
			_ = c.Wait()
		}
	}
}

// StopPID sends SIGTERM to a process, then SIGKILL if it is still alive
// after grace. It returns once the process is gone.
func StopPID(pid int, grace time.Duration) {
	if pid <= 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for Alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(grace)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Alive reports whether a process exists and is not a zombie.
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// Logs returns the last bytes of every process's log, for a failed test.
func (cp *ControlPlane) Logs(tail int) string {
	var b strings.Builder
	for _, p := range cp.Processes {
		data, _ := os.ReadFile(p.Log)
		if len(data) > tail {
			data = data[len(data)-tail:]
		}
		fmt.Fprintf(&b, "===== %s (%s) =====\n%s\n", p.Name, p.Log, data)
	}
	return b.String()
}

func (cp *ControlPlane) start(kind, name string, args ...string) error {
	logPath := filepath.Join(cp.Dir, "logs", name+".log")
	p, err := StartProcess(cp.opts.Binary, append([]string{kind}, args...), logPath, cp.opts.Detach)
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p.Kind, p.Name = kind, name
	cp.Processes = append(cp.Processes, p)
	cp.opts.Log("started %s (pid %d, log %s)", name, p.PID, logPath)
	return nil
}

// StartProcess starts a program with its output appended to logPath. With
// detach, the process gets its own session and outlives the caller.
func StartProcess(binary string, args []string, logPath string, detach bool) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: !detach, Setsid: detach}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{PID: cmd.Process.Pid, Log: logPath, Started: ProcessStart(cmd.Process.Pid)}
	if detach {
		_ = cmd.Process.Release()
	} else {
		p.cmd = cmd
	}
	return p, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.caPEM)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, p := range cp.Processes {
			if p.cmd != nil && p.cmd.ProcessState != nil || !Alive(p.PID) {
				return fmt.Errorf("%s exited while the control plane was starting; its log:\n%s", p.Name, tailFile(p.Log, 4000))
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.Server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.tokens[AdminUser])
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("/readyz answered %s", resp.Status)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver was not ready after %s (%v); its log:\n%s", timeout, last, tailFile(filepath.Join(cp.Dir, "logs", "kube-apiserver.log"), 4000))
}

func (cp *ControlPlane) writeTokens() error {
	users := []struct{ name, groups string }{
		{AdminUser, "system:masters"},
		{OperatorUser, "system:serviceaccounts,system:serviceaccounts:liken-system"},
	}
	for _, m := range cp.opts.TokenMachines {
		users = append(users, struct{ name, groups string }{"system:node:" + m, NodeGroup})
	}
	var b strings.Builder
	for i, u := range users {
		tok := make([]byte, 16)
		if _, err := rand.Read(tok); err != nil {
			return err
		}
		t := hex.EncodeToString(tok)
		cp.tokens[u.name] = t
		fmt.Fprintf(&b, "%s,%s,uid-%d,%q\n", t, u.name, i, u.groups)
	}
	return os.WriteFile(filepath.Join(cp.Dir, "pki", "tokens.csv"), []byte(b.String()), 0o600)
}

func (cp *ControlPlane) writeKubeconfig(path, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["liken"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthorityData: cp.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cp.tokens[user]}
	cfg.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: user}
	cfg.CurrentContext = "liken"
	return clientcmd.WriteToFile(*cfg, path)
}

// freePorts asks the kernel for n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
