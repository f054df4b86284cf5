//go:build vmleaders

package vme2e

import (
	"testing"

	"liken.sh/liken/e2e/internal/userlab"
)

// TestSelfHostedFleet runs userlab.SelfHostedFleet on five virtual
// machines, three of them leaders (make test-vm-leaders: more than a
// 2-core host carries; e2e/containers runs it on machines in namespaces).
func TestSelfHostedFleet(t *testing.T) {
	userlab.SelfHostedFleet(t, userlab.Up(t, userlab.VM, "fleet", 5, 3))
}
