//go:build !nokwok

package main

import (
	"os"

	"github.com/spf13/pflag"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
)

// runKubectl runs kubectl as the pinned release builds it, so that the lab
// and the tests drive the cluster with a client of the control plane's own
// version instead of whatever the machine has installed.
func runKubectl(args []string) int {
	os.Args = append([]string{"kubectl"}, args...)
	// The server components register their flags on the global flag set
	// when their packages load; kubectl must not offer them.
	pflag.CommandLine = pflag.NewFlagSet("kubectl", pflag.ContinueOnError)
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}
