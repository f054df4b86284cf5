package boot

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestMachineIDIsKeptAcrossBoots: the first boot makes a machine ID on the
// slot store, every later boot's /etc gets the same one, and one that is
// damaged is replaced.
func TestMachineIDIsKeptAcrossBoots(t *testing.T) {
	store := t.TempDir()
	boot := func() string {
		root := t.TempDir()
		assert.NilError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, "etc", "machine-id"), nil, 0o444))
		assert.NilError(t, SetMachineID(root, store))
		b, err := os.ReadFile(filepath.Join(root, "etc", "machine-id"))
		assert.NilError(t, err)
		return string(b)
	}
	first := boot()
	assert.Check(t, machineID.MatchString(first[:len(first)-1]), "%q", first)
	assert.Check(t, is.Equal(boot(), first), "a second boot has another machine ID")

	assert.NilError(t, os.Chmod(filepath.Join(store, MachineIDFile), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(store, MachineIDFile), []byte("half-writ"), 0o644))
	again := boot()
	assert.Check(t, again != first && machineID.MatchString(again[:len(again)-1]), "%q", again)
	assert.Check(t, is.Equal(boot(), again))
}
