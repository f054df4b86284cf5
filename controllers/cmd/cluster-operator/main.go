// Command cluster-operator grants reboot turns to the machines of liken
// Clusters under their disruption budget. Run two copies: one leads
// (Lease liken-system/cluster-operator), the other waits to take over.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"liken.sh/liken/controllers/internal/operator"
	"liken.sh/liken/controllers/liveness"
	"liken.sh/liken/version"
)

func main() {
	fs := flag.NewFlagSet("cluster-operator", flag.ExitOnError)
	// Of klog's flags, only the verbosity ones: logs go to stderr.
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for _, name := range []string{"v", "vmodule"} {
		fs.Var(kfs.Lookup(name).Value, name, kfs.Lookup(name).Usage)
	}
	kubeconfig := fs.String("kubeconfig", "", "Path to a kubeconfig, to run outside the cluster (the lab). Empty: use the in-cluster service account.")
	identity := fs.String("identity", operator.Hostname(), "Name of this copy in the Lease liken-system/cluster-operator (default: the host name). Every copy needs its own.")
	grace := fs.Duration("startup-grace", 40*time.Second, "After it starts leading, this copy grants no turn for this long, so that machines that went down before it started read Lost first.")
	lostAfter := fs.Duration("machine-lost-after", liveness.DefaultLostAfter, "A machine whose Node Lease (kube-node-lease/<node>, renewed by its kubelet) was not seen renewed for this long (on this copy's clock) reads Lost and counts against the disruption budget.")
	metricsAddr := fs.String("metrics-bind-address", ":8080", "Address serving /metrics (Prometheus), /healthz and /readyz. \"0\" turns the server off; a port of 0 picks a free one (logged).")
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: cluster-operator [flags]\n\nGrants reboot turns to liken machines under each Cluster's disruption budget.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cluster-operator takes no arguments, got %q\n", fs.Args())
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithValues("identity", *identity)
	ctx = klog.NewContext(ctx, logger)

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster-operator:", err)
		os.Exit(1)
	}
	err = operator.Run(ctx, operator.Options{
		Config:           cfg,
		Identity:         *identity,
		StartupGrace:     *grace,
		MachineLostAfter: *lostAfter,
		MetricsAddr:      *metricsAddr,
		Version:          version.Version,
	}, func(code int) {
		klog.Flush()
		os.Exit(code)
	})
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster-operator:", err)
		os.Exit(1)
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("reading --kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not running in a cluster (%v): pass --kubeconfig to run outside one", err)
	}
	return cfg, nil
}
