// Package vme2e runs liken's real OS image in virtual machines: disks written by liken install, booted by QEMU through GRUB, joining a control plane with NodeRestriction on.
package vme2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/install"
	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/cli/layer"
	clirelease "liken.sh/liken/cli/release"
	boote2e "liken.sh/liken/e2e/boot"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/image"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/internal/srctree"
	"liken.sh/liken/manifests"
	"liken.sh/liken/node/boot/diskimage"
)

// lab is a control plane on the host, a release channel served over HTTP,
// and the OS image published in it.
type lab struct {
	t        *testing.T
	kit      *boote2e.Kit
	cp       *controlplane.ControlPlane
	kube     kubernetes.Interface
	liken    versioned.Interface
	dir      string
	image    string // folder of make image's output
	channel  string // the channel folder
	source   string // the channel's URL as the machines see it
	identity *layer.Identity
	grub     *install.BootCode
	// trialTimeout is the Cluster's disruption.trialTimeout (0: its
	// default).
	trialTimeout time.Duration
	// machines is the fleet's size.
	machines int
}

func newLab(t *testing.T) *lab {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	l := &lab{t: t, dir: t.TempDir(), image: filepath.Join(repo, "_output", "image")}
	for _, f := range image.Files {
		if _, err := os.Stat(filepath.Join(l.image, f)); err != nil {
			t.Fatalf("the OS image is not built (%v): run make image, which make test runs first", err)
		}
	}
	l.kit, err = boote2e.Prepare(t.Logf)
	assert.NilError(t, err)
	l.grub, err = install.BootCodeOf(diskimage.UnpackedGRUB(l.kit.Root))
	assert.NilError(t, err)

	// The control plane serves with the server CA of the cluster identity
	// the machines' layer carries; it takes their join tokens when the
	// layer is written (fleet).
	l.identity, err = layer.GenerateIdentity(layer.GenerateOptions{Cluster: "vm"})
	assert.NilError(t, err)
	l.cp = controlplanetest.Start(t, controlplane.Options{
		CA: &controlplane.CA{Cert: l.identity.Files["server-ca.crt"], Key: l.identity.Files["server-ca.key"]},
	})
	ctx := context.Background()
	// Every manifest but cluster-operator's Deployment: the operator runs
	// on the host, as the lab's does.
	for _, f := range []string{"00-namespace.yaml", "10-crd-cluster.yaml", "11-crd-machine.yaml", "20-rbac-operator.yaml", "21-rbac-machine.yaml", "22-admission-machine.yaml"} {
		out, err := l.cp.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(repo, "manifests", f))
		assert.NilError(t, err, out)
	}
	l.kube, err = kubernetes.NewForConfig(l.cp.AdminConfig())
	assert.NilError(t, err)
	l.liken, err = versioned.NewForConfig(l.cp.AdminConfig())
	assert.NilError(t, err)

	l.channel = filepath.Join(l.dir, "channel")
	srv := httptest.NewServer(http.FileServer(http.Dir(l.channel)))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	assert.NilError(t, err)
	// QEMU's user network takes the machines to the host's loopback.
	l.source = "http://" + qemu.HostAddress + ":" + port
	return l
}

