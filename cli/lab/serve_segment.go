package lab

import (
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"liken.sh/liken/cli/lab/segment"
)

// newSegmentCommand is the VM lab's network segment: the switch between
// the virtual machines' second ports (package segment).
func newSegmentCommand() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:    "serve-segment --socket PATH",
		Short:  "Switch Ethernet frames between the lab's virtual machines (started by liken lab up --vm)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sw, err := segment.Listen(socket)
			if err != nil {
				return err
			}
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(cmd.ErrOrStderr())))
			return sw.Serve(klog.NewContext(cmd.Context(), logger))
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the switch's unix datagram socket, where each machine's QEMU sends its frames")
	_ = cmd.MarkFlagRequired("socket")
	return cmd
}
