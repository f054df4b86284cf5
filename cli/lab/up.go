package lab

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	corev1 "k8s.io/api/core/v1"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	v1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/srctree"
	"liken.sh/liken/manifests"
	"liken.sh/liken/node/boot"
	nodecp "liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

type upOptions struct {
	name       string
	machines   int
	leaders    int
	policy     string
	operators  int
	timeout    time.Duration
	vm         bool
	containers bool
}

func newUpCommand() *cobra.Command {
	o := upOptions{}
	cmd := &cobra.Command{
		Use:   "up [--name N] [--machines M] [--leaders L] [--reboot-policy Auto|Manual] [--operators K]",
		Short: "Start a lab fleet and wait until its Cluster is Ready",
		Long: `Start a lab fleet in the background: a real control plane, a release
channel with a first release, the liken manifests, a Cluster and its
Machines, cluster-operator copies, and one simulated machine per Machine
installed on slot A from its deployment layer. It returns once the Cluster
reads Ready on the first release, and prints the line that points kubectl
at the lab.

The control plane binaries and kubectl are built first if they are missing
(make build, about 20 minutes the first time on 2 cores).

Over a lab of the same name that is down (liken lab status exits non-zero:
its processes exited, as after the computer restarted), it stops what is
left of that lab and starts it again; over one that runs, it refuses.

With --vm, each machine is a QEMU virtual machine (software emulation)
booting liken's OS image from a disk written by liken install, and the
fleet runs its own control plane: each leader runs an etcd member, the API
server, the controller manager and the scheduler from the image, and
cluster-operator runs as the Deployment of manifests/ (--operators
replicas). This computer runs only QEMU, the release channel and the API
endpoint, a loopback port that forwards to a ready leader; the kubeconfig
points there. The image is built with make image (as root) if it is
missing; QEMU is fetched from Debian's packages into ~/.cache/liken/qemu.
Each machine's console is its machine.log. Emulated leaders take minutes:
expect 4 to 10 minutes with one leader. With one leader the API is down
while that leader reboots.

With --containers (as root), each machine runs liken's OS image in Linux
namespaces above this computer's kernel: its own systemd, kubelet,
container runtime, node agent and, on leaders, the control plane, from a
folder written by liken install, at this computer's speed. The machines
share one network segment inside a network namespace the lab makes; the
lab's channel, registry and name server listen on its gateway, and the
API endpoint listens there and on this computer's loopback. A leader's
API answers about a minute after power on. What differs from a real
machine (the kernel's settings are this computer's) is in
docs/design/lab.md.`,
		Example: `  # The default lab: 5 machines, 3 leaders, Manual reboots, 2 operators
  liken lab up

  # A second lab of 10 Auto machines next to the first
  liken lab up --name big --machines 10 --reboot-policy Auto

  # Three virtual machines running liken's OS image
  liken lab up --name vm --vm --machines 3 --leaders 1 --reboot-policy Auto

  # Five machines in namespaces, three of them leaders with their datastore
  sudo liken lab up --name ns --containers --machines 5 --leaders 3 --reboot-policy Auto`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return up(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	nameFlag(cmd, &o.name)
	fl := cmd.Flags()
	fl.IntVar(&o.machines, "machines", 5, "Number of machines.")
	fl.IntVar(&o.leaders, "leaders", 3, "How many of the machines are leaders.")
	fl.StringVar(&o.policy, "reboot-policy", "Manual", "Reboot policy of every machine: Auto or Manual.")
	fl.IntVar(&o.operators, "operators", 2, "Number of cluster-operator copies (one leads); with --vm, the Deployment's replicas.")
	fl.DurationVar(&o.timeout, "timeout", 5*time.Minute, "How long to wait for the Cluster to read Ready (with --vm, at least 30 minutes).")
	fl.BoolVar(&o.containers, "containers", false, "Run each machine's OS in Linux namespaces: liken's OS image (make image) from a folder written by liken install, with its own systemd, kubelet, container runtime and, on leaders, the control plane, above this computer's kernel (root needed).")
	fl.BoolVar(&o.vm, "vm", false, "Run each machine as a QEMU virtual machine booting liken's OS image (make image) from a disk written by liken install, the leaders running the control plane.")
	return cmd
}

func (o upOptions) validate() error {
	switch {
	case o.machines < 1 || o.machines > 200:
		return fmt.Errorf("--machines %d: choose 1 to 200", o.machines)
	case o.leaders < 1 || o.leaders > o.machines:
		return fmt.Errorf("--leaders %d: choose 1 to --machines (%d)", o.leaders, o.machines)
	case o.policy != string(v1.RebootAuto) && o.policy != string(v1.RebootManual):
		return fmt.Errorf("--reboot-policy %q: choose Auto or Manual", o.policy)
	case o.operators < 1 || o.operators > 5:
		return fmt.Errorf("--operators %d: choose 1 to 5", o.operators)
	case o.vm && o.containers:
		return fmt.Errorf("--vm and --containers: choose one kind of machine")
	}
	return nil
}

// binaries are the programs a lab runs.
type binaries struct {
	liken, likenNode, operator, kube string
}

// findBinaries looks for the lab's programs where liken looks for its
// programs (srctree.BinDir), and builds them with make when they are
// missing and the liken source tree is at hand.
func findBinaries(log io.Writer) (binaries, error) {
	self, err := os.Executable()
	if err != nil {
		return binaries{}, err
	}
	in := func(dir string) binaries {
		return binaries{
			liken:     self,
			likenNode: filepath.Join(dir, "liken-node"),
			operator:  filepath.Join(dir, "cluster-operator"),
			kube:      filepath.Join(dir, "kube"),
		}
	}
	dir, err := srctree.BinDir("liken-node", "cluster-operator", "kube", "kubectl")
	if err == nil {
		return in(dir), nil
	}
	src := sourceTree()
	if src == "" {
		return binaries{}, err
	}
	fmt.Fprintf(log, "Building liken-node, cluster-operator, kube and kubectl with make build in %s (not found in %s)...\n", src, strings.Join(srctree.BinDirs(), ", "))
	cmd := exec.Command("make", "-C", src, "build")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return binaries{}, fmt.Errorf("make build: %w", err)
	}
	b := in(filepath.Join(src, "_output", "bin"))
	var missing []string
	for _, p := range []string{b.likenNode, b.operator, b.kube, filepath.Join(filepath.Dir(b.kube), "kubectl")} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("make build did not produce %s", strings.Join(missing, ", "))
	}
	return b, nil
}

