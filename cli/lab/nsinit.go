package lab

import (
	"github.com/spf13/cobra"

	"liken.sh/liken/cli/lab/nsmachine"
	"liken.sh/liken/node/boot"
)

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
	for _, n := range []string{"dir", "slot", "cgroup", "hostname"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}
