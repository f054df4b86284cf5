//go:build vmfaults

package vme2e

import (
	"testing"

	"liken.sh/liken/e2e/internal/userlab"
)

// TestNetworkAcrossMachines runs userlab.NetworkAcrossMachines on two
// virtual machines on the VM lab's segment (make test runs it on machines
// in namespaces, e2e/containers).
func TestNetworkAcrossMachines(t *testing.T) {
	userlab.NetworkAcrossMachines(t, userlab.Up(t, userlab.VM, "net", 2, 1))
}
