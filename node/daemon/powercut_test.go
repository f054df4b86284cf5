package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/watchdog"
)

// Power can fail between any two writes: each test leaves the disk as a
// cut after one write of a step leaves it, and powers the machine on.

// TestCommitInterruptedAfterTheBootLoader: the trial boot's commit wrote
// the boot loader (slot B proven) and the power failed before the slot
// store and the daemon state said so. The next boot, of B, finishes the
// commit instead of marking the running slot Failed (which would refuse
// every later download) and reporting a failed trial.
func TestCommitInterruptedAfterTheBootLoader(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	bi, err := e.m.PowerOn()
	assert.NilError(t, err)
	assert.Assert(t, bi.Trial)
	assert.NilError(t, boot.NewGRUB(e.m.BootDir).Commit(boot.SlotB))
	// The power fails here.

	e.finishedCommitOfB()

	// The store takes the next release into A again.
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v3 })
	m := e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v3)
}

// finishedCommitOfB starts the next boot, of slot B, after a trial of B
// whose commit stopped after the boot loader's write, and checks that the
// boot finishes the commit: v2 Ready, A Previous, B Active, no failed
// trial.
func (e *env) finishedCommitOfB() {
	e.t.Helper()
	r := e.start()
	assert.Assert(e.t, !r.Boot.Trial)
	assert.Equal(e.t, r.Boot.Slot, boot.SlotB)
	m := e.waitFor("Ready on v2 from the new boot", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(e.t, m.Status.Version, v2)
	assert.Equal(e.t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionFalse)
	assert.DeepEqual(e.t, slotStates(m), map[string]likenv1.SlotState{"A": likenv1.SlotPrevious, "B": likenv1.SlotActive})
	e.waitEvent(daemon.ReasonTrialSucceeded, "finished the commit")
}

// TestTrialTimerAfterAFailedCommitWrite: the trial boot's commit wrote the
// boot loader (slot B proven), then the slot store's or the daemon
// state's write failed until the trial timer fired and rebooted. The next
// boot, of B, finishes the commit instead of marking the running slot
// Failed and reporting a failed trial.
func TestTrialTimerAfterAFailedCommitWrite(t *testing.T) {
	for _, file := range []string{"state/slots.json", daemon.StateFile} {
		t.Run(file, func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
			r := e.start()
			e.waitPhase(likenv1.MachineUpdatePending)
			e.grant()
			waitExit(t, r)

			e.mu.Lock()
			e.kubeletDown = true // no commit before the write fails
			e.mu.Unlock()
			o := e.options()
			clk := clocktesting.NewFakeClock(time.Now())
			o.Clock = clk
			r = e.m.Start(t, o)
			assert.Assert(t, r.Boot.Trial)
			e.waitFor("the trial boot's status", func(m *likenv1.Machine) bool {
				return m.Status.Observed.BootID == r.Boot.BootID
			})
			// A folder in the file's place: its writes fail until it goes.
			p := filepath.Join(e.m.Root, file)
			assert.NilError(t, os.Rename(p, p+".saved"))
			assert.NilError(t, os.Mkdir(p, 0o755))
			e.setNodeReady(true)
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if st, err := boot.NewGRUB(e.m.BootDir).State(); err != nil || st.Proven != boot.SlotB {
					return poll.Continue("the boot loader's commit: %v %v", st, err)
				}
				return poll.Success()
			}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
			stepUntilReboot(t, clk, r, e.cluster().Spec.Disruption.TrialTimeoutOrDefault()+time.Second)
			assert.NilError(t, os.Remove(p))
			assert.NilError(t, os.Rename(p+".saved", p))
			if file != daemon.StateFile {
				b, err := os.ReadFile(filepath.Join(e.m.Root, daemon.StateFile))
				assert.NilError(t, err)
				assert.Assert(t, strings.Contains(string(b), "within the trial timeout"), "the trial timer did not end the boot: %s", b)
			}

			e.finishedCommitOfB()
		})
	}
}

// TestTrialRecordArmsTheInitsWatchdog: the trial record the turn writes
// before the reboot is what the trial boot's init reads to arm its
// watchdog (node/watchdog.ForTrial): the Cluster's trialTimeout, counted
// from the arming, not the init's fixed first timeout.
func TestTrialRecordArmsTheInitsWatchdog(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) {
		c.Spec.Version = v2
		c.Spec.Disruption.TrialTimeout = &metav1.Duration{Duration: 7 * time.Minute}
	})
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	b, err := os.ReadFile(filepath.Join(e.m.Root, daemon.StateFile))
	assert.NilError(t, err)
	timeout, why := watchdog.ForTrial(b, time.Now())
	assert.Assert(t, timeout > 6*time.Minute+50*time.Second && timeout <= 7*time.Minute, "%s (%s)", timeout, why)
	assert.Equal(t, why, "what is left of the trial timeout of 7m0s")
}

