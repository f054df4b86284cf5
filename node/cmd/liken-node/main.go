// Command liken-node is the node daemon: it runs on every machine and
// keeps the machine in step with its own Machine and its Cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/command"
	"liken.sh/liken/internal/sdnotify"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/join"
	"liken.sh/liken/node/podroutes"
	"liken.sh/liken/node/watchdog"
	"liken.sh/liken/version"
)

type runFlags struct {
	kubeconfig    string
	bootstrap     string
	machine       string
	layerMachine  string
	root          string
	bootDir       string
	cmdlineFile   string
	bootIDFile    string
	osReleaseFile string
	statFile      string
	watchdog      string
	appliers      string
}

func main() {
	os.Exit(run())
}

func run() int {
	root := &cobra.Command{
		Use:           "liken-node",
		Short:         "liken's node daemon: keeps this machine in step with its Machine and Cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	command.AddKlogFlags(root.PersistentFlags())

	var f runFlags
	exit := 0
	runCmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon until SIGTERM (or a reboot)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := runDaemon(cmd.Context(), f)
			if errors.Is(err, daemon.ErrRebooted) {
				exit = boot.ExitReboot
				return nil
			}
			return err
		},
	}
	fl := runCmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig with the machine's identity (system:node:<machine>); empty uses the in-cluster configuration")
	fl.StringVar(&f.bootstrap, "bootstrap-kubeconfig", "", "kubeconfig holding the join token: when --kubeconfig holds no valid certificate for this machine, liken-node joins with it (TLS bootstrap, as a kubelet does) and writes its own key and certificate to --kubeconfig")
	fl.StringVar(&f.machine, "machine", "", "this machine's name: its Machine and its Node (required)")
	fl.StringVar(&f.layerMachine, "layer-machine", "", "the Machine document of the layer this machine was installed from (machine.yaml on its layer partition): its Machine's LayerMatches condition says whether the API's role and ports agree with it; a missing file is no document")
	fl.StringVar(&f.root, "root", "/var/lib/liken", "the machine's disk state: boot slots, daemon state, applied configuration")
	fl.StringVar(&f.bootDir, "boot-dir", "/boot/grub", "folder of the GRUB environment block (grubenv and grubenv.bak), on the boot partition: its parent folder receives each slot's kernel and initramfs (<parent>/A, <parent>/B)")
	fl.StringVar(&f.cmdlineFile, "cmdline-file", "/proc/cmdline", "kernel command line (liken.slot=, liken.trial=)")
	fl.StringVar(&f.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding this boot's ID")
	fl.StringVar(&f.watchdog, "watchdog", watchdog.DefaultDevice, "the watchdog device the init arms before a trial boot's liken-node starts; fed until the trial commits, then disarmed (empty: none)")
	fl.StringVar(&f.statFile, "stat-file", "/proc/stat", "kernel statistics holding the boot time (btime)")
	fl.StringVar(&f.osReleaseFile, "os-release-file", "/etc/liken/release", "the running image's release file (VERSION=YYYY.MM.DD-NNN)")
	fl.StringVar(&f.appliers, "appliers", "os", "os: change the real operating system and reboot with the reboot system call; record: record changes in <root>/applier.log and exit with code 100 to reboot (the lab)")
	_ = runCmd.MarkFlagRequired("machine")
	root.AddCommand(runCmd, controlPlaneCommand(syscall.Exec), &cobra.Command{
		Use:   "version",
		Short: "Print liken-node's version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version.Version) },
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "liken-node:", err)
		return 1
	}
	klog.Flush()
	return exit
}

func runDaemon(ctx context.Context, f runFlags) error {
	var rebooter daemon.Rebooter
	switch f.appliers {
	case "os":
		rebooter = daemon.SystemRebooter{}
	case "record":
		rebooter = daemon.ExitRebooter{}
	default:
		return fmt.Errorf("--appliers=%q: choose os (a real machine) or record (the lab)", f.appliers)
	}
	// ReadBootInfo reads the command line first: even when it fails on a
	// later file, bi.Trial tells whether this is a trial boot.
	bi, err := daemon.ReadBootInfo(f.cmdlineFile, f.bootIDFile, f.osReleaseFile, f.statFile)
	if err == nil {
		err = start(ctx, f, bi, rebooter)
	}
	return daemon.StartFailed(ctx, bi, rebooter, err)
}

// podRoutesResync is how often liken-node compares the pod routes with
// the kernel's, so that one a network reconfiguration removed comes back.
const podRoutesResync = 30 * time.Second

