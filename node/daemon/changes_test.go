package daemon_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/daemon/daemontest"
)

// classCase changes one declared field.
type classCase struct {
	field   string
	class   likenv1.DisruptionClass
	machine func(*likenv1.Machine)
	cluster func(*likenv1.Cluster)
}

var classCases = []classCase{
	{field: changes.FieldRole, class: likenv1.ClassReboot, machine: func(m *likenv1.Machine) { m.Spec.Role = likenv1.RoleLeader }},
	{field: changes.FieldRebootPolicy, class: likenv1.ClassLive, machine: func(m *likenv1.Machine) { m.Spec.RebootPolicy = likenv1.RebootManual }},
	{field: changes.FieldDisks, class: likenv1.ClassNextBoot, machine: func(m *likenv1.Machine) {
		m.Spec.Disks = []likenv1.Disk{{Device: "/dev/vdb", MountPoint: "/var/lib/data"}}
	}},
	{field: changes.FieldPorts, class: likenv1.ClassReboot, machine: func(m *likenv1.Machine) {
		m.Spec.Ports = []likenv1.Port{{Name: "eth1", Addresses: []string{"10.1.0.5/24"}}}
	}},
	{field: changes.FieldKernelModules, class: likenv1.ClassReboot, machine: func(m *likenv1.Machine) {
		m.Spec.KernelModules = []likenv1.KernelModule{{Name: "vfio_pci", Parameters: []string{"ids=10de:1db6"}}}
	}},
	{field: changes.FieldEndpoint, class: likenv1.ClassReboot, cluster: func(c *likenv1.Cluster) { c.Spec.Network.Endpoint = "https://10.0.0.20:6443" }},
	{field: changes.FieldPodCIDR, class: likenv1.ClassReboot, cluster: func(c *likenv1.Cluster) { c.Spec.Network.PodCIDR = "10.52.0.0/16" }},
	{field: changes.FieldServiceCIDR, class: likenv1.ClassReboot, cluster: func(c *likenv1.Cluster) { c.Spec.Network.ServiceCIDR = "10.53.0.0/16" }},
	{field: changes.FieldClusterDNS, class: likenv1.ClassReboot, cluster: func(c *likenv1.Cluster) { c.Spec.Network.ClusterDNS = "10.53.0.10" }},
	{field: changes.FieldDNSServers, class: likenv1.ClassLive, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.DNSServers = []string{"192.0.2.53"} }},
	{field: changes.FieldCABundle, class: likenv1.ClassLive, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.CABundle = testCA }},
	{field: changes.FieldNTPServers, class: likenv1.ClassLive, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.NTPServers = []string{"ntp.example.com"} }},
	{field: changes.FieldSysctls, class: likenv1.ClassLive, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.Sysctls["net.core.somaxconn"] = "4096" }},
	{field: changes.FieldRegistryMirrors, class: likenv1.ClassLive, cluster: func(c *likenv1.Cluster) {
		c.Spec.Settings.RegistryMirrors = []likenv1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example.com"}}}
	}},
	{field: changes.FieldK3sArgs, class: likenv1.ClassRestartK3s, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.K3sArgs = []string{"--kubelet-arg=max-pods=200"} }},
	{field: changes.FieldKernelArgs, class: likenv1.ClassReboot, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.KernelArgs = []string{"mitigations=off"} }},
	{field: changes.FieldBanner, class: likenv1.ClassNextBoot, cluster: func(c *likenv1.Cluster) { c.Spec.Settings.Banner = "welcome" }},
}

// testCA is a CA certificate in PEM, for the Cluster's caBundle.
var testCA = func() string {
	ca, err := pki.NewCA("a private CA", time.Now(), time.Hour)
	if err != nil {
		panic(err)
	}
	return string(ca.CertPEM())
}()

func (e *env) change(tc classCase) {
	e.t.Helper()
	if tc.machine != nil {
		e.editMachine(tc.machine)
	}
	if tc.cluster != nil {
		e.editCluster(tc.cluster)
	}
}

