package daemon

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/drain"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// The machine of TestDecide's rows: a worker on release v1 in slot A,
// booted 10 minutes ago, whose Node is Ready with a heartbeat of now, its
// configuration applied, and its status written.
var (
	planNow  = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	planV1   = release.Target{Version: "2026.12.01-001", Digest: "sha256:" + strings.Repeat("1", 64)}
	planV2   = release.Target{Version: "2026.12.06-001", Digest: "sha256:" + strings.Repeat("2", 64)}
	planBoot = "boot-2"
)

func planFacts() *facts {
	c := &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Annotations: map[string]string{}},
		Spec: likenv1.ClusterSpec{
			Version: planV1.Version,
			Releases: likenv1.ReleasesSpec{Source: "https://releases.example", Catalog: []likenv1.CatalogEntry{
				{Version: planV1.Version, Digest: planV1.Digest}, {Version: planV2.Version, Digest: planV2.Digest},
			}},
			Settings: likenv1.SharedSettings{Sysctls: map[string]string{"vm.max_map_count": "262144"}},
		},
	}
	m := &likenv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m1", ResourceVersion: "7", Annotations: map[string]string{}},
		Spec:       likenv1.MachineSpec{Cluster: "c1", Role: likenv1.RoleWorker, RebootPolicy: likenv1.RebootAuto},
	}
	applied := changes.Desired(m, c)
	var t Timing
	t.defaults()
	f := &facts{
		Now: planNow, Timing: t, Machine: "m1",
		Boot: BootInfo{Slot: "A", BootID: planBoot, Version: planV1.Version, BootedAt: planNow.Add(-10 * time.Minute)},
		Mode: modeNormal, M: m, C: c, Node: planNode(corev1.ConditionTrue, planNow),
		St: &diskState{FormatVersion: stateFormat, BootID: planBoot, BootSeen: planNow.Add(-10 * time.Minute), Applied: &applied, NextBoot: &applied},
		Slots: []slots.Info{
			{Name: "A", State: likenv1.SlotActive, Version: planV1.Version, Digest: planV1.Digest},
			{Name: "B", State: likenv1.SlotEmpty},
		},
		Other: "B", StatusWrittenInBoot: true,
	}
	return f
}

func planNode(ready corev1.ConditionStatus, heartbeat time.Time) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "m1", Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			NodeInfo: corev1.NodeSystemInfo{BootID: planBoot},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
				LastHeartbeatTime: metav1.NewTime(heartbeat)}},
		},
	}
}

// settle decides until the action is other than the bookkeeping of a
// reconcile (a status write, the first sight of pending changes) or is
// the one named by keep, carrying that bookkeeping out as it goes.
func settle(f *facts, keep string) plan {
	for range 8 {
		p := decide(f)
		if p.Do != nil && keep != "" && strings.HasPrefix(p.Do.String(), keep) {
			return p
		}
		switch a := p.Do.(type) {
		case writeStatus:
			f.M = f.M.DeepCopy()
			f.M.Status = a.status
			f.StatusWrittenInBoot = true
		case savePendingSince:
			st := f.St.clone()
			st.PendingSince = a.since
			f.St = st
		default:
			return p
		}
	}
	panic("the reconcile never settles")
}

// staged stages v2 in slot B with the Cluster wanting it, and its pending
// change recorded.
func staged(f *facts) {
	f.C.Spec.Version = planV2.Version
	f.Slots[1] = slots.Info{Name: "B", State: likenv1.SlotStaged, Version: planV2.Version, Digest: planV2.Digest}
	since(f)
}

// since records the pending changes' first sight, as a reconcile does.
func since(f *facts) { settle(f, "") }

// granted lists the machine's pending change in the Cluster's ledger.
func granted(f *facts) string {
	v := decide(f).v
	reason := likenv1.TurnReboot
	switch {
	case v.liveTurn:
		reason = likenv1.TurnLive
	case v.staged:
		reason = likenv1.TurnRelease
	case v.k3sTurn:
		reason = likenv1.TurnRestartK3s
	}
	f.C.Status.RebootTurns = []likenv1.RebootTurn{{Machine: "m1", Reason: reason, Change: v.change}}
	return v.change
}

