package qemu

import (
	"slices"
	"testing"

	"gotest.tools/v3/assert"
)

// TestArgsForwards: each forward is one hostfwd on the host's loopback,
// in the order of the host ports, so two runs start the same QEMU.
func TestArgsForwards(t *testing.T) {
	tools := &Tools{Root: "/q"}
	for _, tc := range []struct {
		name   string
		hw     Hardware
		netdev string
	}{
		{"no forward", Hardware{MemoryMiB: 512, CPUs: 1, Network: true}, "user,id=net0"},
		{"three forwards", Hardware{MemoryMiB: 512, CPUs: 1, Network: true, Forwards: map[int]int{32380: 2380, 26443: 6443, 32379: 2379}},
			"user,id=net0,hostfwd=tcp:127.0.0.1:26443-:6443,hostfwd=tcp:127.0.0.1:32379-:2379,hostfwd=tcp:127.0.0.1:32380-:2380"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tools.Args("/d.img", tc.hw, "stdio")
			i := slices.Index(args, "-netdev")
			assert.Assert(t, i >= 0, "no -netdev in %q", args)
			assert.Equal(t, args[i+1], tc.netdev)
		})
	}
	args := tools.Args("/d.img", Hardware{MemoryMiB: 512, CPUs: 1, Forwards: map[int]int{26443: 6443}}, "stdio")
	assert.Check(t, !slices.Contains(args, "-netdev"), "a machine with no network got one: %q", args)
}
