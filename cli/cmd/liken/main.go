// Command liken is the command line of liken: deployment layers, reboots, rollouts, releases and the lab.
package main

import (
	"os"

	"liken.sh/liken/cli"
)

func main() {
	os.Exit(cli.Main())
}