func start(ctx context.Context, f runFlags, bi daemon.BootInfo, rebooter daemon.Rebooter) error {
	log := klog.FromContext(ctx)
	if f.bootstrap != "" {
		if err := joinCluster(ctx, f); err != nil {
			return err
		}
		// The certificate is renewed while liken-node runs; its client
		// reads the renewed one from the file the kubeconfig names.
		go renewCertificate(ctx, clock.RealClock{}, renewFor(f))
	}
	cfg, err := command.RESTConfig(f.kubeconfig, "liken-node/"+version.Version)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	lk, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	layerMachine, err := daemon.ReadLayerMachine(f.layerMachine)
	if err != nil {
		// Only a condition depends on it: say so and go on.
		log.Error(err, "Reading the layer's Machine document; the Machine's LayerMatches condition is not reported")
	}
	o := daemon.Options{
		Machine:    f.machine,
		Root:       f.root,
		Kube:       kube,
		Liken:      lk,
		Boot:       bi,
		Layer:      layerMachine,
		Bootloader: boot.NewGRUB(f.bootDir),
		Rebooter:   rebooter,
		// The boot partition holds the GRUB folder and each slot's kernel.
		BootPartition: filepath.Dir(filepath.Clean(f.bootDir)),
	}
	if bi.Trial && f.watchdog != "" {
		// The init armed it before this liken-node started; it stays
		// armed until the trial commits.
		wd, err := watchdog.Open(f.watchdog, 0)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			log.Info("No watchdog device: nothing resets a trial boot that hangs", "device", f.watchdog)
		case err != nil && wd == nil:
			log.Error(err, "Opening the trial watchdog failed; if the init armed it, it resets the machine into the proven slot")
		default:
			if err != nil {
				log.Error(err, "The trial watchdog")
			}
			o.Watchdog = wd
		}
	}
	switch f.appliers {
	case "os":
		a := &changes.OS{Root: "/"}
		o.Applier, o.Observer = a, a
		// Pods reach the pods of every other machine: directly on the
		// segment, through the tunnel to other subnets.
		nodes := informers.NewSharedInformerFactory(kube, 0)
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
		if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
			return fmt.Errorf("starting the pod routes' event recorder: %w", err)
		}
		defer broadcaster.Shutdown()
		routes := podroutes.New(f.machine, nodes.Core().V1().Nodes(), podroutes.Netlink{},
			broadcaster.NewRecorder(scheme.Scheme, daemon.FieldManager), podRoutesResync)
		nodes.Start(ctx.Done())
		go func() {
			if err := routes.Run(ctx); err != nil {
				log.Error(err, "Routing the other machines' pod ranges stopped")
			}
		}()
		// A leader (liken install wrote leader/config.yaml on its layer
		// partition) runs the control plane: its trial and its RestartK3s
		// turn wait for it, and RestartK3s restarts it.
		if cfg, err := controlplane.Load(filepath.Join(controlplane.LeaderDir, controlplane.ConfigFile)); err == nil || !errors.Is(err, fs.ErrNotExist) {
			a.Leader = true
			if err != nil {
				// etcd-start refuses the same file and says why.
				log.Error(err, "Reading this leader's control-plane configuration: its health check cannot ask the other leaders")
			}
			cfg.Machine = f.machine
			health := controlplane.NewHealth(cfg, controlplane.SetupDir)
			// A leader whose datastore split off stops its API server
			// (controlplane.Health.Check).
			health.Fence = func(ctx context.Context) error { return a.StopUnit(ctx, changes.APIServerUnit) }
			o.ControlPlane = health
			o.DatastoreRoom = controlplane.DatastoreRoom
			log.Info("This machine is a leader: its trial and its RestartK3s turn wait for its own control plane")
		}
	case "record":
		r := changes.NewRecorder(filepath.Join(f.root, "applier.log"))
		o.Applier, o.Observer = &labKubelet{Recorder: r, kube: kube, node: f.machine, bootID: bi.BootID}, r
	}
	d, err := daemon.New(o)
	if err != nil {
		return err
	}
	log.Info("liken-node starting", "version", version.Version, "machine", f.machine, "slot", bi.Slot, "trial", bi.Trial, "release", bi.Version, "bootID", bi.BootID)
	// On a liken machine systemd supervises liken-node (Type=notify,
	// WatchdogSec): it restarts a liken-node that exits, hangs, or whose
	// reconcile is stuck (Daemon.Alive).
	if err := sdnotify.Notify("READY=1"); err != nil {
		log.Error(err, "Telling the service manager that liken-node is ready")
	}
	go sdnotify.Keepalive(ctx, sdnotify.WatchdogInterval(), d.Alive)
	return d.Run(ctx)
}

