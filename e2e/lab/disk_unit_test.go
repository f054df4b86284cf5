package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/generated/clientset/versioned/fake"
)

// TestDiskCheckerHashesEachReportedStage: a slot a Machine reports Staged
// whose bytes on disk are not the release is a problem, found when the
// report is seen; a slot whose machine has moved on since is not.
func TestDiskCheckerHashesEachReportedStage(t *testing.T) {
	const v2 = "2026.12.02-002"
	rootfs := []byte("the root file system of " + v2)
	sum := sha256.Sum256(rootfs)
	doc := []byte(fmt.Sprintf("version: %s\nartifacts:\n- path: rootfs.squashfs\n  size: %d\n  sha256: %s\n", v2, len(rootfs), hex.EncodeToString(sum[:])))
	digest := digestOf(doc)
	staged := likenv1.SlotStatus{Name: "B", State: likenv1.SlotStaged, Version: v2, Digest: digest}

	for _, tc := range []struct {
		name string
		// onDisk is the slot's rootfs.squashfs; now what the API server
		// holds when the checker reads the Machine again.
		onDisk []byte
		now    likenv1.SlotStatus
		want   string
	}{
		{name: "the release, byte for byte", onDisk: rootfs, now: staged},
		{name: "other bytes, still reported staged", onDisk: []byte("something else"), now: staged,
			want: "reports slot B Staged with " + v2 + " " + digest + ", but its disk does not hold it: rootfs.squashfs has sha256"},
		{name: "other bytes, the slot withdrawn since", onDisk: []byte("the next download"),
			now: likenv1.SlotStatus{Name: "B", State: likenv1.SlotDownloading, Version: "2026.12.02-003"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			slot := filepath.Join(dir, "disk", "slots", "B")
			assert.NilError(t, os.MkdirAll(slot, 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(slot, "release.yaml"), doc, 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(slot, "rootfs.squashfs"), tc.onDisk, 0o644))

			reported := &likenv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "node-1", ResourceVersion: "7"}}
			reported.Status.Slots = []likenv1.SlotStatus{staged}
			current := reported.DeepCopy()
			current.Status.Slots = []likenv1.SlotStatus{tc.now}
			l := &lab{t: t, name: "lab", client: fake.NewSimpleClientset([]runtime.Object{current}...)}
			assert.NilError(t, json.Unmarshal(fmt.Appendf(nil, `{"machines": [{"name": "node-1", "dir": %q}]}`, dir), &l.st))

			w := newWatcher("lab")
			d := newDiskChecker(l)
			d.start(w)
			d.enqueue(reported)
			d.enqueue(reported) // the same report again is not hashed again
			assert.Equal(t, d.stop(), 1)
			if tc.want == "" {
				assert.Equal(t, len(w.problems), 0, "%v", w.problems)
				return
			}
			assert.Equal(t, len(w.problems), 1, "%v", w.problems)
			assert.Check(t, is.Contains(w.problems[0], tc.want))
			assert.Check(t, strings.HasPrefix(w.problems[0], "Machine node-1@7 "))
		})
	}
}