// sourceTree is the liken source tree holding the working directory, if any.
func sourceTree() string {
	d, _ := srctree.Find()
	return d
}

// startupGraceEnv sets the startup grace (--startup-grace) of the lab's
// cluster-operator copies; unset, they keep cluster-operator's default
// (40 s). Tests that run many short-lived labs set it.
const startupGraceEnv = "LIKEN_LAB_STARTUP_GRACE"

// startupGraceArgs are the cluster-operator flags that carry
// $LIKEN_LAB_STARTUP_GRACE; none when it is unset or empty.
func startupGraceArgs() ([]string, error) {
	v := os.Getenv(startupGraceEnv)
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, fmt.Errorf("%s=%q is not a duration: set it to one such as 5s (how long a new cluster-operator leader grants no turn), or unset it for cluster-operator's default", startupGraceEnv, v)
	}
	return []string{"--startup-grace=" + d.String()}, nil
}

func up(ctx context.Context, o upOptions, out, log io.Writer) (err error) {
	if err := o.validate(); err != nil {
		return err
	}
	graceArgs, err := startupGraceArgs()
	if err != nil {
		return err
	}
	dir, err := Dir(o.name)
	if err != nil {
		return err
	}
	if old, err := Load(o.name); err == nil {
		down := old.Check()
		switch {
		case down == nil && old.Running():
			return fmt.Errorf("lab %s is already running (see liken lab status --name %s); stop it first with liken lab down --name %s", o.name, o.name, o.name)
		case down != nil:
			fmt.Fprintf(log, "The %s; stopping what is left of it and starting it again.\n", down.Summary())
		}
		stopAll(old)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	bins, err := findBinaries(log)
	if err != nil {
		return err
	}
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(log, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	if o.vm {
		return upVM(ctx, o, dir, bins, graceArgs, step, out, log)
	}
	if o.containers {
		return upContainers(ctx, o, dir, bins, graceArgs, step, out, log)
	}
	names := machineNames(o.machines)
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: o.name})
	if err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: filepath.Join(dir, "controlplane"), Binary: bins.kube, Detach: true})
	if err != nil {
		return err
	}
	st := &State{Name: o.name, Dir: dir, Kubeconfig: cp.AdminKubeconfig, ChannelDir: filepath.Join(dir, "channel")}
	st.Processes = append(st.Processes, derefAll(cp.Processes)...)
	defer func() {
		if err != nil {
			stopAll(st)
			err = fmt.Errorf("%w\nThe lab's logs are in %s; liken lab down --name %s removes them", err, dir, o.name)
		} else {
			err = st.Save()
		}
	}()
	if err := st.Save(); err != nil {
		return err
	}
	step("control plane up at %s", cp.Server)

	if err := installManifests(ctx, cp, dir); err != nil {
		return err
	}
	step("liken manifests installed")

	if _, err := startChannel(ctx, st, bins); err != nil {
		return err
	}
	version, digest, err := publish(st, FaultNone)
	if err != nil {
		return err
	}
	step("release channel at %s with release %s", st.Channel, version)

	// The fleet's documents, packed into each machine's deployment layer and
	// applied to the cluster.
	docsFile, _, l, err := packLayer(dir, id, fleetDocuments(o, cp.Server, st.Channel, version, digest, nil, ""))
	if err != nil {
		return err
	}
	if _, err := cp.Kubectl(ctx, "apply", "-f", docsFile); err != nil {
		return err
	}
	// The lab's control plane plays the leaders': it makes the workers'
	// join tokens tokens of the cluster, as a leader's init does.
	if err := cp.CreateJoinTokens(ctx, l.Tokens); err != nil {
		return err
	}
	step("Cluster %s and %d Machines created; deployment layer packed", o.name, o.machines)

	for i, n := range names {
		role := "worker"
		if i < o.leaders {
			role = "control-plane"
		}
		if err := cp.AddNode(ctx, n, map[string]string{"node-role.kubernetes.io/" + role: "", controlplane.PowerLabel: "off"}); err != nil {
			return err
		}
		mdir := filepath.Join(dir, "machines", n)
		// Its liken-node joins with its own join token at first boot (the
		// lab's leaders run no control plane of their own, as leaders of a
		// control plane that is not liken's) and keeps its own credentials
		// on its disk.
		m := MachineInfo{Name: n, Role: roleOf(i, o.leaders), Kubeconfig: filepath.Join(mdir, machineDiskDir, machineKubeconfig), Dir: mdir}
		if err := installMachine(ctx, m, st.ChannelDir, version, digest, l); err != nil {
			return fmt.Errorf("installing machine %s: %w", n, err)
		}
		st.Machines = append(st.Machines, m)
	}
	step("%d machines installed on slot A", o.machines)

	for i := 1; i <= o.operators; i++ {
		n := fmt.Sprintf("cluster-operator-%d", i)
		args := append([]string{"lab", "operator", "--lab-dir", dir, "--name", n, "--",
			bins.operator, "--kubeconfig", cp.OperatorKubeconfig, "--identity", o.name + "-" + n, "--metrics-bind-address", "127.0.0.1:0",
		}, graceArgs...)
		sup, err := controlplane.StartProcess(bins.liken, args, filepath.Join(dir, n+".log"), true)
		if err != nil {
			return err
		}
		sup.Kind, sup.Name = KindSupervisor, n
		st.Processes = append(st.Processes, *sup)
		pid, err := waitPIDFile(ctx, filepath.Join(dir, n+".pid"), sup.PID)
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, controlplane.Process{Kind: KindOperator, Name: n, PID: pid, Log: sup.Log, Started: controlplane.ProcessStart(pid)})
	}
	for i := range st.Machines {
		p, err := startMachineWith(st, &st.Machines[i], bins)
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, *p)
	}
	if err := st.Save(); err != nil {
		return err
	}
	step("%d cluster-operator copies and %d machines started", o.operators, o.machines)
	if len(graceArgs) > 0 {
		step("cluster-operator runs with %s (from %s)", graceArgs[0], startupGraceEnv)
	}

	if err := waitClusterReady(ctx, st, o.timeout); err != nil {
		return err
	}
	step("Cluster %s is Ready on %s", o.name, version)
	printUp(st, out, log)
	return nil
}

