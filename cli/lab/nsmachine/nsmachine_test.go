package nsmachine

import (
	"os/exec"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestEnding reads how a machine's init ended as the firmware must: a
// restart and a power-off by the kernel's signals for a PID namespace's
// init, and an init that exits or is killed as a crash, after which the
// firmware boots again.
func TestEnding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		want   Ending
		err    string
	}{
		{name: "reboot(2) restart", script: "kill -HUP $$", want: Rebooted},
		{name: "reboot(2) power off", script: "kill -INT $$", want: PoweredOff},
		{name: "killed", script: "kill -KILL $$", want: Crashed},
		{name: "init exits with an error", script: "exit 3", want: Crashed, err: "init exited with status 3: a kernel panics when its init ends"},
		{name: "init exits", script: "exit 0", want: Crashed, err: "init exited: a kernel panics when its init ends"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := end(exec.Command("sh", "-c", tc.script).Run())
			assert.Check(t, is.Equal(got, tc.want))
			if tc.err == "" {
				assert.Check(t, err)
			} else {
				assert.Check(t, is.Error(err, tc.err))
			}
		})
	}
}
