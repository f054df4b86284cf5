package lab

import (
	"net"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"liken.sh/liken/cli/lab/names"
	"liken.sh/liken/internal/atomicfile"
)

// ChannelName is the name the VM lab's machines read the release channel
// at: the lab's name server answers it with QEMU's address of this
// computer, and the channel's certificate, from the lab's own CA, names it.
const ChannelName = "channel.liken.internal"

// newDNSCommand is the VM lab's name server (package names).
func newDNSCommand() *cobra.Command {
	var pairs []string
	var portFile string
	var where listenFlags
	cmd := &cobra.Command{
		Use:    "serve-dns --name NAME=ADDRESS... --port-file FILE",
		Short:  "Answer the VM lab's names on a loopback UDP port (started by liken lab up --vm)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			table, err := names.ParseTable(pairs)
			if err != nil {
				return err
			}
			pc, err := where.listenPacket()
			if err != nil {
				return err
			}
			if err := atomicfile.Write(portFile, []byte(strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)), 0o644); err != nil {
				return err
			}
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(cmd.ErrOrStderr())))
			return table.Serve(klog.NewContext(cmd.Context(), logger), pc)
		},
	}
	cmd.Flags().StringArrayVar(&pairs, "name", nil, "a name and the address it resolves to, NAME=ADDRESS (repeat for more)")
	cmd.Flags().StringVar(&portFile, "port-file", "", "where to write the chosen port")
	_ = cmd.MarkFlagRequired("name")
	_ = cmd.MarkFlagRequired("port-file")
	where.add(cmd.Flags())
	return cmd
}
