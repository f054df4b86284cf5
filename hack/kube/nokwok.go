//go:build nokwok

package main

import (
	"fmt"
	"os"
)

// runKwok refuses: this build (liken's OS image) leaves kwok out.
func runKwok([]string) int {
	fmt.Fprintln(os.Stderr, "kube: this build has no kwok (built with the tag nokwok, as on liken's OS image)")
	return 2
}
