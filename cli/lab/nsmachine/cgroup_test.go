package nsmachine

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestMakeCgroupGivesCPUsToAParentMadeEmpty: the machines of a lab start
// at once, and one may find the lab's cgroup made by another that has not
// given it its CPUs yet. makeCgroup gives them to that parent and to the
// machine's own cgroup, so that a process may join it (before, the
// machine's cgroup got the parent's empty CPUs, every boot of it failed
// with "no space left on device", and the lab's API never came up).
func TestMakeCgroupGivesCPUsToAParentMadeEmpty(t *testing.T) {
	hs, err := hierarchies()
	assert.NilError(t, err)
	var h hierarchy
	for _, x := range hs {
		if strings.Contains(x.options, "cpuset") {
			h = x
		}
	}
	assert.Assert(t, h.mountPoint != "", "this host has no cgroup v1 cpuset hierarchy, which the namespace lab's machines join")
	lab := fmt.Sprintf("/liken-test-%d", time.Now().UnixNano())
	t.Cleanup(func() { assert.Check(t, removeTree(h.dir(lab))) })
	// Another machine made the lab's cgroup and has not given it CPUs.
	assert.NilError(t, os.Mkdir(h.dir(lab), 0o755))
	assert.NilError(t, os.Mkdir(h.dir(lab+"/ns"), 0o755))
	read := func(dir, name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		assert.NilError(t, err)
		return strings.TrimSpace(string(b))
	}
	assert.Equal(t, read(h.dir(lab+"/ns"), "cpuset.cpus"), "", "the case is a parent with no CPUs")

	assert.NilError(t, makeCgroup(h, h.dir(lab+"/ns/node-2")))
	for _, name := range []string{"cpuset.cpus", "cpuset.mems"} {
		want := read(h.mountPoint, name)
		for _, d := range []string{lab, lab + "/ns", lab + "/ns/node-2"} {
			assert.Check(t, read(h.dir(d), name) == want, "%s of %s: %q, want %q", name, d, read(h.dir(d), name), want)
		}
	}
	// A process may join it.
	assert.NilError(t, os.WriteFile(filepath.Join(h.dir(lab+"/ns/node-2"), "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(h.mountPoint, h.path, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644))
}
