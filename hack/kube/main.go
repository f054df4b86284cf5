// Command kube is one binary that holds every upstream component liken's
// tests and lab run: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy, kwok and kubectl. Shared packages compile and link once.
//
// The component is chosen by the first argument, or by the name the binary
// was called under (a symlink named after the component, as make build
// writes for kubectl). Built with the tag nokwok (liken's OS image), it
// leaves kwok and kubectl out.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|kwok|kubectl [flags]"

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
	case "kube-proxy":
		os.Exit(run(proxy.NewProxyCommand(), name, args))
	case "kwok":
		os.Exit(runKwok(args))
	case "kubectl":
		os.Exit(runKubectl(args))
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