// fleet writes the Cluster on rel and the machines (the first a leader)
// to the API and into a layer, and returns the layer's path.
func (l *lab) fleet(rel *clirelease.Result, machines ...string) string {
	l.machines = len(machines)
	disruption := "{maxUnavailable: 1}"
	if l.trialTimeout > 0 {
		disruption = fmt.Sprintf("{maxUnavailable: 1, trialTimeout: %s}", l.trialTimeout)
	}
	docs := fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata: {name: vm}
spec:
  version: %q
  releases:
    source: %s
    catalog: [{version: %q, digest: %q}]
  network: {endpoint: %q}
  disruption: %s
`, rel.Version, l.source, rel.Version, rel.Digest, l.cp.ServerFromVM(), disruption)
	for i, m := range machines {
		role := likenv1.RoleWorker
		if i == 0 {
			role = likenv1.RoleLeader
		}
		docs += fmt.Sprintf("---\napiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata: {name: %s}\nspec: {cluster: vm, role: %s, rebootPolicy: Auto}\n", m, role)
	}
	file := filepath.Join(l.dir, "fleet.yaml")
	assert.NilError(l.t, os.WriteFile(file, []byte(docs), 0o644))
	out, err := l.cp.Kubectl(context.Background(), "apply", "--server-side", "-f", file)
	assert.NilError(l.t, err, out)
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	cluster, ms, errs := layer.CheckFleet(parsed)
	assert.Assert(l.t, len(errs) == 0, "%v", errs)
	// Each machine joins with a token of its own, which the control plane
	// takes as a leader's init does, and cluster-operator approves.
	tokens, err := layer.MachineTokens(ms, time.Now().Add(layer.DefaultJoinTokenTTL), nil)
	assert.NilError(l.t, err)
	assert.NilError(l.t, l.cp.CreateJoinTokens(context.Background(), tokens))
	layerFile := filepath.Join(l.dir, "layer.tgz")
	assert.NilError(l.t, (&layer.Layer{Cluster: cluster, Machines: ms, Identity: l.identity, Tokens: tokens}).WriteFile(layerFile, true))
	return layerFile
}

// vm is one virtual machine of the lab.
type vm struct {
	l     *lab
	name  string
	disk  string
	log   string
	qemu  *boote2e.VM
	boots int
	// hw is the machine's hardware; nil takes the lab's (clilab.VMHardware).
	hw *qemu.Hardware
}

// install writes the machine's disk with liken install, from the release
// folder on the channel.
func (l *lab) install(name, layerFile string, rel *clirelease.Result) *vm {
	m := &vm{l: l, name: name, disk: filepath.Join(l.dir, name+".img")}
	start := time.Now()
	_, err := install.Install(context.Background(), install.Options{
		Disk: m.disk, Release: rel.Dir, Layer: layerFile, Machine: name, Size: 3 << 30,
		GRUB: l.grub, TempDir: l.dir,
		// The leader joins the control plane on the host.
		ExternalControlPlane: true,
	})
	assert.NilError(l.t, err)
	l.t.Logf("%s: disk written by liken install in %s", name, time.Since(start).Round(time.Millisecond))
	return m
}

// powerOn starts the virtual machine; the test's end pulls its power.
func (m *vm) powerOn() {
	m.boots++
	m.log = filepath.Join(m.l.dir, fmt.Sprintf("%s-console-%d.log", m.name, m.boots))
	hw := clilab.VMHardware(m.l.machines)
	if m.hw != nil {
		hw = *m.hw
	}
	q, err := m.l.kit.Start(m.disk, m.log, hw)
	assert.NilError(m.l.t, err)
	m.qemu = q
	m.l.t.Cleanup(func() {
		q.Kill()
		if m.l.t.Failed() {
			b, _ := os.ReadFile(m.log)
			m.l.t.Logf("%s console (boot %d), last 6000 bytes:\n%s", m.name, m.boots, tail(string(b), 6000))
		}
	})
}

// unitFailures are console lines of a unit that cannot start on liken's
// root: a write to the read-only image, or systemd unable to set up the
// unit's sandbox.
var unitFailures = regexp.MustCompile(`(?im)^.*(read-only file system|status=[0-9]+/NAMESPACE).*$`)

// loginPrompt is a console line of a getty: a terminal that offers a
// login, which a liken machine never does.
var loginPrompt = regexp.MustCompile(`(?m)^.*(login: *$|Started [a-z-]*getty).*$`)

// consoleClean checks that the image's units started on the machine's
// current boot: no write hit the read-only root, and
// systemd-timesyncd, whose sandbox needs a writable /tmp, runs; and that
// its console offers no login.
func (m *vm) consoleClean() {
	m.l.t.Helper()
	b, err := os.ReadFile(m.log)
	assert.NilError(m.l.t, err)
	bad := unitFailures.FindAllString(string(b), 5)
	assert.Check(m.l.t, len(bad) == 0, "%s's console:\n%s", m.name, strings.Join(bad, "\n"))
	login := loginPrompt.FindAllString(string(b), 5)
	assert.Check(m.l.t, len(login) == 0, "%s's console offers a login:\n%s", m.name, strings.Join(login, "\n"))
	assert.Check(m.l.t, is.Contains(string(b), "Started systemd-timesyncd.service"), "%s: systemd-timesyncd did not start", m.name)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitNodeReady waits until the machine's kubelet reports its Node Ready
// and returns how long that took since power on.
func (m *vm) waitNodeReady(timeout time.Duration) time.Duration {
	m.l.t.Helper()
	poll.WaitOn(m.l.t, func(poll.LogT) poll.Result {
		if exited, err := m.qemu.Exited(); exited {
			return poll.Error(fmt.Errorf("the virtual machine stopped: %v", err))
		}
		n, err := m.l.kube.CoreV1().Nodes().Get(context.Background(), m.name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("Node %s: %v", m.name, err)
		}
		if !nodeReady(n) {
			return poll.Continue("Node %s is not Ready", m.name)
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(time.Second))
	return time.Since(m.qemu.Started)
}

// nodeReady tells whether the Node's kubelet reports it Ready.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// machine reads the machine's Machine.
func (m *vm) machine() *likenv1.Machine {
	got, err := m.l.liken.LikenV1alpha1().Machines().Get(context.Background(), m.name, metav1.GetOptions{})
	assert.NilError(m.l.t, err)
	return got
}

// variant publishes the OS image as release version, with change applied
// to its root first (nil: none), as liken lab publish does.
func (l *lab) variant(version string, change func(root string)) *clirelease.Result {
	l.t.Helper()
	var c func(string) error
	if change != nil {
		c = func(root string) error { change(root); return nil }
	}
	rel, err := clilab.PublishOSImage(l.image, l.channel, filepath.Join(l.dir, "images"), version, c)
	assert.NilError(l.t, err)
	return rel
}

// moveTo catalogues rel in the Cluster and sets its version to it, with
// edits in the same write.
func (l *lab) moveTo(rel *clirelease.Result, edits ...func(*likenv1.Cluster)) {
	ctx := context.Background()
	c, err := l.liken.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(l.t, err)
	c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: rel.Version, Digest: rel.Digest})
	c.Spec.Version = rel.Version
	for _, edit := range edits {
		edit(c)
	}
	_, err = l.liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(l.t, err)
}

// startOperator runs cluster-operator on the host, as the machines'
// control plane does for now.
func (l *lab) startOperator() {
	fleetsim.StartOperator(l.t, l.cp, "op-1", "--startup-grace", "2s")
}

// waitRelease waits until every machine reports running version from
// slot and its Node is Ready.
func (l *lab) waitRelease(ms []*vm, version, slot string, timeout time.Duration) {
	l.t.Helper()
	poll.WaitOn(l.t, func(poll.LogT) poll.Result {
		for _, m := range ms {
			if exited, err := m.qemu.Exited(); exited {
				return poll.Error(fmt.Errorf("%s stopped: %v", m.name, err))
			}
			st := m.machine().Status
			if st.Version != version || st.Slot != slot || st.Phase != likenv1.MachineReady {
				return poll.Continue("%s: %s on %q from slot %q (want %s from %s), staged %q", m.name, st.Phase, st.Version, st.Slot, version, slot, st.Staged)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(2*time.Second))
}

// workload runs a Deployment of the preloaded workload image, one pod per
// machine but one (at least one), with a PodDisruptionBudget that lets one
// go at a time, and waits until it is available.
func (l *lab) workload(machines int) {
	ctx := context.Background()
	replicas := int32(max(1, machines-1))
	labels := map[string]string{"app": "workload"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "workload", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name: "workload", Image: "liken.sh/workload:1.0", ImagePullPolicy: corev1.PullNever,
					}},
				},
			},
		},
	}
	_, err := l.kube.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{})
	assert.NilError(l.t, err)
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "workload", Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, MaxUnavailable: &one},
	}
	_, err = l.kube.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{})
	assert.NilError(l.t, err)
	l.waitWorkloadAvailable(5 * time.Minute)
}

// runOperatorImage runs cluster-operator's preloaded image on machine m
// under the pod template of its Deployment in manifests/ (its service
// account, user and security context), with --version instead of its
// flags, and checks the binary ran: the image the OS image preloads is the
// one the Deployment names, and it starts with no registry.
func (l *lab) runOperatorImage(m *vm) {
	ctx := context.Background()
	d, err := manifests.OperatorDeployment()
	assert.NilError(l.t, err)
	spec := d.Spec.Template.Spec.DeepCopy()
	spec.NodeName = m.name
	// The image is what this checks, on whichever machine: the template
	// requires a leader (TestOperatorRunsOnLeadersOnly in e2e/api checks
	// that), and a kubelet refuses a pod bound to it against its affinity.
	spec.Affinity, spec.TopologySpreadConstraints = nil, nil
	spec.RestartPolicy = corev1.RestartPolicyNever
	c := &spec.Containers[0]
	c.Args = []string{"--version"}
	c.StartupProbe, c.LivenessProbe, c.ReadinessProbe = nil, nil, nil
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "operator-image", Namespace: d.Namespace}, Spec: *spec}
	_, err = l.kube.CoreV1().Pods(d.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	assert.NilError(l.t, err)
	poll.WaitOn(l.t, func(poll.LogT) poll.Result {
		p, err := l.kube.CoreV1().Pods(d.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if p.Status.Phase == corev1.PodFailed && len(p.Status.ContainerStatuses) == 0 {
			return poll.Error(fmt.Errorf("%s on %s: the kubelet refused the pod: %s: %s", c.Image, m.name, p.Status.Reason, p.Status.Message))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "ContainerCreating" {
				return poll.Error(fmt.Errorf("%s on %s: %s: %s", c.Image, m.name, w.Reason, w.Message))
			}
			if x := cs.State.Terminated; x != nil {
				if x.ExitCode != 0 {
					return poll.Error(fmt.Errorf("%s on %s exited %d: %s %s", c.Image, m.name, x.ExitCode, x.Reason, x.Message))
				}
				return poll.Success()
			}
		}
		return poll.Continue("%s on %s: pod %s", c.Image, m.name, p.Status.Phase)
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(time.Second))
	assert.NilError(l.t, l.kube.CoreV1().Pods(d.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}))
}

// waitWorkloadAvailable waits until every replica of the workload is
// available.
func (l *lab) waitWorkloadAvailable(timeout time.Duration) {
	l.t.Helper()
	poll.WaitOn(l.t, func(poll.LogT) poll.Result {
		d, err := l.kube.AppsV1().Deployments("default").Get(context.Background(), "workload", metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas {
			return poll.Success()
		}
		return poll.Continue("workload: %d of %d available", d.Status.AvailableReplicas, *d.Spec.Replicas)
	}, poll.WithTimeout(timeout), poll.WithDelay(time.Second))
}

// workloadPods returns the workload's running pods: UID to node.
func (l *lab) workloadPods() map[string]string {
	pods, err := l.kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=workload"})
	assert.NilError(l.t, err)
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			out[string(p.UID)] = p.Spec.NodeName
		}
	}
	return out
}

// agentSettings sets the Cluster's settings.k3sArgs to arg (a kubelet
// --max-pods flag) with a registry mirror, and waits until every Node's
// kubelet allows that many pods and every Machine is Ready with nothing
// pending: the same boot, the same workload pods.
func (l *lab) agentSettings(ms []*vm, arg string) {
	l.t.Helper()
	ctx := context.Background()
	boots := map[string]string{}
	for _, m := range ms {
		n, err := l.kube.CoreV1().Nodes().Get(ctx, m.name, metav1.GetOptions{})
		assert.NilError(l.t, err)
		boots[m.name] = n.Status.NodeInfo.BootID
	}
	pods := l.workloadPods()
	c, err := l.liken.LikenV1alpha1().Clusters().Get(ctx, "vm", metav1.GetOptions{})
	assert.NilError(l.t, err)
	c.Spec.Settings.K3sArgs = []string{arg}
	c.Spec.Settings.RegistryMirrors = []likenv1.RegistryMirror{{Registry: "registry.example:5000", Endpoints: []string{"http://10.0.2.2:5000"}}}
	_, err = l.liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.NilError(l.t, err)
	want := strings.TrimPrefix(arg, "--max-pods=")
	poll.WaitOn(l.t, func(poll.LogT) poll.Result {
		for _, m := range ms {
			n, err := l.kube.CoreV1().Nodes().Get(ctx, m.name, metav1.GetOptions{})
			if err != nil {
				return poll.Error(err)
			}
			if got := n.Status.Allocatable.Pods().String(); got != want {
				return poll.Continue("Node %s allows %s pods", m.name, got)
			}
			st := m.machine().Status
			if st.Phase != likenv1.MachineReady || len(st.Pending) > 0 {
				return poll.Continue("%s: %s, pending %v", m.name, st.Phase, st.Pending)
			}
			if n.Status.NodeInfo.BootID != boots[m.name] {
				return poll.Error(fmt.Errorf("%s rebooted for a change of its node agent's settings", m.name))
			}
		}
		return poll.Success()
	}, poll.WithTimeout(time.Duration(len(ms))*5*time.Minute), poll.WithDelay(2*time.Second))
	after := l.workloadPods()
	for uid, node := range pods {
		_, kept := after[uid]
		assert.Assert(l.t, kept, "pod %s on %s did not survive the restart of the node agent", uid, node)
	}
}

// fleetSize is how many virtual machines TestUpgradeThroughRealReboots
// runs: LIKEN_VM_MACHINES, 3 by default.
func fleetSize(t *testing.T) int {
	n := 3
	if v := os.Getenv("LIKEN_VM_MACHINES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		assert.NilError(t, err, "LIKEN_VM_MACHINES")
	}
	return n
}

// watchdogArmed starts the console line of a trial boot's init that says
// how long the watchdog gives liken-node.
const watchdogArmed = "liken-boot: watchdog armed: liken-node must feed it within"

// TestUpgradeThroughRealReboots: a fleet of virtual machines joins (TLS
// bootstrap, NodeRestriction), runs pods under a PodDisruptionBudget, and
// moves from A to B and back to A through real GRUB and real reboots, one
// machine at a time, each drain evicting its pods, with the kernel
// arguments set in the same write on each trial's kernel command line;
// then a release whose
// init panics falls back to the proven slot with no help, on the one
// machine that tried it, and the rollout halts. With one machine (make
// test) it moves A to B only.
func TestUpgradeThroughRealReboots(t *testing.T) {
	l := newLab(t)
	r1 := l.variant("2026.12.01-001", nil)
	var names []string
	for i := 1; i <= fleetSize(t); i++ {
		names = append(names, fmt.Sprintf("vm-%d", i))
	}
	layerFile := l.fleet(r1, names...)
	// cluster-operator approves the machines' certificates: it runs
	// before they join.
	l.startOperator()
	var ms []*vm
	for _, n := range names {
		m := l.install(n, layerFile, r1)
		m.powerOn()
		ms = append(ms, m)
	}
	// About 2 minutes for one machine; three machines of one vCPU each
	// on a loaded 2-core host once took more than 8 minutes to register.
	for _, m := range ms {
		t.Logf("%s: Node Ready %s after power on", m.name, m.waitNodeReady(15*time.Minute).Round(time.Second))
		m.consoleClean()
	}
	// The machines joined through TLS bootstrap with their own join tokens
	// from the layer, under NodeRestriction, and liken-node reports the
	// release.
	l.waitRelease(ms, r1.Version, "A", 3*time.Minute)
	// Pods of the preloaded workload run on the machines (no registry),
	// under a PodDisruptionBudget.
	start := time.Now()
	l.workload(len(ms))
	t.Logf("workload available %s after it was created", time.Since(start).Round(time.Second))
	// cluster-operator's Deployment can run on a liken machine with no
	// registry: its image is preloaded.
	start = time.Now()
	l.runOperatorImage(ms[0])
	t.Logf("%s: cluster-operator's preloaded image ran under its Deployment's pod template in %s", ms[0].name, time.Since(start).Round(time.Second))

	steps := []struct{ version, slot string }{{"2026.12.01-002", "B"}, {"2026.12.01-003", "A"}}
	if len(ms) == 1 {
		// make test's short run: one upgrade, A to B; the panic release
		// below is then written over slot A, the slot the machine left.
		steps = steps[:1]
	}
	// Kernel arguments set with the first upgrade reach each machine in its
	// turn, on the trial's kernel command line, and stay on the next ones.
	kernelArg := "likentest.turn=1"
	for _, step := range steps {
		rel := l.variant(step.version, nil)
		before := l.workloadPods()
		start := time.Now()
		l.moveTo(rel, func(c *likenv1.Cluster) { c.Spec.Settings.KernelArgs = []string{kernelArg} })
		// One machine at a time: about 6 minutes each on a quiet host,
		// more than 7 when three share a loaded one.
		l.waitRelease(ms, rel.Version, step.slot, time.Duration(len(ms))*12*time.Minute)
		t.Logf("fleet of %d on %s from slot %s in %s", len(ms), rel.Version, step.slot, time.Since(start).Round(time.Second))
		// Every machine drained: each pod that ran before was evicted
		// (under the budget) and replaced.
		l.waitWorkloadAvailable(5 * time.Minute)
		after := l.workloadPods()
		for uid, node := range before {
			_, kept := after[uid]
			assert.Assert(t, !kept, "pod %s on %s was not evicted by the drain", uid, node)
		}
		for _, m := range ms {
			_, ok := m.qemu.Find(fmt.Sprintf("liken-boot: booting slot %s (trial true)", step.slot))
			assert.Assert(t, ok, "%s did not boot a trial of slot %s", m.name, step.slot)
			line, ok := m.qemu.Find("liken-boot: kernel command line: ")
			assert.Assert(t, ok, "%s's trial boot's init did not print its kernel command line", m.name)
			assert.Assert(t, strings.HasSuffix(line, " "+kernelArg), "%s's trial boot did not pass %s last: %s", m.name, kernelArg, line)
			// The init checked the boot partition before mounting it
			// (read-only: liken-node's writes of the release's kernel and
			// of the boot state above made it writable for their time).
			checked, ok := m.qemu.Find("liken-boot: boot partition ")
			assert.Assert(t, ok, "%s: the trial boot's init did not check the boot partition", m.name)
			assert.Check(t, is.Contains(checked, "checked in"), "%s", m.name)
			// The trial's watchdog is armed with the Cluster's trial
			// timeout (the default 10 minutes), not the init's first 180 s.
			armed, ok := m.qemu.Find(watchdogArmed)
			assert.Assert(t, ok, "%s: the trial boot's init did not arm the watchdog", m.name)
			assert.Check(t, is.Contains(armed, "(what is left of the trial timeout of 10m0s)"), "%s", m.name)
		}
	}

	// The node agent's settings (class RestartK3s): containerd and kubelet
	// restart in place with the new kubelet argument, the leader in its
	// RestartK3s turn; no machine reboots and no pod is replaced.
	start = time.Now()
	l.agentSettings(ms, "--max-pods=150")
	t.Logf("fleet of %d restarted its node agent with a new kubelet argument in %s", len(ms), time.Since(start).Round(time.Second))

	// A release whose init cannot start: liken-boot finds no /sbin/init,
	// the kernel panics and reboots, and GRUB boots the proven slot.
	last := steps[len(steps)-1]
	previous, proven, other := last.version, last.slot, "A"
	if proven == "A" {
		other = "B"
	}
	bad := l.variant("2026.12.01-004", func(root string) {
		assert.NilError(t, os.Remove(filepath.Join(root, "sbin", "init")))
	})
	start = time.Now()
	l.moveTo(bad)
	var failed *vm
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, m := range ms {
			for _, c := range m.machine().Status.Conditions {
				if c.Type == likenv1.ConditionTrialFailed && c.Status == metav1.ConditionTrue {
					failed = m
					return poll.Success()
				}
			}
		}
		return poll.Continue("no machine reports a failed trial of %s", bad.Version)
	}, poll.WithTimeout(15*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("%s: trial of %s failed and the machine is back in %s", failed.name, bad.Version, time.Since(start).Round(time.Second))
	_, ok := failed.qemu.Find("liken-boot: booting slot " + other + " (trial true)")
	assert.Assert(t, ok, "%s did not boot a trial of slot %s", failed.name, other)
	_, ok = failed.qemu.Find("Kernel panic")
	assert.Assert(t, ok, "%s: the kernel did not panic", failed.name)
	_, ok = failed.qemu.Find("liken-boot: booting slot " + proven + " (trial false)")
	assert.Assert(t, ok, "%s did not boot its proven slot %s after the panic", failed.name, proven)
	// Back on the release it had, Ready; the rollout halts, so no other
	// machine tries the release.
	st := failed.machine().Status
	assert.Equal(t, st.Version, previous)
	assert.Equal(t, st.Slot, proven)
	failed.waitNodeReady(3 * time.Minute)
	c, err := l.liken.LikenV1alpha1().Clusters().Get(context.Background(), "vm", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, c.Status.Halt != nil && c.Status.Halt.Reason == likenv1.ReasonTrialFailed, "Cluster halt: %+v", c.Status.Halt)
	for _, m := range ms {
		if m != failed {
			assert.Equal(t, m.machine().Status.Version, previous, "%s", m.name)
			_, tried := m.qemu.Find("liken-boot: booting slot " + other + " (trial true)")
			assert.Assert(t, !tried, "%s tried the release the rollout halted on", m.name)
		}
	}
}