// failedLive declares a sysctl the machine cannot apply, grants its Live
// turn, and records the failed apply, retried at retryAt.
func failedLive(f *facts, retryAt time.Time) {
	f.C.Spec.Settings.Sysctls["net.no_such_parameter"] = "1"
	since(f)
	change := granted(f)
	inTurn, _ := changes.SplitLive(changes.Only(changes.Diff(*f.St.Applied, changes.Desired(f.M, f.C)), likenv1.ClassLive))
	f.Config = configFailure{Err: errors.New("live change of " + changes.FieldSysctls + ": no such kernel parameter"), RetryAt: retryAt, Backoff: time.Minute, Turn: change, Failed: inTurn}
}

// running is a reboot turn of v2 under way in this liken-node.
func running(f *facts) *turnRun {
	staged(f)
	change := granted(f)
	t := planV2
	r := &turnRun{Change: change, Release: &t, Slot: "B", From: f.C}
	f.Run = r
	st := f.St.clone()
	st.Turn = &turnRecord{Change: change, Release: &t, Slot: "B", BootID: planBoot, StartedAt: planNow}
	f.St = st
	return r
}

// k3sArgs declares new kubelet arguments, whose turn is granted.
func k3sArgs(f *facts) string {
	f.C.Spec.Settings.K3sArgs = []string{"--max-pods=150"}
	since(f)
	return granted(f)
}

// k3sTurn is a RestartK3s turn of this boot, restarted at restartedAt
// (zero: not yet).
func k3sTurn(f *facts, restartedAt time.Time) {
	change := k3sArgs(f)
	cfg := changes.Merge(*f.St.Applied, changes.Desired(f.M, f.C), likenv1.ClassRestartK3s)
	st := f.St.clone()
	st.Turn = &turnRecord{Change: change, K3s: &cfg, BootID: planBoot, StartedAt: planNow.Add(-time.Minute), RestartedAt: restartedAt}
	f.St = st
}

// trialBoot is a trial boot of v2 in slot B.
func trialBoot(f *facts) {
	f.C.Spec.Version = planV2.Version
	f.Mode = modeTrial
	f.Boot = BootInfo{Slot: "B", Trial: true, BootID: "boot-3", Version: planV2.Version, BootedAt: planNow.Add(-time.Minute)}
	f.Slots = []slots.Info{
		{Name: "A", State: likenv1.SlotActive, Version: planV1.Version, Digest: planV1.Digest},
		{Name: "B", State: likenv1.SlotStaged, Version: planV2.Version, Digest: planV2.Digest},
	}
	f.Other = "A"
	st := f.St.clone()
	st.BootID = "boot-3"
	st.Trial = &trialRecord{Slot: "B", Version: planV2.Version, Digest: planV2.Digest, Timeout: Duration(10 * time.Minute),
		ArmedAt: planNow.Add(-2 * time.Minute), ArmedBootID: planBoot, StartedAt: planNow.Add(-time.Minute)}
	f.St = st
	f.Node.Status.NodeInfo.BootID = "boot-3"
	f.StatusWrittenInBoot = false
}

func retrying(f *facts, key string) {
	f.Retry = map[string]time.Time{key: planNow.Add(time.Second)}
}