// printUp says what to do next with the lab that is up, and prints the
// line that points kubectl at it.
func printUp(st *State, out, log io.Writer) {
	fmt.Fprintf(log, "\nLab %s is up. Next:\n  kubectl get clusters -o wide\n  kubectl get machines -o wide\n  liken lab publish --name %s\n  liken lab down --name %s\n\n", st.Name, st.Name, st.Name)
	fmt.Fprintf(out, "export KUBECONFIG=%s\n", cmdutil.ShellQuote(st.Kubeconfig))
}

func roleOf(i, leaders int) string {
	if i < leaders {
		return string(v1.RoleLeader)
	}
	return string(v1.RoleWorker)
}

func derefAll(ps []*controlplane.Process) []controlplane.Process {
	var out []controlplane.Process
	for _, p := range ps {
		out = append(out, *p)
	}
	return out
}

// installManifests applies liken's manifests (embedded in liken) but
// cluster-operator's Deployment, and waits for the CRDs: the process lab
// runs cluster-operator's copies on this computer.
func installManifests(ctx context.Context, cp *controlplane.ControlPlane, dir string) error {
	mdir, err := writeManifests(dir, "30-operator.yaml")
	if err != nil {
		return err
	}
	if _, err := cp.Kubectl(ctx, "apply", "--server-side", "-f", mdir); err != nil {
		return err
	}
	_, err = cp.Kubectl(ctx, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh")
	return err
}

// writeManifests writes liken's manifests (embedded in liken) but the
// files named in leave into <dir>/manifests, and returns that folder.
func writeManifests(dir string, leave ...string) (string, error) {
	mdir := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return "", err
	}
	files, err := fs.Glob(manifests.FS, "*.yaml")
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	for _, f := range files {
		if slices.Contains(leave, f) {
			continue
		}
		b, err := manifests.FS.ReadFile(f)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(mdir, f), b, 0o644); err != nil {
			return "", err
		}
	}
	return mdir, nil
}