// recorded waits for the recorder to log op with field.
func (e *env) recorded(op, field string) changes.Record {
	e.t.Helper()
	var rec changes.Record
	poll.WaitOn(e.t, func(poll.LogT) poll.Result {
		for _, r := range e.m.Recorder.Records() {
			if r.Op == op && (field == "" || slices.Contains(r.Fields, field)) {
				rec = r
				return poll.Success()
			}
		}
		return poll.Continue("no %s of %s recorded", op, field)
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(5*time.Millisecond))
	return rec
}

// TestClassOfEveryFieldReachesTheMachine changes each declared field of a
// Ready machine and checks what the machine does: Live applies within
// seconds in a Live turn (rebootPolicy at once, with no turn),
// RestartK3s asks for a turn and restarts k3s in place in it
// (TestRestartK3sOnlyInTheTurn), NextBoot waits for the next boot and asks for no turn,
// Reboot is staged in status.pending and takes exactly one turn.
func TestClassOfEveryFieldReachesTheMachine(t *testing.T) {
	assert.Equal(t, len(classCases), len(changes.Fields), "every field of the class table has a case")
	for _, tc := range classCases {
		t.Run(tc.field, func(t *testing.T) {
			e := newEnv(t, likenv1.RebootAuto)
			r := e.start()
			e.waitPhase(likenv1.MachineReady)
			start := time.Now()
			e.change(tc)
			switch tc.class {
			case likenv1.ClassLive, likenv1.ClassRestartK3s:
				op, reason := changes.OpLive, likenv1.TurnLive
				if tc.class == likenv1.ClassRestartK3s {
					op, reason = changes.OpRestartK3s, likenv1.TurnRestartK3s
				}
				if tc.field != changes.FieldRebootPolicy {
					m := e.waitFor("asking for a turn", func(m *likenv1.Machine) bool { return m.Status.Change != "" })
					assert.Equal(t, e.restarts(), 0, "k3s restarts only in the turn")
					assert.Assert(t, !slices.ContainsFunc(e.m.Recorder.Records(), func(r changes.Record) bool { return r.Op == op && slices.Contains(r.Fields, tc.field) }),
						"%s applied before its turn", tc.field)
					assert.Equal(t, cond(m, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingTurn)
					assert.Equal(t, m.Status.Phase, likenv1.MachineRebootPending)
					assert.DeepEqual(t, m.Status.Pending[0].Class, tc.class)
					e.grantInPlace(reason)
					e.recorded(op, tc.field)
					if tc.class == likenv1.ClassRestartK3s {
						e.kubeletBack()
					}
				}
				e.recorded(op, tc.field)
				took := time.Since(start)
				assert.Assert(t, took < 5*time.Second, "a %s change took %s", tc.class, took)
				t.Logf("%s applied in %s", tc.field, took.Round(time.Millisecond))
				m := e.waitFor("the change reported", func(m *likenv1.Machine) bool {
					return m.Status.ObservedGeneration == m.Generation && m.Status.Phase == likenv1.MachineReady
				})
				assert.Equal(t, m.Status.Change, "")
				assert.Assert(t, is.Len(m.Status.Pending, 0))
			case likenv1.ClassNextBoot:
				e.recorded(changes.OpStageBoot, tc.field)
				m := e.waitFor("waiting for the next boot", func(m *likenv1.Machine) bool {
					return cond(m, likenv1.ConditionConfigApplied).Reason == "WaitingForNextBoot"
				})
				assert.Equal(t, m.Status.Phase, likenv1.MachineReady)
				assert.Equal(t, m.Status.Change, "", "a NextBoot change asks for no turn")
				// A power cycle (not a turn) applies it.
				assert.NilError(t, r.Stop())
				r = e.start()
				e.waitFor("applied at boot", func(m *likenv1.Machine) bool {
					return m.Status.Observed.BootID == r.Boot.BootID && cond(m, likenv1.ConditionConfigApplied).Reason == "Applied"
				})
				boots := e.m.Recorder.Count(changes.OpBoot)
				assert.Equal(t, boots, 2)
			case likenv1.ClassReboot:
				m := e.waitPhase(likenv1.MachineRebootPending)
				assert.Equal(t, len(m.Status.Pending), 1)
				assert.Equal(t, m.Status.Pending[0].Field, tc.field)
				assert.Equal(t, m.Status.Pending[0].Class, likenv1.ClassReboot)
				assert.Assert(t, m.Status.Change != "")
				assert.Equal(t, cond(m, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingTurn)
				e.grant()
				waitExit(t, r)
				r = e.start()
				m = e.waitFor("Ready after the reboot", func(m *likenv1.Machine) bool {
					return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
				})
				assert.Equal(t, m.Status.Change, "", "nothing left to ask a turn for")
				assert.Equal(t, e.m.Boots(), 2, "exactly one reboot")
				e.revoke() // cluster-operator ends the turn
				e.waitFor("still Ready", func(m *likenv1.Machine) bool { return m.Status.Phase == likenv1.MachineReady })
			}
			if tc.class != likenv1.ClassNextBoot && tc.class != likenv1.ClassReboot {
				assert.Equal(t, e.m.Boots(), 1, "no reboot")
				exited, _ := r.Exited()
				assert.Assert(t, !exited)
			}
		})
	}
}

// TestManualApprovalCoversOnlyItsChange: an approval names one change; a
// newer change needs a new approval, and a granted turn is not taken
// without it.
func TestManualApprovalCoversOnlyItsChange(t *testing.T) {
	e := newEnv(t, likenv1.RebootManual)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	e.editMachine(func(m *likenv1.Machine) {
		m.Spec.KernelModules = []likenv1.KernelModule{{Name: "vfio_pci"}}
	})
	m := e.waitPhase(likenv1.MachineRebootPending)
	first := m.Status.Change
	assert.Equal(t, cond(m, likenv1.ConditionRebootPending).Reason, likenv1.ReasonAwaitingApproval)
	e.editMachine(func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationApprovedChange] = first })
	e.waitFor("approved", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionRebootPending).Reason == likenv1.ReasonAwaitingTurn
	})

	// A newer change makes the approval stale.
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.KernelArgs = []string{"quiet"} })
	m = e.waitFor("a new change", func(m *likenv1.Machine) bool {
		return m.Status.Change != "" && m.Status.Change != first
	})
	second := m.Status.Change
	m = e.waitFor("awaiting approval again", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionRebootPending).Reason == likenv1.ReasonAwaitingApproval
	})
	assert.Assert(t, is.Contains(cond(m, likenv1.ConditionRebootPending).Message, "liken approve-reboot c1 m1"))
	assert.Equal(t, len(m.Status.Pending), 2)

	// Even a granted turn is not taken without the approval of this change.
	e.grantChange(second)
	e.waitFor("the machine saw the grant", func(m *likenv1.Machine) bool {
		return is.Contains(cond(m, likenv1.ConditionRebootPending).Message, "ledger lists a turn")().Success()
	})
	assert.Assert(t, !e.node().Spec.Unschedulable, "no cordon without approval")
	assert.Equal(t, e.m.Boots(), 1)

	e.editMachine(func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationApprovedChange] = second })
	waitExit(t, r)
	assert.Equal(t, e.node().Annotations[likenv1.AnnotationCordoned], second)
}

