package cli

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"liken.sh/liken/version"
)

// versionInfo is what liken version prints.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of liken",
		Long:  `Print the version of this liken binary, the Go version it was built with, and its platform.`,
		Example: `  # Print the version
  liken version

  # Print it as JSON
  liken version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versionInfo{Version: version.Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
			out := cmd.OutOrStdout()
			switch output {
			case "":
				fmt.Fprintf(out, "liken %s (%s, %s)\n", v.Version, v.GoVersion, v.Platform)
			case "json":
				b, err := json.MarshalIndent(v, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(out, string(b))
			default:
				return fmt.Errorf("--output %q is not supported: use json, or leave it out", output)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json.")
	return cmd
}
