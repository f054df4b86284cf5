package qemu

import (
	"os"
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

// TestAccel: machines are emulated unless LIKEN_QEMU_ACCEL asks for KVM,
// and any other value is refused before anything is downloaded.
func TestAccel(t *testing.T) {
	hw := Hardware{MemoryMiB: 512, CPUs: 1}
	for _, tc := range []struct{ accel, want string }{{"", "tcg"}, {"tcg", "tcg"}, {"kvm", "kvm"}} {
		args := (&Tools{Root: "/q", Accel: tc.accel}).Args("/d.img", hw, "stdio")
		i := slices.Index(args, "-accel")
		assert.Assert(t, i >= 0, "no -accel in %q", args)
		assert.Check(t, args[i+1] == tc.want, "Accel %q: -accel %s", tc.accel, args[i+1])
	}
	t.Setenv(AccelEnv, "hvf")
	dir := t.TempDir()
	_, err := Fetch(dir, nil, t.Logf)
	assert.ErrorContains(t, err, `LIKEN_QEMU_ACCEL="hvf": give tcg (software emulation, the default) or kvm`)
	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Check(t, len(entries) == 0, "Fetch wrote %d entries before refusing", len(entries))
}