// startChannel starts the lab's release channel server on a free loopback
// port, records it in st, and returns the port. With a certificate and its
// key (the VM lab's), it serves https, and st records the URL by the
// name the machines read it at (ChannelName).
func startChannel(ctx context.Context, st *State, bins binaries, tls ...string) (int, error) {
	if err := os.MkdirAll(st.ChannelDir, 0o755); err != nil {
		return 0, err
	}
	portFile := filepath.Join(st.Dir, "channel.port")
	args := append([]string{"lab", "serve-channel", "--dir", st.ChannelDir, "--port-file", portFile}, serverArgs(st)...)
	if len(tls) == 2 {
		args = append(args, "--tls-cert", tls[0], "--tls-key", tls[1])
	}
	ch, err := controlplane.StartProcess(bins.liken, args, filepath.Join(st.Dir, "channel.log"), true)
	if err != nil {
		return 0, err
	}
	ch.Kind, ch.Name = KindChannel, "channel"
	st.Processes = append(st.Processes, *ch)
	port, err := waitPort(ctx, "the release channel server", portFile, ch.PID)
	if err != nil {
		return 0, err
	}
	st.Channel = fmt.Sprintf("http://127.0.0.1:%d", port)
	if len(tls) == 2 {
		st.Channel = fmt.Sprintf("https://%s:%d", ChannelName, port)
	}
	return port, nil
}

