package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	kubefake "k8s.io/client-go/kubernetes/fake"

	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
)

type countingRebooter struct {
	n   int
	err error
}

func (r *countingRebooter) Reboot(context.Context) error {
	r.n++
	return r.err
}

// Every early failure of liken-node in a trial boot reboots into the
// proven slot instead of restarting for ever on the unproven one.
func TestStartFailed(t *testing.T) {
	failed := errors.New("the daemon state is unreadable")
	for _, tc := range []struct {
		name    string
		trial   bool
		err     error
		reboot  error
		reboots int
		want    string // "" for nil, "rebooted" for ErrRebooted
	}{
		{name: "proven boot: the service manager restarts it", err: failed, want: "the daemon state is unreadable"},
		{name: "trial boot: reboot into the proven slot", trial: true, err: failed, reboot: ErrRebooted, reboots: 1, want: "rebooted"},
		{name: "trial boot, the reboot fails", trial: true, err: failed, reboot: errors.New("no permission"), reboots: 1, want: "rebooting into the proven slot failed too: no permission"},
		{name: "trial boot, stopped by SIGTERM", trial: true},
		{name: "trial boot, already rebooting", trial: true, err: ErrRebooted, want: "rebooted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &countingRebooter{err: tc.reboot}
			err := StartFailed(context.Background(), BootInfo{Trial: tc.trial}, r, tc.err)
			assert.Equal(t, r.n, tc.reboots)
			switch tc.want {
			case "":
				assert.NilError(t, err)
			case "rebooted":
				assert.ErrorIs(t, err, ErrRebooted)
			default:
				assert.ErrorContains(t, err, tc.want)
			}
		})
	}
}

// TestStartFailedOnTheStateSave: a trial boot whose first save of the
// daemon state fails (a disk that refuses writes) stops, and StartFailed
// reboots it into the proven slot; a proven boot returns the error.
func TestStartFailedOnTheStateSave(t *testing.T) {
	failed := errors.New("input/output error")
	real := writeFile
	writeFile = func(p string, b []byte, perm os.FileMode) error {
		if filepath.Base(p) == filepath.Base(StateFile) {
			return failed
		}
		return real(p, b, perm)
	}
	t.Cleanup(func() { writeFile = real })

	for _, trial := range []bool{true, false} {
		t.Run(fmt.Sprintf("trial=%v", trial), func(t *testing.T) {
			bootDir := t.TempDir()
			assert.NilError(t, boot.NewGRUB(bootDir).Commit(boot.SlotA))
			bi := BootInfo{Slot: boot.SlotA, BootID: "b-2", Version: "2026.11.01-001", BootedAt: time.Now()}
			if trial {
				bi.Slot, bi.Trial, bi.Version = boot.SlotB, true, "2026.11.20-001"
			}
			root := t.TempDir()
			rec := changes.NewRecorder(filepath.Join(root, "applier.log"))
			d, err := New(Options{Machine: "m1", Root: root, Boot: bi, Bootloader: boot.NewGRUB(bootDir),
				Kube: kubefake.NewClientset(), Liken: likenfake.NewSimpleClientset(),
				Applier: rec, Observer: rec, Rebooter: ExitRebooter{}})
			assert.NilError(t, err)
			// A daemon that ran on would end at the deadline, and fail.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = d.Run(ctx)
			assert.ErrorIs(t, err, failed)
			assert.ErrorContains(t, err, "saving the daemon state")
			r := &countingRebooter{err: ErrRebooted}
			err = StartFailed(context.Background(), bi, r, err)
			if trial {
				assert.ErrorIs(t, err, ErrRebooted)
				assert.Equal(t, r.n, 1)
			} else {
				assert.ErrorIs(t, err, failed)
				assert.Equal(t, r.n, 0)
			}
		})
	}
}