// joinCluster makes sure --kubeconfig holds this machine's own certificate,
// joining with the join token of --bootstrap-kubeconfig when it holds none
// it can use (a leader's control plane setup issues its own).
func joinCluster(ctx context.Context, f runFlags) error {
	o, err := joinOptions(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	return join.Join(ctx, o)
}

// joinOptions are how this machine joins: its name, --kubeconfig, and the
// join token of --bootstrap-kubeconfig when that file exists.
func joinOptions(f runFlags) (join.Options, error) {
	if f.kubeconfig == "" {
		return join.Options{}, errors.New("--bootstrap-kubeconfig needs --kubeconfig: the file the machine's own credentials go to")
	}
	var boot *rest.Config
	if _, err := os.Stat(f.bootstrap); err == nil {
		if boot, err = command.RESTConfig(f.bootstrap, "liken-node/"+version.Version); err != nil {
			return join.Options{}, fmt.Errorf("--bootstrap-kubeconfig: %w", err)
		}
	}
	return join.Options{Machine: f.machine, Bootstrap: boot, Kubeconfig: f.kubeconfig}, nil
}

// renewInterval is how often liken-node looks whether its certificate is
// due for renewal (two thirds of its lifetime).
const renewInterval = 10 * time.Minute

// renewCertificate looks, every renewInterval of clk until ctx ends,
// whether the machine's certificate is due for renewal, and renews it
// (renew: join.Renew with the machine's options). A failed renewal is
// logged and tried again at the next look, while the certificate still
// serves.
func renewCertificate(ctx context.Context, clk clock.WithTicker, renew func(context.Context) error) {
	t := clk.NewTicker(renewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		rctx, cancel := context.WithTimeout(ctx, joinTimeout)
		err := renew(rctx)
		cancel()
		if err != nil {
			klog.FromContext(ctx).Error(err, "The machine's certificate", "next", renewInterval)
		}
	}
}

// renewFor is renewCertificate's renewal for the machine of f: its
// options are read again at each look, as the bootstrap kubeconfig may
// come or go.
func renewFor(f runFlags) func(context.Context) error {
	return func(ctx context.Context) error {
		o, err := joinOptions(f)
		if err != nil {
			return err
		}
		return join.Renew(ctx, o)
	}
}

// joinTimeout bounds a join: in a trial boot, a machine that cannot join
// gives the trial up well before its timeout.
const joinTimeout = 2 * time.Minute

// labKubelet is the lab's applier: a Recorder whose RestartK3s also does
// what the kubelet that k3s starts again does on a machine: it posts the
// Node's Ready with a new heartbeat, in a later second than the restart
// began (a k3s restart takes seconds). The lab's simulated kubelet (kwok)
// posts nothing for a Node that stays Ready, and a leader's RestartK3s
// turn ends only on such a heartbeat.
type labKubelet struct {
	*changes.Recorder
	kube   kubernetes.Interface
	node   string
	bootID string
}

// RestartK3s records the restart, then posts the Node's Ready as the
// restarted kubelet; with changes.LabRefusedArg among the arguments, it
// posts the Node NotReady, as the node controller does for a kubelet that
// exits at once.
func (l *labKubelet) RestartK3s(ctx context.Context, cfg changes.Config, changed []changes.Change) error {
	began := time.Now()
	if err := l.Recorder.RestartK3s(ctx, cfg, changed); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(began.Truncate(time.Second).Add(time.Second).Sub(time.Now())):
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	status, reason, message := "True", "KubeletReady", "kubelet is posting ready status"
	refused := "null"
	if slices.Contains(cfg.Settings.K3sArgs, changes.LabRefusedArg) {
		status, reason, message = "False", "KubeletNotReady", "the lab's kubelet refused the argument "+changes.LabRefusedArg
		refused = `"refused"`
	}
	// The label first: kwok's stages post Ready for a Node without it.
	label := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, changes.LabRefusedLabel, refused)
	if _, err := l.kube.CoreV1().Nodes().Patch(ctx, l.node, types.MergePatchType, []byte(label), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling the Node after the simulated restart of k3s: %w", err)
	}
	patch := fmt.Sprintf(`{"status":{"nodeInfo":{"bootID":%q},"conditions":[{"type":"Ready","status":%q,"reason":%q,"message":%q,"lastHeartbeatTime":%q}]}}`, l.bootID, status, reason, message, now)
	if _, err := l.kube.CoreV1().Nodes().Patch(ctx, l.node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("posting the Node's Ready after the simulated restart of k3s: %w", err)
	}
	return nil
}
