package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/daemon"
)

// A machine as runDaemon finds it: the kernel's files, a kubeconfig, the
// disk state and the boot folder, each of which a row breaks.
type machineFiles struct {
	dir string
	f   runFlags
}

func newMachineFiles(t *testing.T, trial bool) *machineFiles {
	t.Helper()
	dir := t.TempDir()
	m := &machineFiles{dir: dir}
	cmdline := "BOOT_IMAGE=/A/vmlinuz liken.slot=A panic=1\n"
	if trial {
		// GRUB has cleared the flag already: proven A, booting B once.
		cmdline = "BOOT_IMAGE=/B/vmlinuz liken.slot=B liken.trial=1 panic=1\n"
	}
	m.f = runFlags{
		machine:       "m1",
		kubeconfig:    m.write(t, "kubeconfig", kubeconfig),
		root:          filepath.Join(dir, "root"),
		bootDir:       filepath.Join(dir, "boot", "grub"),
		cmdlineFile:   m.write(t, "cmdline", cmdline),
		bootIDFile:    m.write(t, "boot_id", "0f1e2d3c-aaaa-bbbb-cccc-000000000001\n"),
		osReleaseFile: m.write(t, "release", "VERSION=2026.11.20-001\n"),
		statFile:      m.write(t, "stat", "cpu  1 2 3\nbtime 1795600000\n"),
		appliers:      "record", // the lab's: a reboot is ErrRebooted
	}
	assert.NilError(t, os.MkdirAll(m.f.root, 0o755))
	assert.NilError(t, os.MkdirAll(m.f.bootDir, 0o755))
	assert.NilError(t, boot.NewGRUB(m.f.bootDir).Commit(boot.SlotA))
	return m
}

func (m *machineFiles) write(t *testing.T, name, s string) string {
	t.Helper()
	p := filepath.Join(m.dir, name)
	assert.NilError(t, os.WriteFile(p, []byte(s), 0o644))
	return p
}

// kubeconfig names an API server nobody answers: every row fails before
// liken-node reaches it.
const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: m1
  user: {token: "t"}
contexts:
- name: c1
  context: {cluster: c1, user: m1}
current-context: c1
`

// TestEarlyFailureInATrialBoot: every early failure of liken-node in a
// trial boot (its boot information, kubeconfig, slot store, state file,
// boot loader I/O) reboots into the proven slot, through runDaemon's own
// wiring, instead of restarting for ever on the unproven slot; the same
// failure on a proven boot returns the error, for the service manager to
// restart it. (The state save is TestStartFailedOnTheStateSave in
// node/daemon: a root process cannot be kept from writing a file here.)
func TestEarlyFailureInATrialBoot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		breaK func(t *testing.T, m *machineFiles)
		err   string
		// provenRunsOn: a proven boot runs on (confused: it writes no
		// slot and takes no turn, and says why) rather than stop.
		provenRunsOn bool
	}{
		{
			name:  "boot ID unreadable",
			breaK: func(t *testing.T, m *machineFiles) { m.f.bootIDFile = filepath.Join(m.dir, "missing") },
			err:   "reading the boot ID",
		},
		{
			name:  "release file unreadable",
			breaK: func(t *testing.T, m *machineFiles) { m.f.osReleaseFile = filepath.Join(m.dir, "missing") },
			err:   "reading the running image's release file",
		},
		{
			name:  "boot time unreadable",
			breaK: func(t *testing.T, m *machineFiles) { m.f.statFile = m.write(t, "stat", "cpu 1\n") },
			err:   "no btime line",
		},
		{
			name:  "kubeconfig missing",
			breaK: func(t *testing.T, m *machineFiles) { m.f.kubeconfig = filepath.Join(m.dir, "missing") },
			err:   "loading the kubeconfig",
		},
		{
			name:  "kubeconfig unreadable",
			breaK: func(t *testing.T, m *machineFiles) { m.f.kubeconfig = m.write(t, "kubeconfig", "clusters: [") },
			err:   "loading the kubeconfig",
		},
		{
			name: "slot store cannot be opened",
			breaK: func(t *testing.T, m *machineFiles) {
				assert.NilError(t, os.WriteFile(filepath.Join(m.f.root, "slots"), []byte("not a folder"), 0o644))
			},
			err: "opening the slot store",
		},
		{
			name: "state file unreadable",
			breaK: func(t *testing.T, m *machineFiles) {
				p := filepath.Join(m.f.root, daemon.StateFile)
				assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				assert.NilError(t, os.WriteFile(p, []byte(`{"formatVersion": 1,`), 0o644))
			},
			err: "the daemon state",
		},
		{
			name: "boot state unreadable",
			breaK: func(t *testing.T, m *machineFiles) {
				env := filepath.Join(m.f.bootDir, boot.EnvFile)
				assert.NilError(t, os.Remove(env))
				assert.NilError(t, os.Mkdir(env, 0o755))
			},
			err:          "reading the boot state in a trial boot",
			provenRunsOn: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Within the test's deadline: a row that breaks nothing would
			// run on, and end with the context's error.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			m := newMachineFiles(t, true)
			tc.breaK(t, m)
			err := runDaemon(ctx, m.f)
			assert.ErrorIs(t, err, daemon.ErrRebooted, "a trial boot reboots into the proven slot")

			// The same failure on a proven boot is returned, not a reboot.
			m = newMachineFiles(t, false)
			tc.breaK(t, m)
			if tc.provenRunsOn {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				assert.NilError(t, runDaemon(ctx, m.f), "a proven boot runs on until SIGTERM")
				return
			}
			err = runDaemon(ctx, m.f)
			assert.Assert(t, !errors.Is(err, daemon.ErrRebooted), "a proven boot does not reboot on %v", err)
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// TestCertificateLookedAtWhileRunning: while liken-node runs, it looks at
// the machine's certificate once every renewInterval, bounds each renewal
// by joinTimeout, tries again at the next look after a failed renewal,
// and stops looking when it stops.
func TestCertificateLookedAtWhileRunning(t *testing.T) {
	start := time.Now()
	clk := clocktesting.NewFakeClock(start)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type look struct {
		at       time.Time
		deadline time.Time
	}
	looks := make(chan look)
	results := []error{errors.New("the API server does not answer"), nil}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		renewCertificate(ctx, clk, func(rctx context.Context) error {
			d, _ := rctx.Deadline()
			looks <- look{at: clk.Now(), deadline: d}
			err := results[0]
			results = results[1:]
			return err
		})
	}()
	for i := 1; i <= 2; i++ {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if clk.HasWaiters() {
				return poll.Success()
			}
			return poll.Continue("renewCertificate is not waiting for its ticker")
		}, poll.WithDelay(time.Millisecond))
		clk.Step(renewInterval)
		l := <-looks
		assert.Equal(t, l.at, start.Add(time.Duration(i)*renewInterval), "look %d", i)
		assert.Assert(t, !l.deadline.IsZero() && l.deadline.Sub(time.Now()) <= joinTimeout, "look %d: the renewal is not bounded by joinTimeout (deadline %s)", i, l.deadline)
	}
	cancel()
	<-stopped
	assert.Equal(t, len(results), 0)
}