// TestPowerCutBetweenTrialRecordAndFlag: the turn wrote its trial record
// and the power failed while the flag was written (only the backup copy of
// the boot state armed). No trial boot happened: the next boot reports no
// failed trial, withdraws the half-written flag from both copies, and asks
// for its turn again.
func TestPowerCutBetweenTrialRecordAndFlag(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	m := e.waitPhase(likenv1.MachineUpdatePending)
	change := m.Status.Change
	assert.NilError(t, r.Stop())

	// The state the turn leaves right after its trial record.
	p := filepath.Join(e.m.Root, daemon.StateFile)
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	var st map[string]any
	assert.NilError(t, json.Unmarshal(b, &st))
	now := time.Now().UTC().Format(time.RFC3339)
	st["turn"] = map[string]any{"change": change, "slot": "B", "bootID": r.Boot.BootID, "startedAt": now,
		"release": map[string]any{"version": v2, "digest": e.digest[v2]}}
	st["trial"] = map[string]any{"slot": "B", "version": v2, "digest": e.digest[v2], "timeout": "3s",
		"armedAt": now, "armedBootID": r.Boot.BootID, "arming": true}
	b, err = json.Marshal(st)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(p, b, 0o644))
	// ArmTrial writes the backup copy first; the primary was not written.
	armed, err := boot.Encode(boot.State{Proven: boot.SlotA, Trial: boot.SlotB}, nil)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(e.m.BootDir, boot.BackupFile), armed, 0o644))

	r = e.start()
	assert.Assert(t, !r.Boot.Trial)
	m = e.waitFor("asking for the turn again from the new boot", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdatePending && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionFalse)
	assert.Equal(t, slotStates(m)["B"], likenv1.SlotStaged)
	g := boot.NewGRUB(e.m.BootDir)
	assert.NilError(t, g.Check(), "both copies repaired")
	bak, err := os.ReadFile(filepath.Join(e.m.BootDir, boot.BackupFile))
	assert.NilError(t, err)
	got, err := boot.Decode(bak)
	assert.NilError(t, err)
	assert.Equal(t, got, boot.State{Proven: boot.SlotA}, "the backup copy no longer arms a trial")
}

// TestLeftoverTrialFlagIsWithdrawnBeforeDownload: a trial flag left armed
// (a boot loader that could not clear it) is withdrawn, in both copies,
// before a byte of the next release goes into the inactive slot: a power
// cut in the middle of the download must not trial-boot half a release.
func TestLeftoverTrialFlagIsWithdrawnBeforeDownload(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.ch.SetDelay(time.Hour) // the download stays under way
	bi, err := e.m.PowerOn()
	assert.NilError(t, err)
	assert.Assert(t, !bi.Trial)
	// The flag the firmware could not clear, and a damaged primary copy.
	g := boot.NewGRUB(e.m.BootDir)
	assert.NilError(t, g.ArmTrial(boot.SlotB))
	assert.NilError(t, os.WriteFile(filepath.Join(e.m.BootDir, boot.EnvFile), []byte("garbage"), 0o644))
	e.m.StartIn(t, e.options(), bi)
	e.waitPhase(likenv1.MachineReady)

	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitFor("slot B downloading", func(m *likenv1.Machine) bool {
		return slotStates(m)["B"] == likenv1.SlotDownloading
	})
	st, err := g.State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA})
	assert.NilError(t, g.Check())
}

// TestTrialNeedsReadyFromThisBoot: the new release's kubelet never starts,
// while the Node still reads Ready from the boot before (Kubernetes keeps
// a silent Node Ready for a while). The trial must not commit on that
// Ready: it times out and the machine returns to its proven slot.
func TestTrialNeedsReadyFromThisBoot(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.mu.Lock()
	e.kubeletDown = true // the Node keeps its Ready of this boot
	e.mu.Unlock()
	e.grant()
	waitExit(t, r)

	// The trial saw the Ready and said why it does not commit on it.
	e.trialTimesOutAfter("the trial to refuse the Ready of the boot before", func(m *likenv1.Machine) bool {
		return strings.Contains(cond(m, likenv1.ConditionReady).Message, "not committed yet, because the kubelet of this boot has not posted the Node's status")
	})
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA}, "the trial committed on a stale Ready")

	r = e.start()
	assert.Equal(t, r.Boot.Slot, boot.SlotA)
	m := e.waitPhase(likenv1.MachineDegraded)
	assert.Assert(t, strings.Contains(cond(m, likenv1.ConditionTrialFailed).Message, "the kubelet of this boot has not posted"))
}

