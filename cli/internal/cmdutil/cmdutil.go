// Package cmdutil holds small helpers shared by the liken commands: argument checks, human-readable figures and shell quoting.
package cmdutil

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// ExactArgs requires exactly the named positional arguments and names the
// missing or extra ones in its error, with the command's usage.
func ExactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			missing := names[len(args):]
			return fmt.Errorf("%s %s missing; usage: %s", strings.Join(missing, " and "), pluralWord(len(missing), "is", "are"), cmd.UseLine())
		case len(args) > len(names):
			return fmt.Errorf("too many arguments (%s); usage: %s", strings.Join(args[len(names):], " "), cmd.UseLine())
		}
		return nil
	}
}

// MaxArgs allows the named positional arguments, each optional in order.
func MaxArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > len(names) {
			return fmt.Errorf("too many arguments (%s); usage: %s", strings.Join(args[len(names):], " "), cmd.UseLine())
		}
		return nil
	}
}

// Plural is "1 machine" or "3 machines".
func Plural(n int, one, many string) string {
	return fmt.Sprintf("%d %s", n, pluralWord(n, one, many))
}

func pluralWord(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// HumanBytes formats a byte count with binary units: 512 B, 1.5 KiB, 400.0 MiB.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ShellQuote quotes s for a POSIX shell, so that a printed line such as
// export KUBECONFIG=... reads back s whatever it holds (spaces, $, quotes)
// when eval'd.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
