// Package lab runs a whole liken fleet on one computer: a real control
// plane, kwok's simulated kubelets, a release channel, cluster-operator
// processes and one simulated machine (firmware plus node daemon) per
// Machine.
package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"liken.sh/liken/cli/lab/controlplane"
)

// NewCommand returns `liken lab` and its subcommands.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run a whole liken fleet on this computer",
		Long: `Run a whole liken fleet on this computer: a real Kubernetes control plane
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler), simulated
kubelets (kwok), a local release channel, cluster-operator, and one
simulated machine per Machine, each with its two boot slots, its firmware
and its node daemon.

Labs live in $LIKEN_LAB_HOME (default ~/.local/state/liken/labs); several
labs with different names can run at once.`,
		Example: `  # Start a lab of 5 machines (3 leaders) and use it
  liken lab up
  export KUBECONFIG=...   # the line liken lab up prints

  # Publish a new release into the lab's channel and print its catalog entry
  liken lab publish

  # Cut a machine's power, then turn it back on
  liken lab power off node-4
  liken lab power on node-4

  # Stop everything and remove the lab
  liken lab down`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newUpCommand(), newPublishCommand(), newStatusCommand(), newPowerCommand(), newDownCommand(),
		newMachineCommand(), newChannelCommand(), newEndpointCommand(), newSegmentCommand(), newDNSCommand(), newRegistryCommand(), newOperatorCommand(), newNSMachineCommand(), newNSInitCommand())
	return cmd
}

func nameFlag(cmd *cobra.Command, name *string) {
	cmd.Flags().StringVar(name, "name", "lab", "Name of the lab.")
}

func newPublishCommand() *cobra.Command {
	var name, fault string
	cmd := &cobra.Command{
		Use:   "publish [--name N] [--fault panic|no-rejoin|corrupt]",
		Short: "Build the next release into the lab's channel and print its catalog entry",
		Long: `Build the next release (the next version number) as a real squashfs image,
publish it into the lab's release channel, and print its catalog entry:
paste it into spec.releases.catalog of the Cluster.

--fault builds a release that fails on purpose: panic (the image does not
boot), no-rejoin (it boots but never rejoins the cluster), corrupt (the
channel serves image bytes that do not match the release document).`,
		Example: `  # Publish a good release
  liken lab publish

  # Publish a release whose image panics at boot
  liken lab publish --fault panic`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := Load(name)
			if err != nil {
				return err
			}
			unlock, err := lock(st.Dir)
			if err != nil {
				return err
			}
			defer unlock()
			version, digest, err := publish(st, fault)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Published %s to %s. Add this entry to spec.releases.catalog of Cluster %s:\n", version, st.Channel, st.Name)
			fmt.Fprintf(cmd.OutOrStdout(), "- version: %q\n  digest: %s\n", version, digest)
			return nil
		},
	}
	nameFlag(cmd, &name)
	cmd.Flags().StringVar(&fault, "fault", "", "Publish a release that fails: panic, no-rejoin or corrupt.")
	return cmd
}

