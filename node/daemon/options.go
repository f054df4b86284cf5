package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/image"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/watchdog"
)

// BootInfo is what the running boot says about itself.
type BootInfo struct {
	// Slot is the slot the machine booted (liken.slot= on the kernel
	// command line).
	Slot boot.Slot
	// Trial is true on a trial boot (liken.trial=1).
	Trial bool
	// BootID identifies this boot.
	BootID string
	// Version is the release of the running image.
	Version string
	// BootedAt is when the machine booted: a trial commits only on a Node
	// Ready heartbeat from after it.
	BootedAt time.Time
}

// ReadBootInfo reads the kernel command line, the boot ID, the running
// image's release file, and the boot time (the btime line of statFile,
// /proc/stat on a machine).
func ReadBootInfo(cmdlineFile, bootIDFile, releaseFile, statFile string) (BootInfo, error) {
	var bi BootInfo
	b, err := os.ReadFile(cmdlineFile)
	if err != nil {
		return bi, fmt.Errorf("reading the kernel command line: %w", err)
	}
	if bi.Slot, bi.Trial, err = boot.ParseCmdline(string(b)); err != nil {
		return bi, fmt.Errorf("%s: %w", cmdlineFile, err)
	}
	b, err = os.ReadFile(bootIDFile)
	if err != nil {
		return bi, fmt.Errorf("reading the boot ID: %w", err)
	}
	bi.BootID = strings.TrimSpace(string(b))
	if bi.BootID == "" || len(bi.BootID) > 64 {
		return bi, fmt.Errorf("%s: the boot ID must be one line of at most 64 characters", bootIDFile)
	}
	b, err = os.ReadFile(releaseFile)
	if err != nil {
		return bi, fmt.Errorf("reading the running image's release file: %w", err)
	}
	if bi.Version, err = image.ParseReleaseFile(b); err != nil {
		return bi, fmt.Errorf("%s: %w", releaseFile, err)
	}
	b, err = os.ReadFile(statFile)
	if err != nil {
		return bi, fmt.Errorf("reading the boot time: %w", err)
	}
	if bi.BootedAt, err = ParseBootTime(b); err != nil {
		return bi, fmt.Errorf("%s: %w", statFile, err)
	}
	return bi, nil
}