// TestRequestReboot: a new value of liken.sh/request-reboot takes one
// turn, one cordon, one drain and one reboot.
func TestRequestReboot(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.addPod("web", false)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	e.editMachine(func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationRequestReboot] = "2026-11-30T10:00:00Z" })
	m := e.waitPhase(likenv1.MachineRebootPending)
	assert.Equal(t, m.Status.Pending[0].Field, changes.FieldRebootRequest)
	e.grant()
	waitExit(t, r)
	assert.DeepEqual(t, e.evictions(), []string{"web"})
	r = e.start()
	m = e.waitFor("Ready after the requested reboot", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(t, m.Status.ObservedRebootRequest, "2026-11-30T10:00:00Z")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if e.node().Spec.Unschedulable {
			return poll.Continue("still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(10*time.Millisecond))
}

// TestDrainBlockedThenTurnTakenBack: a PodDisruptionBudget that allows no
// disruption blocks the drain past its timeout (condition and event name
// pod and budget); when the turn is taken back the machine uncordons and
// waits again, without rebooting.
func TestDrainBlockedThenTurnTakenBack(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.addPod("db", false)
	_, err := e.kube.PolicyV1().PodDisruptionBudgets("app").Create(context.Background(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db-pdb", Namespace: "app"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: &intstr.IntOrString{Type: intstr.Int, IntVal: 0},
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	e.setRefuse("db", true)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	e.editMachine(func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationRequestReboot] = "1" })
	e.waitPhase(likenv1.MachineRebootPending)
	change := e.grant()
	m := e.waitFor("DrainBlocked", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionDrainBlocked).Status == metav1.ConditionTrue
	})
	assert.Equal(t, m.Status.Phase, likenv1.MachineRebooting)
	msg := cond(m, likenv1.ConditionDrainBlocked).Message
	assert.Assert(t, is.Contains(msg, "app/db"))
	assert.Assert(t, is.Contains(msg, "app/db-pdb"))
	e.waitEvent(daemon.ReasonDrainBlocked, "app/db-pdb")
	assert.Equal(t, e.node().Annotations[likenv1.AnnotationCordoned], change)

	// A restart of the daemon mid-drain resumes the turn.
	assert.NilError(t, r.Stop())
	r = e.m.StartIn(t, e.options(), r.Boot)
	e.waitEvent(daemon.ReasonTurnResumed, change)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n := 0
		for _, ev := range e.events() {
			if strings.HasPrefix(ev, daemon.ReasonDrainBlocked+": ") {
				n++
			}
		}
		if n >= 2 {
			return poll.Success()
		}
		return poll.Continue("the resumed drain has not reported DrainBlocked yet")
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	e.waitFor("still Rebooting and DrainBlocked", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebooting && cond(m, likenv1.ConditionDrainBlocked).Status == metav1.ConditionTrue
	})

	e.revoke()
	m = e.waitFor("turn given back", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && cond(m, likenv1.ConditionDrainBlocked).Status == metav1.ConditionFalse
	})
	assert.Equal(t, m.Status.Change, change, "the same change still waits")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := e.node(); n.Spec.Unschedulable || n.Annotations[likenv1.AnnotationCordoned] != "" {
			return poll.Continue("still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(10*time.Millisecond))
	e.waitEvent(daemon.ReasonTurnTakenBack, change)
	exited, _ := r.Exited()
	assert.Assert(t, !exited, "no reboot")
	assert.Equal(t, e.m.Boots(), 1)

	// Granted again and unblocked: one reboot.
	e.setRefuse("db", false)
	e.grant()
	waitExit(t, r)
}

var _ = daemontest.NewChannel

// liveRefuses records every call, and refuses a Live apply whose sysctls
// name net.refused, as a kernel without the parameter does.
type liveRefuses struct{ *changes.Recorder }

func (a liveRefuses) ApplyLive(ctx context.Context, cfg changes.Config, changed []changes.Change) error {
	err := a.Recorder.ApplyLive(ctx, cfg, changed)
	if _, bad := cfg.Settings.Sysctls["net.refused"]; bad {
		return errors.New("sysctl net.refused: this machine's kernel has no such parameter")
	}
	return err
}

// TestALiveValueThatFailsKeepsItsTurn: a Live value the machine cannot
// apply in its turn is undone, the machine reads Degraded and keeps
// reporting the turn's change (so cluster-operator keeps the turn and
// grants the value to no other machine); corrected, the failure is
// forgotten at once and the machine asks for the new value.
func TestALiveValueThatFailsKeepsItsTurn(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	o := e.options()
	o.Applier = liveRefuses{e.m.Recorder}
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.Sysctls["net.refused"] = "1" })
	e.waitFor("asking for a Live turn", func(m *likenv1.Machine) bool { return m.Status.Change != "" })
	turn := e.grantInPlace(likenv1.TurnLive)
	m := e.waitPhase(likenv1.MachineDegraded)
	assert.Equal(t, m.Status.Change, turn, "the failed machine no longer names its turn's change")
	assert.Check(t, is.Contains(cond(m, likenv1.ConditionConfigApplied).Message, "net.refused"))
	var lives []changes.Record
	for _, r := range e.m.Recorder.Records() {
		if r.Op == changes.OpLive {
			lives = append(lives, r)
		}
	}
	assert.Assert(t, len(lives) >= 2, "no apply and undo: %+v", lives)
	assert.Equal(t, lives[0].Config.Settings.Sysctls["net.refused"], "1")
	_, undone := lives[1].Config.Settings.Sysctls["net.refused"]
	assert.Assert(t, !undone, "the failed apply was not undone with the values in effect")

	e.editCluster(func(c *likenv1.Cluster) {
		delete(c.Spec.Settings.Sysctls, "net.refused")
		c.Spec.Settings.Sysctls["net.core.somaxconn"] = "4096"
	})
	m = e.waitFor("asking for the corrected value", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != "" && m.Status.Change != turn
	})
	assert.Equal(t, cond(m, likenv1.ConditionConfigApplied).Status, metav1.ConditionTrue)
	e.grantInPlace(likenv1.TurnLive)
	e.recorded(changes.OpLive, changes.FieldSysctls)
	e.waitFor("the corrected value applied", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Change == ""
	})
}

