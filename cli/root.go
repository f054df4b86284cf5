// Package cli assembles the liken command line: the root command, its global flags and help.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/kube"
	"liken.sh/liken/cli/lab"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/cli/logs"
	"liken.sh/liken/cli/reboot"
	"liken.sh/liken/cli/release"
	"liken.sh/liken/cli/rollout"
)

// Command groups of liken --help.
const (
	groupFleet   = "fleet"
	groupInstall = "install"
	groupOther   = "other"
)

// NewRootCommand returns the liken command with every subcommand and the
// standard kubeconfig flags (--kubeconfig, --context, --server, ...).
func NewRootCommand() *cobra.Command {
	flags := kube.NewFlags()
	root := &cobra.Command{
		Use:   "liken",
		Short: "liken operates fleets of immutable Kubernetes machines",
		Long: `liken operates fleets of immutable Kubernetes machines. A Cluster and its
Machines are declared with kubectl; liken packs the deployment layer the
machines boot with, publishes releases, approves and requests reboots, and
follows rollouts.`,
		Example: `  # Approve the reboot a Manual machine is waiting for
  liken approve-reboot mycluster node-4

  # Follow a rollout until every machine runs the new release
  liken rollout status mycluster

  # Run a whole fleet on this computer
  liken lab up`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              cobra.NoArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
	}
	flags.AddFlags(root.PersistentFlags())
	verbosity := 0
	root.PersistentFlags().IntVarP(&verbosity, "v", "v", 0, "Log level of the Kubernetes client libraries (0: no logs; 4 or more shows requests).")
	root.PersistentPreRun = func(*cobra.Command, []string) { setupLogs(verbosity) }
	root.SetUsageTemplate(usageTemplate)
	root.SetHelpTemplate(helpTemplate)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w\nSee '%s --help' for usage", err, cmd.CommandPath())
	})
	root.AddGroup(
		&cobra.Group{ID: groupFleet, Title: "Fleet Commands:"},
		&cobra.Group{ID: groupInstall, Title: "Install and Release Commands:"},
		&cobra.Group{ID: groupOther, Title: "Other Commands:"},
	)

	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add(groupFleet,
		reboot.NewApproveCommand(flags),
		reboot.NewRequestCommand(flags),
		rollout.NewCommand(flags),
		logs.NewCommand(flags),
	)
	add(groupInstall,
		install.NewCommand(),
		layer.NewCommand(),
		release.NewCommand(),
	)
	add(groupOther, lab.NewCommand(), newVersionCommand(), newOptionsCommand())

	root.SetHelpCommandGroupID(groupOther)
	root.SetCompletionCommandGroupID(groupOther)
	root.InitDefaultHelpCmd()
	// The completion command is added when the command runs: cobra binds
	// it to the output set at that time.
	return root
}

// Main runs liken with the process's arguments and returns its exit code:
// 0 on success, 1 when the command failed (the error is printed to stderr),
// 130 when Ctrl-C or SIGTERM stopped it.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, NewRootCommand(), os.Args[1:], os.Stdout, os.Stderr)
}

// Run executes root with args and returns the exit code (0, 1, or 130 when
// ctx was cancelled), printing any error to stderr as "error: ...".
func Run(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			fmt.Fprintln(stderr, "error: interrupted")
			return 130
		}
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 1
	}
	return 0
}

// setupLogs sends the client libraries' klog output to stderr at
// verbosity v, and nowhere at 0: a command reports its own errors.
func setupLogs(v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if v > 0 {
		_ = fs.Set("v", strconv.Itoa(v))
		return
	}
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
}

const helpTemplate = `{{with (or .Long .Short)}}{{. | trimTrailingWhitespaces}}

{{end}}{{if or .Runnable .HasSubCommands}}{{.UsageString}}{{end}}`

// usageTemplate reads like kubectl's: examples, commands, the command's own
// options, usage, and a pointer to the global options.
const usageTemplate = `{{if .HasExample}}Examples:
{{.Example}}
{{end}}{{if .HasAvailableSubCommands}}{{$cmds := .Commands}}{{if eq (len .Groups) 0}}
Available Commands:{{range $cmds}}{{if .IsAvailableCommand}}
  {{rpad .Name .NamePadding }}   {{.Short}}{{end}}{{end}}
{{else}}{{range $group := .Groups}}
{{.Title}}{{range $cmds}}{{if (and (eq .GroupID $group.ID) (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }}   {{.Short}}{{end}}{{end}}
{{end}}{{end}}{{end}}{{if .LocalNonPersistentFlags.HasAvailableFlags}}
Options:
{{.LocalNonPersistentFlags.FlagUsages | trimTrailingWhitespaces}}
{{end}}
Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}
{{if .HasAvailableSubCommands}}
Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
Use "{{.Root.Name}} options" for a list of global command-line options (applies to all commands).
`

func newOptionsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "options",
		Short: "Print the global command-line options (kubeconfig and connection flags)",
		Long: `Print the options every liken command accepts: the kubeconfig file and
context to use, and how to reach and authenticate to the API server. They
work as they do for kubectl.`,
		Example: `  # Print the global options
  liken options`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, "The following options can be passed to any command:")
			fmt.Fprintln(out)
			fmt.Fprint(out, cmd.Root().PersistentFlags().FlagUsages())
			return nil
		},
	}
}