func newStatusCommand() *cobra.Command {
	var name, output string
	cmd := &cobra.Command{
		Use:   "status [--name N] [-o json]",
		Short: "Show the lab's processes, release channel and kubeconfig",
		Long: `Show the lab's processes, release channel and kubeconfig. It exits non-zero
when a process the lab needs has exited (the computer restarted, or it was
killed): liken lab up --name N then starts the lab again, or liken lab down
--name N removes it. A machine powered off with liken lab power off is not
counted as exited.`,
		Example: `  liken lab status
  liken lab status -o json | jq -r .kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := Load(name)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
				return checked(st)
			case "":
			default:
				return fmt.Errorf("-o %q: the output formats are json, or none for a table", output)
			}
			fmt.Fprintf(out, "Lab %s (%s)\n", st.Name, st.Dir)
			fmt.Fprintf(out, "Kubeconfig:  %s\n", st.Kubeconfig)
			if st.Endpoint != "" {
				fmt.Fprintf(out, "Endpoint:    %s (forwards to a ready leader)\n", st.Endpoint)
			}
			fmt.Fprintf(out, "Channel:     %s\n\n", st.Channel)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tNAME\tPID\tSTATE\tLOG")
			for _, p := range st.Processes {
				state := "running"
				if p.PID == 0 {
					state = "powered off"
				} else if !p.Running() {
					state = "exited"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.Kind, p.Name, p.PID, state, p.Log)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return checked(st)
		},
	}
	nameFlag(cmd, &name)
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json.")
	return cmd
}

// checked is st.Check as an error: nil when the lab runs.
func checked(st *State) error {
	if down := st.Check(); down != nil {
		return down
	}
	return nil
}

func newPowerCommand() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "power off|on|cycle MACHINE [--name N]",
		Short: "Cut, restore or cycle a simulated machine's power",
		Long: `Cut (off), restore (on) or cycle a simulated machine's power. Off kills the
machine at once, as a power cut does: its node daemon gets no warning, and
its Node reads NotReady. A machine in namespaces is off once its last process
has exited, and off returns only then. On boots it again through its firmware.`,
		Example: `  liken lab power off node-2
  liken lab power on node-2
  liken lab power cycle node-2`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("power takes an action (off, on or cycle) and a machine name, such as: liken lab power off node-2")
			}
			switch args[0] {
			case "off", "on", "cycle":
				return nil
			}
			return fmt.Errorf("power action %q: choose off, on or cycle", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := Load(name)
			if err != nil {
				return err
			}
			unlock, err := lock(st.Dir)
			if err != nil {
				return err
			}
			defer unlock()
			// Re-read under the lock.
			if st, err = Load(name); err != nil {
				return err
			}
			m, err := st.Machine(args[1])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if args[0] == "off" || args[0] == "cycle" {
				if err := powerOff(ctx, st, m); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: power off\n", m.Name)
			}
			if args[0] == "on" || args[0] == "cycle" {
				if err := powerOn(st, m); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: power on\n", m.Name)
			}
			return st.Save()
		},
	}
	nameFlag(cmd, &name)
	return cmd
}

func newDownCommand() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:     "down [--name N]",
		Short:   "Stop every process of the lab and remove its state",
		Example: `  liken lab down --name lab`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := Dir(name)
			if err != nil {
				return err
			}
			st, err := Load(name)
			if err != nil {
				if _, statErr := os.Stat(dir); statErr == nil {
					// A lab that failed to start leaves no state: remove its folder.
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
					return os.RemoveAll(dir)
				}
				return err
			}
			stopAll(st)
			if err := os.RemoveAll(st.Dir); err != nil {
				return fmt.Errorf("removing %s: %w", st.Dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Lab %s is down: %d processes stopped, %s removed.\n", st.Name, len(st.Processes), st.Dir)
			return nil
		},
	}
	nameFlag(cmd, &name)
	return cmd
}

// stopAll ends every process of the lab: machines first (their whole
// process group: firmware and node daemon), then operators, the channel,
// and the control plane, newest first.
func stopAll(st *State) {
	// Supervisors first, so that they do not start the copies again; each
	// stops its copy on SIGTERM.
	for _, p := range st.Processes {
		if p.Kind == KindSupervisor {
			p.Stop(15 * time.Second)
		}
	}
	for i := len(st.Processes) - 1; i >= 0; i-- {
		p := st.Processes[i]
		if p.Kind == KindMachine && p.Running() {
			_ = syscall.Kill(-p.PID, syscall.SIGKILL)
			controlplane.StopPID(p.PID, 5*time.Second)
		}
	}
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if p := st.Processes[i]; p.Kind != KindMachine && p.Kind != KindSupervisor {
			p.Stop(10 * time.Second)
		}
	}
	if st.Containers {
		if err := stopContainers(st); err != nil {
			fmt.Fprintf(os.Stderr, "warning: lab %s: %v\n", st.Name, err)
		}
	}
}

// powerOff cuts a machine's power: its firmware and node daemon die at
// once, and its Node reads NotReady. A namespace machine is off once its
// cgroup is empty.
func powerOff(ctx context.Context, st *State, m *MachineInfo) error {
	p := st.Process(KindMachine, m.Name)
	if p == nil {
		return fmt.Errorf("lab %s has no process for machine %s", st.Name, m.Name)
	}
	if p.Running() {
		_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		controlplane.StopPID(p.PID, 5*time.Second)
	}
	p.PID = 0
	if st.Containers {
		// Off means off: no process of the machine may still write to
		// its disk once this returns.
		if err := NSMachine(st, m).WaitOff(30 * time.Second); err != nil {
			return err
		}
	}
	if st.RealImage() {
		// The real kubelet stops renewing the Node's Lease by itself.
		return nil
	}
	cp, err := adminClient(st)
	if err != nil {
		return err
	}
	return controlplane.SetNodePower(ctx, cp, m.Name, false)
}

// powerOn starts a machine's firmware, which boots it.
func powerOn(st *State, m *MachineInfo) error {
	p := st.Process(KindMachine, m.Name)
	if p == nil {
		return fmt.Errorf("lab %s has no process for machine %s", st.Name, m.Name)
	}
	if p.Running() {
		return fmt.Errorf("machine %s is already on (pid %d); use liken lab power cycle %s to restart it", m.Name, p.PID, m.Name)
	}
	np, err := startMachine(st, m)
	if err != nil {
		return err
	}
	*p = *np
	return nil
}

// lock takes the lab's lock, so that two liken commands do not change its
// state at once.
func lock(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func itoa(i int) string { return strconv.Itoa(i) }

func machineNames(n int) []string {
	var names []string
	for i := 1; i <= n; i++ {
		names = append(names, "node-"+itoa(i))
	}
	return names
}
