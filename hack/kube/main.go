// Command kube is one binary that holds every upstream component liken's
// tests and lab run: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok. Shared packages compile and link once.
//
// The component is chosen by the first argument, or by the name the binary
// was called under (a symlink named after the component).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

const usage = "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok [flags]"

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "kube" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	switch name {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
	case "kube-apiserver":
		os.Exit(run(apiserver.NewAPIServerCommand(), name, args))
	case "kube-controller-manager":
		os.Exit(run(controllermanager.NewControllerManagerCommand(), name, args))
	case "kube-scheduler":
		os.Exit(run(scheduler.NewSchedulerCommand(), name, args))
	case "kwok":
		os.Exit(runKwok(args))
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q\n%s\n", name, usage)
		os.Exit(2)
	}
}

func run(cmd *cobra.Command, name string, args []string) int {
	cmd.SetArgs(args)
	os.Args = append([]string{name}, args...)
	return cli.Run(cmd)
}

func runKwok(args []string) int {
	os.Args = append([]string{"kwok"}, args...)
	// The Kubernetes components register flags (such as --version) on the
	// global flag set when their packages load; kwok defines its own.
	pflag.CommandLine = pflag.NewFlagSet("kwok", pflag.ContinueOnError)
	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}
	ctx := signals.SetupSignalContext()
	ctx, logger := kwoklog.InitFlags(ctx, flagset)
	ctx, err := kwokconfig.InitFlags(ctx, flagset)
	if err != nil {
		logger.Error("init config flags", "err", err)
		return 1
	}
	command := kwokcmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	command.SetArgs(args)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("kwok exited", "err", err)
		return 1
	}
	return 0
}
