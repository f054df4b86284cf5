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

// runKubectl refuses: a machine has no shell to run a client from, so the
// OS image's build leaves kubectl out too.
func runKubectl([]string) int {
	fmt.Fprintln(os.Stderr, "kube: this build has no kubectl (built with the tag nokwok, as on liken's OS image); run kubectl from your own computer")
	return 2
}
