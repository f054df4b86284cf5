package lab

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"liken.sh/liken/cli/lab/registry"
	"liken.sh/liken/internal/atomicfile"
)

// RegistryName is the name the VM lab's machines pull the lab's registry's
// images at: the lab's name server answers it with QEMU's address of this
// computer, and the Cluster's settings.registryMirrors sends pulls for it
// over plain http.
const RegistryName = "registry.liken.internal"

// newRegistryCommand is the VM lab's image registry (package registry).
func newRegistryCommand() *cobra.Command {
	var dir, portFile string
	var where listenFlags
	cmd := &cobra.Command{
		Use:    "serve-registry --dir DIR --port-file FILE",
		Short:  "Serve the images of an OCI image layout folder to the VM lab's machines on a loopback port (started by liken lab up --vm)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			l, err := where.listen()
			if err != nil {
				return err
			}
			if err := atomicfile.Write(portFile, []byte(strconv.Itoa(l.Addr().(*net.TCPAddr).Port)), 0o644); err != nil {
				return err
			}
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(cmd.ErrOrStderr())))
			srv := &http.Server{
				Handler:           registry.Handler{Dir: dir},
				ReadHeaderTimeout: 10 * time.Second,
			}
			klog.SetLogger(logger)
			go func() {
				<-cmd.Context().Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			}()
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the OCI image layout folder to serve")
	cmd.Flags().StringVar(&portFile, "port-file", "", "where to write the chosen port")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagRequired("port-file")
	where.add(cmd.Flags())
	return cmd
}
