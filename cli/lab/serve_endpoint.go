package lab

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"liken.sh/liken/cli/lab/endpoint"
	"liken.sh/liken/cli/lab/nsnet"
	"liken.sh/liken/internal/atomicfile"
)

// newEndpointCommand is the VM lab's API endpoint: one loopback port whose
// connections go to a ready leader's API server (package endpoint).
func newEndpointCommand() *cobra.Command {
	var backends []string
	var caFile, portFile, netns, netnsAddress string
	var port int
	cmd := &cobra.Command{
		Use:    "serve-endpoint --backends HOST:PORT,... --ca FILE --port-file FILE [--port N]",
		Short:  "Forward a loopback port to a ready leader's API server (started by liken lab up --vm)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: give a TCP port from 1 to 65535, or leave --port out for a free one", port)
			}
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return fmt.Errorf("--ca: %w; give the file of the cluster's server CA certificate", err)
			}
			ca := x509.NewCertPool()
			if !ca.AppendCertsFromPEM(pem) {
				return fmt.Errorf("--ca %s: no PEM certificate in it; give the cluster's server CA certificate", caFile)
			}
			f, err := endpoint.New(backends, ca)
			if err != nil {
				return fmt.Errorf("--backends: %w", err)
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("--port %d: %w", port, err)
			}
			listeners := []net.Listener{l}
			if netns != "" {
				// The namespace lab: the leaders are in the lab's network
				// namespace, and so are the machines, which reach the
				// endpoint at netnsAddress.
				f.Dial = func(ctx context.Context, network, address string) (c net.Conn, err error) {
					err = nsnet.RunIn(netns, func() error {
						var d net.Dialer
						c, err = d.DialContext(ctx, network, address)
						return err
					})
					return c, err
				}
				if netnsAddress != "" {
					var inner net.Listener
					if err := nsnet.RunIn(netns, func() (err error) {
						inner, err = net.Listen("tcp", netnsAddress)
						return err
					}); err != nil {
						l.Close()
						return fmt.Errorf("--netns-address %s: %w", netnsAddress, err)
					}
					listeners = append(listeners, inner)
				}
			}
			if err := atomicfile.Write(portFile, []byte(strconv.Itoa(l.Addr().(*net.TCPAddr).Port)), 0o644); err != nil {
				l.Close()
				return fmt.Errorf("--port-file: %w", err)
			}
			// The backends' changes go to stderr (the process's log) even
			// when liken's -v leaves klog silent.
			v := 0
			if fl := cmd.Flags().Lookup("v"); fl != nil {
				v, _ = strconv.Atoi(fl.Value.String())
			}
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(cmd.ErrOrStderr()), textlogger.Verbosity(v)))
			return f.Serve(klog.NewContext(cmd.Context(), logger), listeners...)
		},
	}
	cmd.Flags().StringSliceVar(&backends, "backends", nil, "the leaders' forwarded API server addresses, host:port, comma separated")
	cmd.Flags().StringVar(&caFile, "ca", "", "the cluster's server CA certificate (PEM), to check the API servers' /readyz")
	cmd.Flags().StringVar(&portFile, "port-file", "", "where to write the chosen port")
	cmd.Flags().IntVar(&port, "port", 0, "the loopback port to listen on (default: a free one)")
	cmd.Flags().StringVar(&netns, "netns", "", "reach the backends inside this network namespace (the namespace lab's net/lab)")
	cmd.Flags().StringVar(&netnsAddress, "netns-address", "", "with --netns, also listen at this host:port inside it, for the machines")
	_ = cmd.MarkFlagRequired("backends")
	_ = cmd.MarkFlagRequired("ca")
	_ = cmd.MarkFlagRequired("port-file")
	return cmd
}
