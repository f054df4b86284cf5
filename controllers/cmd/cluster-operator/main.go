// Command cluster-operator grants reboot turns to the machines of liken
// Clusters under their disruption budget. Run two copies: one leads
// (Lease liken-system/cluster-operator), the other waits to take over.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"liken.sh/liken/controllers/internal/operator"
	"liken.sh/liken/controllers/liveness"
	"liken.sh/liken/internal/command"
	"liken.sh/liken/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	o := operator.Options{Version: version.Version}
	var kubeconfig string
	cmd := &cobra.Command{
		Use:     "cluster-operator",
		Short:   "Grants reboot turns to liken machines under each Cluster's disruption budget",
		Version: version.Version,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("cluster-operator takes no arguments, got %q", args)}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := klog.NewContext(cmd.Context(), klog.Background().WithValues("identity", o.Identity))
			cfg, err := command.RESTConfig(kubeconfig, "cluster-operator/"+version.Version)
			if err != nil {
				return err
			}
			o.Config = cfg
			return operator.Run(ctx, o, func(code int) {
				klog.Flush()
				os.Exit(code)
			})
		},
	}
	cmd.SetVersionTemplate("{{.Version}}\n")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	fs := cmd.Flags()
	command.AddKlogFlags(fs)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig, to run outside the cluster (the lab). Empty: $KUBECONFIG, or the in-cluster service account.")
	fs.StringVar(&o.Identity, "identity", operator.Hostname(), "Name of this copy in the Lease liken-system/cluster-operator; every copy needs its own. The default is the host name (a pod's name in the cluster).")
	fs.DurationVar(&o.StartupGrace, "startup-grace", 40*time.Second, "After it starts leading, this copy grants no turn for this long, so that machines that went down before it started read Lost first.")
	fs.DurationVar(&o.MachineLostAfter, "machine-lost-after", liveness.DefaultLostAfter, "A machine whose Node Lease (kube-node-lease/<node>, renewed by its kubelet) was not seen renewed for this long (on this copy's clock) reads Lost and counts against the disruption budget.")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "Address serving /metrics (Prometheus), /healthz and /readyz. \"0\" turns the server off; a port of 0 picks a free one (logged).")
	cmd.SetArgs(args)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.ExecuteContext(ctx)
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster-operator:", err)
		if errors.As(err, new(usageError)) {
			fmt.Fprintln(os.Stderr, "Run cluster-operator --help for its flags.")
			return 2
		}
		return 1
	}
	return 0
}

// usageError is a bad command line: exit code 2.
type usageError struct{ error }
