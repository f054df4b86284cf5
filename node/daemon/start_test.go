package daemon

import (
	"context"
	"errors"
	"testing"

	"gotest.tools/v3/assert"
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