// packLayer writes the fleet's documents and the lab's identity into the
// lab's folder, and packs them into the deployment layer. It returns the
// documents' file, the layer's file and the layer.
func packLayer(dir string, id *layer.Identity, docs string) (docsFile, layerFile string, l *layer.Layer, err error) {
	docsFile = filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(docsFile, []byte(docs), 0o644); err != nil {
		return "", "", nil, err
	}
	idDir := filepath.Join(dir, "identity")
	if err := os.MkdirAll(idDir, 0o700); err != nil {
		return "", "", nil, err
	}
	if err := layer.WriteIdentity(idDir, id); err != nil {
		return "", "", nil, err
	}
	l, err = layer.Assemble(layer.PackOptions{Files: []string{docsFile}, IdentityDir: idDir})
	if err != nil {
		return "", "", nil, fmt.Errorf("packing the lab's deployment layer: %w", err)
	}
	layerFile = filepath.Join(dir, "layer.tgz")
	if err := l.WriteFile(layerFile, true); err != nil {
		return "", "", nil, err
	}
	return docsFile, layerFile, l, nil
}

// fleetDocuments is the lab's Cluster and Machines. Timeouts are short so
// that the lab's failures show within a minute or two. reach holds the
// annotations block of each leader the VM lab forwards ports to; nil in
// the process lab.
func fleetDocuments(o upOptions, endpoint, channel, version, digest string, reach map[string]string, settings string) string {
	// A virtual machine under emulation takes a minute or more to boot,
	// more when several share this computer's cores.
	// The process lab's machines run no workloads of their own: a short
	// settle shows the field without slowing the demonstration.
	trial, stall, settle := "45s", "5m", "5s"
	switch {
	case o.vm:
		trial, stall, settle = "10m", "30m", "30s"
	case o.containers:
		// A leader's control plane answers about a minute after power on.
		trial, stall, settle = "5m", "15m", "10s"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata:
  name: %s
spec:
  version: %q
  releases:
    source: %s
    pollInterval: 30s
    catalog:
    - version: %q
      digest: %s
  network:
    endpoint: %s
    podCIDR: %s
    serviceCIDR: %s
    clusterDNS: 10.96.0.10
%s  disruption:
    maxUnavailable: 1
    drainTimeout: 1m
    trialTimeout: %s
    stallTimeout: %s
    settle: %s
`, o.name, version, channel, version, digest, endpoint, v1.DefaultPodCIDR, v1.DefaultServiceCIDR, settings, trial, stall, settle)
	for i, n := range machineNames(o.machines) {
		fmt.Fprintf(&b, "---\napiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata:\n  name: %s\n", n)
		if a, ok := reach[n]; ok {
			b.WriteString(a)
		} else if i < o.leaders && o.leaders > 1 {
			// liken layer pack needs each of several leaders to be
			// reachable. The process lab's leaders have no address and run
			// no control plane (it runs on this computer), so their reach
			// URLs only name them.
			b.WriteString(reachAnnotations(n, leaderPorts{nodecp.APIServerPort, nodecp.EtcdClientPort, nodecp.EtcdPeerPort}))
		}
		fmt.Fprintf(&b, "spec:\n  cluster: %s\n  role: %s\n  rebootPolicy: %s\n", o.name, roleOf(i, o.leaders), o.policy)
		switch {
		case o.vm:
			b.WriteString(vmPorts(i))
		case o.containers:
			fmt.Fprintf(&b, "  ports:\n  - name: eth0\n    addresses: [%s/24]\n    gateway: %s\n", segmentAddress(i), segmentGateway)
		default:
			b.WriteString("  ports:\n  - name: eth0\n    dhcp: true\n")
		}
	}
	return b.String()
}

// reachAnnotations is a lab leader's metadata.annotations block: its
// reach URLs, https on host at the ports p.
func reachAnnotations(host string, p leaderPorts) string {
	return fmt.Sprintf("  annotations:\n    %s: https://%s:%d\n    %s: https://%s:%d\n    %s: https://%s:%d\n",
		v1.AnnotationAPIServerURL, host, p.api,
		v1.AnnotationEtcdClientURL, host, p.etcdClient,
		v1.AnnotationEtcdPeerURL, host, p.etcdPeer)
}

// installMachine does what liken's installer does on a new machine: slot A
// gets the first release, the boot state proves slot A, and the deployment
// layer is written next to it.
func installMachine(ctx context.Context, m MachineInfo, channelDir, version, digest string, lay *layer.Layer) error {
	disk := filepath.Join(m.Dir, machineDiskDir)
	bootDir := filepath.Join(m.Dir, machineBootDir)
	for _, d := range []string{disk, bootDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The machine's folder stands for its boot partition, as liken-node
	// sees it (the parent of --boot-dir): a release with a kernel gets it
	// installed in <machine>/A.
	if err := slots.Install(ctx, disk, string(boot.SlotA), filepath.Join(channelDir, version), release.Target{Version: version, Digest: digest},
		slots.WithBootPartition(m.Dir)); err != nil {
		return err
	}
	env, err := boot.Encode(boot.State{Proven: boot.SlotA}, nil)
	if err != nil {
		return err
	}
	for _, f := range []string{"grubenv.bak", "grubenv"} {
		if err := os.WriteFile(filepath.Join(bootDir, f), env, 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(bootDir, "grub.cfg"), boot.GrubConfig(), 0o644); err != nil {
		return err
	}
	own, err := lay.ForMachine(m.Name)
	if err != nil {
		return err
	}
	return own.WriteFile(filepath.Join(m.Dir, machineLayer), true)
}

// startMachine powers a machine on: its firmware process, in a session of
// its own so that a power cut kills it and its node daemon together.
func startMachine(st *State, m *MachineInfo) (*controlplane.Process, error) {
	bins, err := findBinaries(io.Discard)
	if err != nil {
		return nil, err
	}
	return startMachineWith(st, m, bins)
}

func startMachineWith(st *State, m *MachineInfo, bins binaries) (*controlplane.Process, error) {
	if st.VM {
		return startVM(st, m)
	}
	if st.Containers {
		return startNSMachine(st, m, bins)
	}
	p, err := controlplane.StartProcess(bins.liken, []string{"lab", "machine",
		"--name", m.Name, "--dir", m.Dir, "--lab-dir", st.Dir,
		"--admin-kubeconfig", st.Kubeconfig, "--node-kubeconfig", m.Kubeconfig,
		"--liken-node", bins.likenNode,
	}, filepath.Join(m.Dir, machineLog), true)
	if err != nil {
		return nil, err
	}
	p.Kind, p.Name = KindMachine, m.Name
	return p, nil
}

func adminClient(st *State) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// readyNodes counts the Nodes that read Ready.
func readyNodes(ctx context.Context, kube kubernetes.Interface) int {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0
	}
	n := 0
	for _, node := range nodes.Items {
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

// waitClusterReady waits until the lab's Cluster reads Ready with every
// machine on its version.
func waitClusterReady(ctx context.Context, st *State, timeout time.Duration) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return err
	}
	cs, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	want := fmt.Sprintf("%d/%d", len(st.Machines), len(st.Machines))
	deadline := time.Now().Add(timeout)
	last := "not created"
	for time.Now().Before(deadline) {
		c, err := cs.LikenV1alpha1().Clusters().Get(ctx, st.Name, metav1.GetOptions{})
		if err == nil {
			ready := c.Status.Phase == v1.ClusterReady && c.Status.Machines == want
			last = fmt.Sprintf("phase %q, machines %q", c.Status.Phase, c.Status.Machines)
			if ready && st.RealImage() {
				// A real kubelet registers its Node a little after
				// liken-node reports: wait for every Node Ready too.
				n := readyNodes(ctx, kube)
				ready = n == len(st.Machines)
				last += fmt.Sprintf(", %d of %d Nodes Ready", n, len(st.Machines))
			}
			if ready {
				return nil
			}
		}
		if err := exitedProcess(st); err != nil {
			return err
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("Cluster %s did not read Ready with %s machines within %s (last seen: %s); see the machines' logs in %s", st.Name, want, timeout, last, filepath.Join(st.Dir, "machines"))
}