// ParseBootTime reads the boot time from the btime line of /proc/stat
// (seconds since the epoch).
func ParseBootTime(stat []byte) (time.Time, error) {
	sc := bufio.NewScanner(bytes.NewReader(stat))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "btime" {
			secs, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || secs <= 0 {
				return time.Time{}, fmt.Errorf("btime %q is not a time in seconds since 1970", f[1])
			}
			return time.Unix(secs, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime line: the boot time is unknown")
}

// Rebooter reboots the machine.
type Rebooter interface {
	// Reboot restarts the machine; the state on disk is already written.
	// It returns only on failure, or with ErrRebooted when the reboot is
	// simulated (the daemon then stops and Run returns ErrRebooted).
	Reboot(ctx context.Context) error
}

// ErrRebooted is returned by Run when the daemon stopped for a simulated
// reboot: the lab's liken-node exits with boot.ExitReboot.
var ErrRebooted = errors.New("the machine reboots")

// SystemRebooter reboots the machine with the reboot system call after
// flushing the journal and the file systems.
type SystemRebooter struct{}

// Reboot has journald write what it holds (so that liken logs --boot -1
// reads the turn's last lines), syncs and reboots.
func (SystemRebooter) Reboot(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if out, err := exec.CommandContext(ctx, "journalctl", "--sync").CombinedOutput(); err != nil {
		klog.FromContext(ctx).Info("The journal could not be flushed before the reboot; its last lines may be lost", "err", err, "output", string(out))
	}
	cancel()
	syscall.Sync()
	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART); err != nil {
		return fmt.Errorf("reboot system call: %w", err)
	}
	return nil
}

// ExitRebooter simulates a reboot: it syncs and makes Run return
// ErrRebooted.
type ExitRebooter struct{}

// Reboot syncs and returns ErrRebooted.
func (ExitRebooter) Reboot(context.Context) error {
	syscall.Sync()
	return ErrRebooted
}

// Timing holds every interval and timeout of the daemon; zero values take
// the defaults. Tests shorten them.
type Timing struct {
	// Progress is the least time between two status writes that only
	// move download progress (2s).
	Progress time.Duration
	// Resync re-reads what the machine observes (30s).
	Resync time.Duration
	// RetryMin and RetryMax bound the backoff of a failed download or
	// apply (10s, 5m).
	RetryMin, RetryMax time.Duration
	// DrainPoll is how often the drain looks at the node's pods (1s).
	DrainPoll time.Duration
	// EvictRetryMin and EvictRetryMax bound the backoff of a refused
	// eviction (1s, 30s).
	EvictRetryMin, EvictRetryMax time.Duration
	// APIRetry paces retries of API calls the turn depends on (2s).
	APIRetry time.Duration
	// EventFlush bounds how long a turn's reboot waits for its Rebooting
	// event to reach the API server (2s).
	EventFlush time.Duration
	// WatchdogFeed is how often a trial boot feeds its watchdog (10s).
	WatchdogFeed time.Duration
	// Stuck is how long one reconcile may run before Alive says liken-node
	// is stuck (10m): far longer than any reconcile takes, since the slow
	// work (downloads, drains) runs outside it.
	Stuck time.Duration
}

func (t *Timing) defaults() {
	set := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	set(&t.Progress, 2*time.Second)
	set(&t.Resync, 30*time.Second)
	set(&t.RetryMin, 10*time.Second)
	set(&t.RetryMax, 5*time.Minute)
	set(&t.DrainPoll, time.Second)
	set(&t.EvictRetryMin, time.Second)
	set(&t.EvictRetryMax, 30*time.Second)
	set(&t.APIRetry, 2*time.Second)
	set(&t.EventFlush, 2*time.Second)
	set(&t.WatchdogFeed, 10*time.Second)
	set(&t.Stuck, 10*time.Minute)
}

// ControlPlaneHealth checks a leader's own control plane
// (node/controlplane Health).
type ControlPlaneHealth interface {
	// Check returns nil when this leader's control plane is healthy, else
	// an error that says what is not, for the Machine's status.
	Check(ctx context.Context) error
	// SafeToStop returns nil when this leader's etcd member may go down
	// now with the datastore keeping its majority, asking the other
	// members directly; else an error that says which one stops it.
	SafeToStop(ctx context.Context) error
}

// Options configure a Daemon.
type Options struct {
	// Machine is the Machine (and Node) name.
	Machine string
	// Root holds the machine's disk state: slots, daemon state.
	Root string
	// Kube and Liken talk to the API server as the machine.
	Kube  kubernetes.Interface
	Liken versioned.Interface
	// Boot describes the running boot.
	Boot BootInfo
	// Layer is the Machine document of the layer this machine was
	// installed from (LayerMachineFile on its layer partition); nil when
	// there is none (installed before liken wrote it, or the lab).
	Layer *likenv1.Machine
	// Bootloader keeps the proven slot and the trial flag.
	Bootloader boot.Bootloader
	// BootPartition is the folder the boot partition is mounted on (/boot):
	// staging a slot installs the release's kernel and initramfs in
	// <BootPartition>/<slot>/. Empty installs none (the lab).
	BootPartition string
	// Applier changes the machine; Observer reports what it sees.
	Applier  changes.Applier
	Observer changes.Observer
	// Rebooter reboots the machine.
	Rebooter Rebooter
	// Watchdog is the watchdog the image's init armed for a trial boot,
	// opened by liken-node; nil when there is none. The daemon feeds it
	// while the trial is under way and disarms it only when the trial
	// commits (docs/design/boot.md, "The trial watchdog").
	Watchdog watchdog.Watchdog
	// ControlPlane checks this leader's own control plane (etcd member and
	// API server); nil on a machine that runs none. The kubelet reaches the
	// API through the Cluster's endpoint, so its Ready Node says nothing
	// about them: a leader's trial commits, and its RestartK3s turn ends,
	// only once ControlPlane reports healthy.
	ControlPlane ControlPlaneHealth
	// DatastoreRoom is, on a leader, how much more etcd may write to the
	// slot store's file system (its quota less its data); a download
	// leaves it free. nil on a machine that runs no datastore.
	DatastoreRoom func() int64
	// HTTPClient downloads releases; nil uses a client with sane timeouts.
	HTTPClient *http.Client
	// Clock is the daemon's clock; nil is the real one.
	Clock clock.WithTickerAndDelayedExecution
	// Timing holds the intervals; zero values take the defaults.
	Timing Timing
}

// ReadLayerMachine reads the Machine document of the layer a machine was
// installed from (Options.Layer). An empty path or a missing file is no
// document. Fields this release does not know are left out, not refused:
// a newer liken may have installed the machine, and only the role and
// ports are compared.
func ReadLayerMachine(path string) (*likenv1.Machine, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := &likenv1.Machine{}
	if err := yaml.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m.Kind != "Machine" || m.Name == "" {
		return nil, fmt.Errorf("%s holds no Machine document", path)
	}
	return m, nil
}
