package lab

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/image"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/join"
)

// Layout of a simulated machine's folder.
const (
	machineDiskDir = "disk" // the machine's disk: slots and the daemon's state (liken-node --root)
	machineBootDir = "boot" // the boot partition: grubenv, grubenv.bak, grub.cfg
	machineRunDir  = "run"  // what the running OS shows: kernel command line, boot ID, release
	machineLayer   = "layer.tgz"
	// machineKubeconfig, on the machine's disk, is its own identity.
	machineKubeconfig = "kubeconfig"
	machineLog        = "machine.log"
	daemonRestarted   = 2 * time.Second
)

// firmware simulates one machine: its power, its firmware and boot loader
// (the same rules as liken's grub.cfg, on the same grubenv), the image's
// init, k3s joining the cluster, and the node daemon as the OS's service.
type firmware struct {
	name          string
	dir           string
	lab           string
	adminConfig   string
	nodeConfig    string
	likenNode     string
	bootTime      time.Duration
	out           io.Writer
	kube          kubernetes.Interface
	closedAPIPort int
}

func newMachineCommand() *cobra.Command {
	var f firmware
	cmd := &cobra.Command{
		Use:    "machine --name NAME --dir DIR",
		Short:  "Run one simulated machine: firmware, boot, and its node daemon (started by liken lab up and power on)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.out = cmd.OutOrStdout()
			cfg, err := clientcmd.BuildConfigFromFlags("", f.adminConfig)
			if err != nil {
				return err
			}
			if f.kube, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
			return f.run(cmd.Context())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "the machine's name")
	fl.StringVar(&f.dir, "dir", "", "the machine's folder")
	fl.StringVar(&f.lab, "lab-dir", "", "the lab's folder")
	fl.StringVar(&f.adminConfig, "admin-kubeconfig", "", "the lab's admin kubeconfig (the simulated power switch)")
	fl.StringVar(&f.nodeConfig, "node-kubeconfig", "", "where the machine keeps its own kubeconfig, which its liken-node writes when it joins")
	fl.StringVar(&f.likenNode, "liken-node", "", "the node daemon binary")
	fl.DurationVar(&f.bootTime, "boot-time", 2*time.Second, "how long a boot takes")
	for _, n := range []string{"name", "dir", "lab-dir", "admin-kubeconfig", "node-kubeconfig", "liken-node"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func (f *firmware) logf(format string, args ...any) {
	fmt.Fprintf(f.out, "%s firmware %s: %s\n", time.Now().UTC().Format(time.RFC3339), f.name, fmt.Sprintf(format, args...))
}

func (f *firmware) run(ctx context.Context) error {
	for n := 1; ctx.Err() == nil; n++ {
		f.power(ctx, false)
		sel, err := boot.SelectBootDetail(filepath.Join(f.dir, machineBootDir))
		if err != nil {
			return err
		}
		kind := "proven"
		if sel.Trial {
			kind = "one-time trial"
		}
		f.logf("boot %d: slot %s (%s)%s", n, sel.Slot, kind, note(sel.Note))
		booted := time.Now()
		reachable, bootID, err := f.bootImage(ctx, sel.Slot, sel.Trial, booted)
		if err != nil {
			f.logf("kernel panic: %v; rebooting in 1s (panic=1)", err)
			if sleep(ctx, time.Second) != nil {
				break
			}
			continue
		}
		if reachable {
			f.power(ctx, true)
			f.postBoot(ctx, bootID)
		} else {
			f.logf("the image's network cannot reach the cluster API; the node stays NotReady")
		}
		if f.runDaemon(ctx, reachable) {
			f.logf("rebooting")
			continue
		}
	}
	f.logf("powering off")
	return nil
}

// bootImage does what the kernel and the image's init do at boot, and
// returns whether the image's network reaches the cluster's API, and the
// boot's ID.
func (f *firmware) bootImage(ctx context.Context, slot boot.Slot, trial bool, booted time.Time) (bool, string, error) {
	img := filepath.Join(f.dir, machineDiskDir, "slots", string(slot), "rootfs.squashfs")
	rel, err := readImageFile(img, image.ReleaseFile)
	if err != nil {
		return false, "", fmt.Errorf("no bootable image in slot %s: %v", slot, err)
	}
	version, err := image.ParseReleaseFile(rel)
	if err != nil {
		return false, "", fmt.Errorf("slot %s: %v", slot, err)
	}
	init, err := readImageFile(img, imageInit)
	if err != nil {
		return false, "", fmt.Errorf("slot %s has no init: %v", slot, err)
	}
	if err := sleep(ctx, f.bootTime); err != nil {
		return false, "", err
	}
	out, err := exec.CommandContext(ctx, "sh", "-c", string(init)).CombinedOutput()
	f.logf("init: %s", strings.TrimSpace(string(out)))
	if err != nil {
		return false, "", fmt.Errorf("attempted to kill init (release %s in slot %s: %v)", version, slot, err)
	}
	network, _ := readImageFile(img, imageNetwork)
	run := filepath.Join(f.dir, machineRunDir)
	if err := os.MkdirAll(run, 0o755); err != nil {
		return false, "", err
	}
	cmdline := "BOOT_IMAGE=/" + string(slot) + "/vmlinuz liken.slot=" + string(slot) + " panic=1"
	if trial {
		cmdline += " liken.trial=1"
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	bootID := fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:])
	stat := fmt.Sprintf("btime %d\n", booted.Unix())
	for name, data := range map[string][]byte{"cmdline": []byte(cmdline + "\n"), "boot_id": []byte(bootID + "\n"), "release": rel, "stat": []byte(stat)} {
		if err := os.WriteFile(filepath.Join(run, name), data, 0o644); err != nil {
			return false, "", err
		}
	}
	f.logf("release %s up (boot ID %s)", version, bootID)
	return strings.TrimSpace(string(network)) != "api=unreachable", bootID, nil
}

// runDaemon joins the cluster with the machine's layer and runs the node
// daemon until it asks for a reboot (true) or the machine powers off
// (false). A daemon that crashes is restarted, as a service manager does.
func (f *firmware) runDaemon(ctx context.Context, reachable bool) bool {
	kubeconfig, bootstrap, err := f.join(reachable)
	if err != nil {
		f.logf("cannot join the cluster: %v", err)
		<-ctx.Done()
		return false
	}
	run := filepath.Join(f.dir, machineRunDir)
	for {
		cmd := exec.Command(f.likenNode, "run",
			"--machine", f.name,
			"--kubeconfig", kubeconfig,
			"--bootstrap-kubeconfig", bootstrap,
			"--root", filepath.Join(f.dir, machineDiskDir),
			"--boot-dir", filepath.Join(f.dir, machineBootDir),
			"--cmdline-file", filepath.Join(run, "cmdline"),
			"--boot-id-file", filepath.Join(run, "boot_id"),
			"--os-release-file", filepath.Join(run, "release"),
			"--stat-file", filepath.Join(run, "stat"),
			// A simulated machine has no watchdog: never arm the host's.
			"--watchdog", "",
			"--appliers", "record",
		)
		cmd.Stdout, cmd.Stderr = f.out, f.out
		if err := cmd.Start(); err != nil {
			f.logf("starting liken-node: %v", err)
			return false
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			return false
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() == boot.ExitReboot {
				f.logf("liken-node asked for a reboot")
				return true
			}
			f.logf("liken-node exited (%v); restarting it in %s", err, daemonRestarted)
			if sleep(ctx, daemonRestarted) != nil {
				return false
			}
		}
	}
}

// join checks the machine's deployment layer against the lab's cluster
// identity, as k3s checks the join token, and returns the kubeconfigs its
// liken-node gets: where it keeps its own identity, and the one with the
// join token it joins with when it has none yet. When the image's network
// cannot reach the API, both point at a closed loopback port.
func (f *firmware) join(reachable bool) (kubeconfig, bootstrap string, err error) {
	l, err := layer.ReadFile(filepath.Join(f.dir, machineLayer), layer.DefaultLimits)
	if err != nil {
		return "", "", fmt.Errorf("reading the deployment layer: %w", err)
	}
	if l.Machine(f.name) == nil {
		return "", "", fmt.Errorf("the deployment layer has no Machine %s", f.name)
	}
	want, err := os.ReadFile(filepath.Join(f.lab, "identity", "server-ca.crt"))
	if err != nil {
		return "", "", fmt.Errorf("reading the lab's server CA: %w", err)
	}
	if string(l.Identity.Files["server-ca.crt"]) != string(want) {
		return "", "", errors.New("the deployment layer is not this cluster's: its identity's server CA is another")
	}
	// The machine's own join token, in a kubeconfig as liken install writes
	// it next to the layer.
	bootConfig := filepath.Join(f.dir, machineRunDir, "bootstrap.kubeconfig")
	token, err := l.JoinTokenOf(f.name)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Dir(bootConfig), 0o755); err != nil {
		return "", "", err
	}
	admin, err := clientcmd.LoadFromFile(f.adminConfig)
	if err != nil {
		return "", "", err
	}
	c := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	if err := clientcmd.WriteToFile(join.BootstrapKubeconfig(c.Server, c.CertificateAuthorityData, token), bootConfig); err != nil {
		return "", "", err
	}
	if reachable {
		return f.nodeConfig, bootConfig, nil
	}
	run := filepath.Join(f.dir, machineRunDir)
	kubeconfig, bootstrap = filepath.Join(run, "unreachable.kubeconfig"), filepath.Join(run, "unreachable-bootstrap.kubeconfig")
	if err := unreachable(bootConfig, bootstrap); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(f.nodeConfig); errors.Is(err, fs.ErrNotExist) {
		// Never joined: it tries, with the token, and cannot.
		_ = os.Remove(kubeconfig)
		return kubeconfig, bootstrap, nil
	}
	return kubeconfig, bootstrap, unreachable(f.nodeConfig, kubeconfig)
}

// unreachable copies the kubeconfig from to to, pointed at a closed port.
func unreachable(from, to string) error {
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://127.0.0.1:1"
	}
	return clientcmd.WriteToFile(*cfg, to)
}

// postBoot posts the Node's status as this boot's kubelet would: its boot
// ID and a Ready heartbeat. A trial commits only on such a Ready.
func (f *firmware) postBoot(ctx context.Context, bootID string) {
	for ctx.Err() == nil {
		err := controlplane.PostNodeBoot(ctx, f.kube, f.name, bootID)
		if err == nil {
			return
		}
		f.logf("posting the node's status for boot %s: %v; retrying", bootID, err)
		_ = sleep(ctx, time.Second)
	}
}

// power sets the machine's simulated power as kwok sees it: while off, its
// Node reads NotReady.
func (f *firmware) power(ctx context.Context, on bool) {
	for ctx.Err() == nil {
		err := controlplane.SetNodePower(ctx, f.kube, f.name, on)
		if err == nil {
			return
		}
		f.logf("setting power %v: %v; retrying", on, err)
		_ = sleep(ctx, time.Second)
	}
}

func note(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