// TestTrialWatchdog: the watchdog the init armed is fed during the trial
// and disarmed only when the trial commits; a trial that gives up leaves
// it armed.
func TestTrialWatchdog(t *testing.T) {
	for _, commits := range []bool{true, false} {
		t.Run(fmt.Sprintf("commits=%v", commits), func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			e.editCluster(func(c *likenv1.Cluster) {
				c.Spec.Version = v2
				c.Spec.Disruption.TrialTimeout = &metav1.Duration{Duration: time.Second}
			})
			r := e.start()
			e.waitPhase(likenv1.MachineUpdatePending)
			if !commits {
				e.setNodeReady(false)
			}
			e.grant()
			waitExit(t, r)

			wd := &watchdog.Fake{}
			o := e.options()
			o.Watchdog = wd
			o.Timing.WatchdogFeed = 20 * time.Millisecond
			if !commits {
				// The trial never commits: it must be fed until it gives up.
				r = e.m.Start(t, o)
				assert.Assert(t, r.Boot.Trial)
				waitExit(t, r)
				fed, disarmed := wd.State()
				assert.Assert(t, fed >= 10, "fed %d times in a 1 s trial", fed)
				assert.Assert(t, !disarmed, "a trial that failed disarmed the watchdog")
				return
			}
			r = e.m.Start(t, o)
			assert.Assert(t, r.Boot.Trial)
			e.waitFor("Ready on v2", func(m *likenv1.Machine) bool {
				return m.Status.Phase == likenv1.MachineReady && m.Status.Version == v2
			})
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if fed, disarmed := wd.State(); fed > 0 && disarmed {
					return poll.Success()
				}
				return poll.Continue("watchdog not fed and disarmed")
			}, poll.WithTimeout(5*time.Second), poll.WithDelay(10*time.Millisecond))
		})
	}
}

// TestTrialBootCannotReadTheBootState: a trial boot whose boot state
// cannot be read stops with an error (which StartFailed turns into a
// reboot into the proven slot) instead of running on, confused, on the
// unproven slot.
func TestTrialBootCannotReadTheBootState(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	bi, err := e.m.PowerOn()
	assert.NilError(t, err)
	assert.Assert(t, bi.Trial)
	env := filepath.Join(e.m.BootDir, boot.EnvFile)
	assert.NilError(t, os.Remove(env))
	assert.NilError(t, os.Mkdir(env, 0o755)) // reading it fails
	r = e.m.StartIn(t, e.options(), bi)
	err = r.Wait()
	assert.ErrorContains(t, err, "reading the boot state in a trial boot")
	rb := &rebootRecorder{}
	assert.ErrorIs(t, daemon.StartFailed(context.Background(), bi, rb, err), daemon.ErrRebooted)
	assert.Equal(t, rb.n, 1)
}

type rebootRecorder struct{ n int }

func (r *rebootRecorder) Reboot(context.Context) error {
	r.n++
	return daemon.ErrRebooted
}

// TestTrialEndsWhileItsReconcileHangs: a trial boot whose reconcile hangs
// (here a change of rebootPolicy whose apply never returns) is still ended at its
// deadline: the trial timer takes no lock the reconcile holds. When the
// reboot then fails too, the watchdog is no longer fed once the deadline
// passed, so it resets the machine into the proven slot.
func TestTrialEndsWhileItsReconcileHangs(t *testing.T) {
	for _, rebootFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("reboot fails=%t", rebootFails), func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			e.editCluster(func(c *likenv1.Cluster) {
				c.Spec.Version = v2
				c.Spec.Disruption.TrialTimeout = &metav1.Duration{Duration: time.Second}
			})
			r := e.start()
			e.waitPhase(likenv1.MachineUpdatePending)
			e.setNodeReady(false)
			e.grant()
			waitExit(t, r)

			// The trial boot applies a change that needs no turn at once
			// (rebootPolicy), and the apply hangs.
			e.editMachine(func(m *likenv1.Machine) { m.Spec.RebootPolicy = likenv1.RebootManual })
			hung := make(chan struct{})
			wd := &watchdog.Fake{}
			o := e.options()
			o.Applier = &liveHangs{Recorder: e.m.Recorder, hung: hung}
			o.Watchdog = wd
			o.Timing.WatchdogFeed = 20 * time.Millisecond
			if rebootFails {
				o.Rebooter = refusingRebooter{}
			}
			r = e.m.Start(t, o)
			assert.Assert(t, r.Boot.Trial)
			<-hung
			deadline := time.Now().Add(time.Second)
			if !rebootFails {
				assert.ErrorIs(t, r.Wait(), daemon.ErrRebooted)
				_, disarmed := wd.State()
				assert.Assert(t, !disarmed, "a trial that did not commit disarmed the watchdog")
				return
			}
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				fed, disarmed := wd.State()
				assert.Assert(t, !disarmed, "a trial that did not commit disarmed the watchdog")
				if last := wd.LastKeepalive(); fed > 0 && time.Now().After(deadline) && time.Since(last) > 10*o.Timing.WatchdogFeed {
					return poll.Success()
				}
				return poll.Continue("the watchdog is still fed (%d times)", fed)
			}, poll.WithTimeout(5*time.Second), poll.WithDelay(20*time.Millisecond))
		})
	}
}

// refusingRebooter is a machine whose reboot fails.
type refusingRebooter struct{}

func (refusingRebooter) Reboot(context.Context) error { return errors.New("the reboot was refused") }

// liveHangs is the machine's Recorder whose ApplyLive hangs until its
// context ends, closing hung when it starts.
type liveHangs struct {
	*changes.Recorder
	hung chan struct{}
	once sync.Once
}

func (a *liveHangs) ApplyLive(ctx context.Context, _ changes.Config, _ []changes.Change) error {
	a.once.Do(func() { close(a.hung) })
	<-ctx.Done()
	return ctx.Err()
}
