package lab

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"liken.sh/liken/cli/lab/nsmachine"
	"liken.sh/liken/node/boot"
)

// newNSMachineCommand is a lab machine in namespaces while its power is
// on: its firmware, nsmachine.Machine.Run. Killing it pulls the machine's
// power (liken lab power off).
func newNSMachineCommand() *cobra.Command {
	m := &nsmachine.Machine{}
	cmd := &cobra.Command{
		Use:    "ns-machine --name NAME --dir DIR --cgroup CGROUP",
		Short:  "Run one lab machine in Linux namespaces: its firmware, booting liken's OS image (started by liken lab up and power on)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			m.Init = []string{self, "lab", "ns-init"}
			m.Console = cmd.OutOrStdout()
			end, err := m.Run(cmd.Context())
			if err != nil {
				return fmt.Errorf("machine %s: %w", m.Name, err)
			}
			if end == nsmachine.PoweredOff {
				fmt.Fprintf(cmd.OutOrStdout(), "machine %s powered itself off: liken lab power on %s starts it again\n", m.Name, m.Name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&m.Name, "name", "", "the machine's name")
	f.StringVar(&m.Dir, "dir", "", "the machine's folder, written by liken install")
	f.StringVar(&m.Cgroup, "cgroup", "", "the machine's cgroup, below this process's own")
	f.StringVar(&m.NetNS, "netns", "", "the network namespace the machine joins (default: one of its own with only loopback)")
	for _, n := range []string{"name", "dir", "cgroup"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

// newNSInitCommand is the first process of a lab machine in namespaces:
// nsmachine.Init, the machine's initramfs.
func newNSInitCommand() *cobra.Command {
	var o nsmachine.InitOptions
	var slot string
	cmd := &cobra.Command{
		Use:    "ns-init --dir DIR --slot A|B",
		Short:  "Assemble a lab machine's root in its namespaces and run the image's init (started by a lab machine in namespaces)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := boot.ParseSlot(slot)
			if err != nil {
				return err
			}
			o.Slot = s
			return nsmachine.Init(o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "the machine's folder")
	f.StringVar(&slot, "slot", "", "the slot to boot")
	f.StringVar(&o.Cgroup, "cgroup", "", "the machine's cgroup, below this process's own")
	f.StringVar(&o.NetNS, "netns", "", "the network namespace to join")
	f.StringVar(&o.Hostname, "hostname", "", "the machine's name")
	f.IntVar(&o.PowerFD, "power-fd", 0, "the power line: a pipe the starting process holds the other end of")
	for _, n := range []string{"dir", "slot", "cgroup", "hostname"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}