// TestDecide holds the plan's rules, one row each: the facts of a machine
// and the action decide takes next ("" for none: the machine waits).
// Rows end in a status write when they take nothing else.
func TestDecide(t *testing.T) {
	cases := []struct {
		name string
		edit func(f *facts)
		// want is the start of the action's description, "" for none.
		want string
		// check, when set, looks at the plan.
		check func(t *testing.T, f *facts, p plan)
	}{
		// What the machine knows of itself.
		{name: "a machine at rest takes nothing", edit: func(*facts) {},
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.After, 30*time.Second) }},
		{name: "a Machine that does not exist yet is waited for", edit: func(f *facts) { f.M = nil },
			check: func(t *testing.T, _ *facts, p plan) {
				assert.Equal(t, p.TrialWaitsFor, "the Machine m1 does not exist")
			}},
		{name: "a Cluster that does not exist yet is waited for", edit: func(f *facts) { f.C = nil },
			check: func(t *testing.T, _ *facts, p plan) {
				assert.Equal(t, p.TrialWaitsFor, "the Cluster c1 does not exist")
			}},
		{name: "a machine that is rebooting takes nothing", edit: func(f *facts) { f.Rebooting = true; f.St.Applied = nil }},
		{name: "events background work left are emitted first",
			edit: func(f *facts) { f.PendingEvents = []pendingEvent{{"Normal", ReasonReleaseStaged, "Stage", "staged"}} },
			want: "emit 1 events"},

		// The configuration.
		{name: "the first configuration is applied", edit: func(f *facts) { f.St.Applied = nil }, want: "apply the first configuration"},
		{name: "the first configuration waits for its backoff",
			edit: func(f *facts) {
				f.St.Applied = nil
				f.Config = configFailure{Err: errors.New("first configuration: disk full"), RetryAt: planNow.Add(5 * time.Second)}
			},
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.After, 5*time.Second) }},
		{name: "a Live change asks for a Live turn, whatever the reboot policy",
			edit: func(f *facts) {
				f.M.Spec.RebootPolicy = likenv1.RebootManual
				f.St.Applied.RebootPolicy = likenv1.RebootManual
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				since(f)
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineRebootPending)
				assert.Assert(t, st.Change != "")
				assert.DeepEqual(t, st.Pending, []likenv1.PendingChange{{Field: changes.FieldSysctls, Class: likenv1.ClassLive, Since: apiTime(planNow)}})
				assert.Equal(t, cond(st, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingTurn)
				assert.Check(t, is.Contains(cond(st, likenv1.ConditionRebootPending).Message, "no more than maxUnavailable"))
			}},
		{name: "a Live change is applied in its turn",
			edit: func(f *facts) { f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"; since(f); granted(f) },
			want: "apply live in the turn for change "},
		{name: "a Live turn granted for another change waits",
			edit: func(f *facts) {
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				since(f)
				granted(f)
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "20"
				since(f)
			}},
		{name: "a change of rebootPolicy takes effect at once, with no turn",
			edit: func(f *facts) { f.M.Spec.RebootPolicy = likenv1.RebootManual },
			want: "apply live " + changes.FieldRebootPolicy},
		{name: "a Live change goes before a Reboot change that waits", want: "apply live in the turn for change ",
			edit: func(f *facts) {
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				f.C.Spec.Settings.KernelArgs = []string{"mitigations=off"}
				nb := changes.Merge(*f.St.Applied, changes.Desired(f.M, f.C), likenv1.ClassNextBoot, likenv1.ClassReboot)
				st := f.St.clone()
				st.NextBoot = &nb
				f.St = st
				since(f)
				granted(f)
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineRebootPending)
				assert.Equal(t, len(st.Pending), 2)
			}},
		{name: "a Live change goes before a staged release", want: "apply live in the turn for change ",
			edit: func(f *facts) {
				staged(f)
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				since(f)
				granted(f)
			}},
		{name: "a Live change declared during a reboot turn waits for it", want: "read the ledger before the cordon",
			edit: func(f *facts) {
				running(f)
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Assert(t, !p.v.liveTurn)
				assert.Equal(t, p.v.change, f.Run.Change, "the turn under way would be given back")
				st := machineStatus(f, p.v)
				assert.Check(t, is.Contains(cond(st, likenv1.ConditionConfigApplied).Message, "once the turn under way ends"))
			}},
		{name: "Live changes ask before RestartK3s ones",
			edit: func(f *facts) {
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				f.C.Spec.Settings.K3sArgs = []string{"--max-pods=150"}
				since(f)
				granted(f)
			},
			want: "apply live in the turn for change "},
		{name: "a Live change waits while k3s restarts in its turn",
			edit: func(f *facts) {
				k3sTurn(f, planNow.Add(-time.Minute))
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				f.Node = planNode(corev1.ConditionFalse, planNow)
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, machineStatus(f, p.v).Phase, likenv1.MachineRebooting)
			}},
		{name: "a Reboot change is staged for the next boot", edit: func(f *facts) { f.C.Spec.Settings.KernelArgs = []string{"mitigations=off"} },
			want: "stage for the next boot " + changes.FieldKernelArgs},
		{name: "the configuration this boot did not apply is applied again",
			edit: func(f *facts) { f.BootErr = errors.New("applying the configuration at boot: mount failed") },
			want: "apply the configuration at boot again"},
		{name: "nothing is applied during a configuration backoff",
			edit: func(f *facts) {
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				f.Config = configFailure{Err: errors.New("live change: refused"), RetryAt: planNow.Add(time.Minute)}
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, cond(st, likenv1.ConditionConfigApplied).Reason, ReasonApplyFailed)
			}},
		{name: "a value that failed in its Live turn keeps the turn, Degraded",
			edit: func(f *facts) {
				failedLive(f, planNow.Add(time.Minute))
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, st.Change, f.Config.Turn, "the turn's change is reported, so the operator keeps the turn")
				assert.Equal(t, cond(st, likenv1.ConditionConfigApplied).Status, metav1.ConditionFalse)
			}},
		{name: "a value that failed in its Live turn is retried in the turn after its backoff",
			edit: func(f *facts) {
				failedLive(f, planNow.Add(-time.Second))
			},
			want: "forget the configuration failure: its backoff is over"},
		{name: "a value that failed in its Live turn, another Live value declared since: the failure holds",
			edit: func(f *facts) {
				failedLive(f, planNow.Add(-time.Second))
				f.C.Spec.Settings.NTPServers = []string{"ntp.example.com"}
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, st.Change, f.Config.Turn)
			}},
		{name: "a value that failed in its Live turn is forgotten at once when corrected",
			edit: func(f *facts) {
				failedLive(f, planNow.Add(time.Minute))
				delete(f.C.Spec.Settings.Sysctls, "net.no_such_parameter")
			},
			want: "forget the configuration failure: a value that failed in the Live turn was corrected"},
		{name: "a turn of another reason for the change applies nothing in place",
			edit: func(f *facts) {
				f.C.Spec.Settings.Sysctls["vm.swappiness"] = "10"
				since(f)
				granted(f)
				f.C.Status.RebootTurns[0].Reason = likenv1.TurnReboot
			}},
		{name: "a configuration failure is forgotten after its backoff when nothing is left to apply",
			edit: func(f *facts) {
				f.Config = configFailure{Err: errors.New("k3s restart: refused"), RetryAt: planNow.Add(-time.Second)}
			},
			want: "forget the configuration failure"},
		{name: "a failed restart of k3s is forgotten once the declared value changes",
			edit: func(f *facts) {
				f.St.K3sFailure = &k3sFailure{Change: "c0", K3s: *f.St.Applied}
				f.St.K3sFailure.K3s.Settings.K3sArgs = []string{"--bad"}
			},
			want: "forget the failed restart of k3s: the declared value changed"},
		{name: "a failed restart of k3s is forgotten once a person resumes the rollout",
			edit: func(f *facts) {
				f.C.Spec.Settings.K3sArgs = []string{"--bad"}
				f.St.K3sFailure = &k3sFailure{Change: "c0", K3s: changes.Desired(f.M, f.C), Resume: "r1"}
				f.C.Annotations[likenv1.AnnotationResumeRollout] = "r2"
			},
			want: "forget the failed restart of k3s: a person resumed the rollout"},
		{name: "a failed restart of k3s holds while the value is the same",
			edit: func(f *facts) {
				f.C.Spec.Settings.K3sArgs = []string{"--bad"}
				f.St.K3sFailure = &k3sFailure{Change: "c0", Fields: []string{changes.FieldK3sArgs}, K3s: changes.Desired(f.M, f.C)}
				since(f)
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, st.Change, "", "a Degraded machine asks for no turn")
				assert.Equal(t, cond(st, likenv1.ConditionConfigApplied).Reason, likenv1.ReasonK3sRestartFailed)
			}},

		// The release.
		{name: "a new version is downloaded into the other slot", edit: func(f *facts) { f.C.Spec.Version = planV2.Version },
			want: "download " + planV2.Version + " into slot B"},
		{name: "a version the catalog does not name is not downloaded, and says so",
			edit: func(f *facts) { f.C.Spec.Version = "2027.01.01-001" },
			check: func(t *testing.T, f *facts, p plan) {
				assert.Check(t, is.Contains(degraded(f, p.v), "is not in its releases.catalog"))
			}},
		{name: "a failed download waits for its retry",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.DownloadFailure = &downloadFailure{target: planV2, err: errors.New("digest mismatch"), attempts: 1, retryAt: planNow.Add(10 * time.Second), reported: true}
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, p.After, 10*time.Second)
				assert.Equal(t, cond(machineStatus(f, p.v), likenv1.ConditionReleaseVerified).Status, metav1.ConditionFalse)
			}},
		{name: "a failed download is reported once",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.DownloadFailure = &downloadFailure{target: planV2, err: errors.New("digest mismatch"), attempts: 1, retryAt: planNow.Add(10 * time.Second)}
			},
			want: "report the failed download"},
		{name: "a retarget stops the running download",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.Download = &downloadFacts{Target: release.Target{Version: "2026.12.05-001", Digest: "sha256:5"}, Slot: "B"}
			},
			want: "stop the download"},
		{name: "a download under way is left to run",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.Download = &downloadFacts{Target: planV2, Slot: "B", Done: 10, Total: 100}
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, machineStatus(f, p.v).Phase, likenv1.MachineDownloading)
			}},
		{name: "a staged release the Cluster no longer wants is withdrawn",
			edit: func(f *facts) {
				f.Slots[1] = slots.Info{Name: "B", State: likenv1.SlotStaged, Version: planV2.Version, Digest: planV2.Digest}
			},
			want: "withdraw slot B"},
		{name: "a failed trial holds its release back",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.St.TrialFailure = &trialFailure{Slot: "B", Version: planV2.Version, Digest: planV2.Digest, Reason: "the kernel panicked"}
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, cond(st, likenv1.ConditionTrialFailed).Status, metav1.ConditionTrue)
			}},
		{name: "a failed trial first seen takes the Cluster's resume value",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.C.Annotations[likenv1.AnnotationResumeRollout] = "r2"
				f.St.TrialFailure = &trialFailure{Slot: "B", Version: planV2.Version, Digest: planV2.Digest, Resume: "r1", ResumeUnseen: true}
			},
			want: "record the resume value of the failed trial"},
		{name: "a failed trial is forgotten once a person resumes the rollout",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.C.Annotations[likenv1.AnnotationResumeRollout] = "r2"
				f.St.TrialFailure = &trialFailure{Slot: "B", Version: planV2.Version, Digest: planV2.Digest, Resume: "r1"}
			},
			want: "forget the failed trial of " + planV2.Version},
		{name: "nothing is written into a slot during a trial boot",
			edit: func(f *facts) {
				trialBoot(f)
				f.C.Spec.Version = "2026.12.07-001"
				f.C.Spec.Releases.Catalog = append(f.C.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: "2026.12.07-001", Digest: "sha256:7"})
				f.StatusWrittenInBoot = true
				f.Node = planNode(corev1.ConditionFalse, planNow)
				f.Node.Status.NodeInfo.BootID = "boot-3"
			}},

		// The pending changes.
		{name: "when a pending change was first seen is recorded",
			edit: func(f *facts) { f.M.Annotations[likenv1.AnnotationRequestReboot] = "r1" },
			want: "record when the pending changes were first seen"},

		// A reboot turn.
		{name: "a staged release asks for a turn",
			edit: staged,
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineUpdatePending)
				assert.Assert(t, st.Change != "")
				assert.Equal(t, cond(st, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingTurn)
			}},
		{name: "the turn the ledger grants is taken", edit: func(f *facts) { staged(f); granted(f) }, want: "take the reboot turn for change "},
		{name: "a granted turn waits for approval under the Manual policy",
			edit: func(f *facts) {
				f.M.Spec.RebootPolicy = likenv1.RebootManual
				applied := changes.Desired(f.M, f.C)
				f.St.Applied, f.St.NextBoot = &applied, &applied
				staged(f)
				granted(f)
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, cond(machineStatus(f, p.v), likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingApproval)
			}},
		{name: "no turn starts from the cached Cluster the API server no longer grants",
			edit: func(f *facts) { staged(f); granted(f); f.StaleLedger = f.C }},
		{name: "a turn this boot started before liken-node restarted is resumed",
			edit: func(f *facts) { running(f); f.Run = nil }, want: "resume the reboot turn for change "},
		{name: "a turn this boot started that is no longer granted is dropped",
			edit: func(f *facts) { running(f); f.Run = nil; f.C.Status.RebootTurns = nil }, want: "drop the turn for change "},
		{name: "the ledger is read from the API server before the cordon", edit: func(f *facts) { running(f) }, want: "read the ledger before the cordon"},
		{name: "the node is cordoned", edit: func(f *facts) { running(f).LedgerRead = true }, want: "cordon"},
		{name: "a failed step waits for its retry",
			edit:  func(f *facts) { running(f).LedgerRead = true; retrying(f, retryTurnStep) },
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.After, time.Second) }},
		{name: "the node is drained", edit: func(f *facts) { r := running(f); r.LedgerRead, r.Cordoned = true, true }, want: "drain"},
		{name: "a drain under way is left to run, and a blocked one says so",
			edit: func(f *facts) {
				r := running(f)
				r.LedgerRead, r.Cordoned, r.Draining = true, true, true
				r.Blocked = &drain.Blocked{Pods: []string{"default/web-0"}, PDBs: []string{"default/web"}}
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineUpdating)
				assert.Equal(t, cond(st, likenv1.ConditionDrainBlocked).Status, metav1.ConditionTrue)
			}},
		{name: "the staged slot is re-checked after the drain",
			edit: func(f *facts) { r := running(f); r.LedgerRead, r.Cordoned, r.Drained = true, true, true },
			want: "re-check slot B"},
		{name: "a re-checked slot is armed for its trial and the machine reboots",
			edit: func(f *facts) {
				r := running(f)
				r.LedgerRead, r.Cordoned, r.Drained, r.Rechecked, r.TrialOK = true, true, true, true, true
			},
			want: "arm the trial and reboot"},
		{name: "a slot that fails its re-check reboots with no trial",
			edit: func(f *facts) {
				r := running(f)
				r.LedgerRead, r.Cordoned, r.Drained, r.Rechecked = true, true, true, true
			},
			want: "reboot"},
		{name: "a leader whose datastore would lose its majority holds its turn and says why",
			edit: func(f *facts) {
				f.Leader = true
				r := running(f)
				r.LedgerRead, r.Cordoned, r.Drained, r.Rechecked, r.TrialOK = true, true, true, true, true
				f.DownWaitingFor = "leader-2's member is not healthy"
				retrying(f, retryGoDown)
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, p.After, time.Second)
				assert.Check(t, is.Contains(cond(machineStatus(f, p.v), likenv1.ConditionReady).Message, "leader-2's member is not healthy"))
			}},
		{name: "a turn that left the ledger is given back",
			edit: func(f *facts) { running(f); f.C.Status.RebootTurns = nil },
			want: "give back the reboot turn: the turn left the Cluster's ledger"},
		{name: "a turn whose ledger entry names another change is given back",
			edit: func(f *facts) { running(f); f.C.Status.RebootTurns[0].Change = "other" },
			want: "give back the reboot turn: the ledger now names another change"},
		{name: "a turn whose release is no longer wanted is given back",
			edit: func(f *facts) {
				running(f)
				f.C.Spec.Version = planV1.Version
			},
			want: "give back the reboot turn: what is staged changed before the reboot"},

		// A RestartK3s turn.
		{name: "new kubelet arguments ask for a RestartK3s turn, and take it when granted",
			edit: func(f *facts) { k3sArgs(f) }, want: "take the RestartK3s turn for change "},
		{name: "k3s restarts in its turn", edit: func(f *facts) { k3sTurn(f, time.Time{}) }, want: "restart k3s for change "},
		{name: "a RestartK3s turn taken back before the restart asks again",
			edit: func(f *facts) { k3sTurn(f, time.Time{}); f.C.Status.RebootTurns = nil },
			want: "give back the RestartK3s turn for change "},
		{name: "a RestartK3s turn ends on a heartbeat after the restart",
			edit: func(f *facts) { k3sTurn(f, planNow.Add(-time.Minute)) },
			want: "end the RestartK3s turn for change "},
		{name: "a RestartK3s turn waits for a heartbeat after the restart",
			edit: func(f *facts) {
				k3sTurn(f, planNow.Add(-time.Minute))
				f.Node = planNode(corev1.ConditionTrue, planNow.Add(-2*time.Minute))
			},
			check: func(t *testing.T, f *facts, p plan) {
				assert.Equal(t, p.After, 2*time.Second)
				assert.Check(t, is.Contains(cond(machineStatus(f, p.v), likenv1.ConditionReady).Message, "is from before the restart of k3s"))
			}},
		{name: "a leader's RestartK3s turn waits for its control plane",
			edit: func(f *facts) {
				f.Leader = true
				k3sTurn(f, planNow.Add(-time.Minute))
				f.ControlPlaneErr = errors.New("etcd member is a learner")
			}},
		{name: "a restart of k3s whose node is not back in time is rolled back",
			edit: func(f *facts) {
				k3sTurn(f, planNow.Add(-likenv1.DefaultTrialTimeout))
				f.Node = planNode(corev1.ConditionFalse, planNow)
			},
			want: "roll back the restart of k3s for change "},
		{name: "a rolled-back restart of k3s waits for the node",
			edit: func(f *facts) {
				k3sTurn(f, planNow.Add(-likenv1.DefaultTrialTimeout))
				f.St.Turn.RolledBack = true
				f.St.K3sFailure = &k3sFailure{Change: f.St.Turn.Change, K3s: *f.St.Turn.K3s}
				f.Node = planNode(corev1.ConditionFalse, planNow)
			},
			check: func(t *testing.T, f *facts, p plan) {
				st := machineStatus(f, p.v)
				assert.Equal(t, st.Phase, likenv1.MachineDegraded)
				assert.Equal(t, st.Change, f.St.Turn.Change, "the turn is held until the node is back")
			}},

		// A cordon left behind.
		{name: "a cordon liken left behind is lifted",
			edit: func(f *facts) { f.Node.Annotations[likenv1.AnnotationCordoned] = "c0" }, want: "uncordon"},
		{name: "a cordon liken lifted already is not lifted again before the cache shows it",
			edit: func(f *facts) { f.Node.Annotations[likenv1.AnnotationCordoned] = "c0"; f.Uncordoned = f.Node }},
		{name: "a cordon someone else made is left alone",
			edit: func(f *facts) { f.Node.Spec.Unschedulable = true }},
		{name: "a cordon is kept while a turn's actors are stopping",
			edit: func(f *facts) { f.Node.Annotations[likenv1.AnnotationCordoned] = "c0"; f.ActorsStopping = 1 }},

		// A trial boot.
		{name: "a trial boot writes its status first, even with nothing new", edit: trialBoot, want: "write the status"},
		{name: "a trial boot Ready since the boot commits", edit: func(f *facts) { trialBoot(f); f.StatusWrittenInBoot = true },
			want: "commit the trial"},
		{name: "a trial boot whose Ready is from before the boot does not commit",
			edit: func(f *facts) {
				trialBoot(f)
				f.StatusWrittenInBoot = true
				f.Node = planNode(corev1.ConditionTrue, planNow.Add(-5*time.Minute))
				f.Node.Status.NodeInfo.BootID = "boot-3"
			},
			check: func(t *testing.T, _ *facts, p plan) {
				assert.Check(t, is.Contains(p.TrialWaitsFor, "is from before this boot"))
			}},
		{name: "a trial boot whose Node the kubelet of this boot has not posted does not commit",
			edit: func(f *facts) { trialBoot(f); f.StatusWrittenInBoot = true; f.Node.Status.NodeInfo.BootID = planBoot },
			check: func(t *testing.T, _ *facts, p plan) {
				assert.Check(t, is.Contains(p.TrialWaitsFor, "the kubelet of this boot has not posted the Node's status"))
			}},
		{name: "a leader's trial boot waits for its control plane",
			edit: func(f *facts) {
				trialBoot(f)
				f.Leader, f.StatusWrittenInBoot = true, true
				f.ControlPlaneErr = errors.New("the API server is not ready")
			},
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.TrialWaitsFor, "the API server is not ready") }},
		{name: "a trial boot that gave up commits nothing",
			edit: func(f *facts) { trialBoot(f); f.StatusWrittenInBoot = true; f.St.Trial.Failure = "timed out" }},

		// The status.
		{name: "download progress alone is written at most every Progress",
			edit: func(f *facts) {
				f.C.Spec.Version = planV2.Version
				f.Download = &downloadFacts{Target: planV2, Slot: "B", Done: 10, Total: 100}
				settle(f, "")
				f.Download.Done = 20
				f.LastProgressWrite = planNow.Add(-time.Second)
			},
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.After, time.Second) }},
		{name: "a status the API server stored otherwise is not written again on what it returned",
			edit: func(f *facts) {
				st, err := apiPrecision(machineStatus(f, settle(f, "").v))
				assert.NilError(t, err)
				f.LastSent, f.LastSentVersion = &st, f.M.ResourceVersion
				f.M.Status.Phase = ""
			}},
		{name: "a proven trial says it commits",
			edit: func(f *facts) { trialBoot(f); f.StatusWrittenInBoot = true }, want: "commit the trial",
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.TrialWaitsFor, "its slot is being committed") }},
		{name: "a status refused as a conflict waits for the cache",
			edit:  func(f *facts) { f.StatusRefusedAt = "7"; f.M.Status.Phase = "" },
			check: func(t *testing.T, _ *facts, p plan) { assert.Equal(t, p.After, 2*time.Second) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := planFacts()
			settle(f, "")
			tc.edit(f)
			p := settle(f, tc.want)
			got := ""
			if p.Do != nil {
				got = p.Do.String()
			}
			if tc.want == "" {
				assert.Equal(t, got, "")
			} else {
				assert.Assert(t, strings.HasPrefix(got, tc.want), "decided %q, want %q", got, tc.want)
			}
			if tc.check != nil {
				tc.check(t, f, p)
			}
		})
	}
}

