package loopdev

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
)

// Machines of the lab boot at the same moment, each attaching its slot:
// every attach succeeds, each on its own device, with the file's bytes.
func TestAttachesAtTheSameMoment(t *testing.T) {
	const n = 8
	dir := t.TempDir()
	var wg sync.WaitGroup
	devs, errs := make([]string, n), make([]error, n)
	releases := make([]func(), n)
	for i := range n {
		file := filepath.Join(dir, string(rune('a'+i)))
		assert.NilError(t, os.WriteFile(file, bytes.Repeat([]byte{byte(i)}, 4096), 0o600))
		wg.Add(1)
		go func() {
			defer wg.Done()
			devs[i], releases[i], errs[i] = Attach(file)
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		assert.NilError(t, errs[i], "attach %d", i)
		defer releases[i]()
		assert.Assert(t, !seen[devs[i]], "%s given twice", devs[i])
		seen[devs[i]] = true
		b := make([]byte, 4096)
		f, err := os.Open(devs[i])
		assert.NilError(t, err)
		_, err = f.ReadAt(b, 0)
		f.Close()
		assert.NilError(t, err)
		assert.DeepEqual(t, b, bytes.Repeat([]byte{byte(i)}, 4096))
	}
}