// TestKernelArgsOnlyInTheTurn: staged kernel arguments reach the boot
// loader only in the machine's turn, right before its reboot. A power
// cycle before the turn boots with the arguments in effect and leaves the
// change pending; a turn taken back after the write (its reboot refused)
// puts the arguments in effect back; the turn's reboot boots with them,
// and nothing is left pending.
func TestKernelArgsOnlyInTheTurn(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	bl := boot.NewGRUB(e.m.BootDir)
	bootArgs := func() []string {
		t.Helper()
		args, err := bl.KernelArgs()
		assert.NilError(t, err)
		return args
	}
	want := []string{"quiet"}
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Settings.KernelArgs = want })
	askingTurn := func(what string, r *daemontest.Running) {
		t.Helper()
		m := e.waitFor(what, func(m *likenv1.Machine) bool {
			return m.Status.Observed.BootID == r.Boot.BootID && m.Status.Change != "" && m.Status.Phase == likenv1.MachineRebootPending
		})
		assert.Equal(t, len(m.Status.Pending), 1)
		assert.Equal(t, m.Status.Pending[0].Field, changes.FieldKernelArgs)
		assert.Equal(t, len(bootArgs()), 0, "the kernel arguments were written before the turn's reboot")
	}
	askingTurn("staged, asking for a turn", r)

	// A power cycle that is not the turn: the arguments wait for it.
	assert.NilError(t, r.Stop())
	r = e.start()
	askingTurn("asking for the turn again after a power cycle", r)

	// A turn whose reboot is refused, then taken back: the arguments in
	// effect are put back.
	assert.NilError(t, r.Stop())
	o := e.options()
	o.Rebooter = refusingRebooter{}
	r = e.m.Start(t, o)
	askingTurn("asking for the turn on a machine that cannot reboot", r)
	e.grant()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := bootArgs(); !slices.Equal(got, want) {
			return poll.Continue("the boot loader holds %q", got)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	e.revoke()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := bootArgs(); len(got) != 0 {
			return poll.Continue("the boot loader holds %q", got)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))

	// The turn's reboot boots with them.
	assert.NilError(t, r.Stop())
	r = e.start()
	askingTurn("asking for the turn again", r)
	e.grant()
	waitExit(t, r)
	assert.DeepEqual(t, bootArgs(), want)
	r = e.start()
	m := e.waitFor("Ready after the turn's reboot", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(t, m.Status.Change, "", "nothing left to ask a turn for")
	assert.Assert(t, is.Len(m.Status.Pending, 0))
	e.revoke()
}