func cond(st likenv1.MachineStatus, typ string) metav1.Condition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// TestLayerMatches: a machine says when its Machine's role or ports differ
// from the layer it was installed from (it boots with the layer's), and
// nothing when it has no layer document.
func TestLayerMatches(t *testing.T) {
	eth0 := []likenv1.Port{{Name: "eth0", Addresses: []string{"10.0.0.11/24"}}}
	for _, tc := range []struct {
		name   string
		layer  *likenv1.Machine
		edit   func(m *likenv1.Machine)
		status metav1.ConditionStatus
		msg    string
	}{
		{name: "no layer document", status: ""},
		{name: "no layer document any more: the earlier condition goes", status: "",
			edit: func(m *likenv1.Machine) {
				m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: likenv1.ConditionLayerMatches, Status: metav1.ConditionTrue, Reason: "SameAsLayer"})
			}},
		{name: "the same", layer: &likenv1.Machine{Spec: likenv1.MachineSpec{Role: likenv1.RoleWorker}}, status: metav1.ConditionTrue},
		{name: "an unset role is a Worker", layer: &likenv1.Machine{}, status: metav1.ConditionTrue},
		{name: "another role", layer: &likenv1.Machine{Spec: likenv1.MachineSpec{Role: likenv1.RoleLeader}}, status: metav1.ConditionFalse,
			msg: "the Machine differs from the layer this machine was installed from: spec.role is Worker, the layer's Leader. At every boot"},
		{name: "other ports", layer: &likenv1.Machine{Spec: likenv1.MachineSpec{Ports: eth0}},
			edit:   func(m *likenv1.Machine) { m.Spec.Ports = []likenv1.Port{{Name: "eth0", DHCP: true}} },
			status: metav1.ConditionFalse, msg: "spec.ports are eth0 (DHCP), the layer's eth0 (10.0.0.11/24)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := planFacts()
			f.Layer = tc.layer
			if tc.edit != nil {
				tc.edit(f.M)
			}
			p := decide(f)
			c := cond(machineStatus(f, p.v), likenv1.ConditionLayerMatches)
			assert.Equal(t, c.Status, tc.status)
			assert.Check(t, is.Contains(c.Message, tc.msg))
		})
	}
}
