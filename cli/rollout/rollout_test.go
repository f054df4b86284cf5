package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"gotest.tools/v3/poll"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/controllers/turns"
	"liken.sh/liken/generated/clientset/versioned/fake"
)

// rolloutSteps is a scripted rollout of three machines from Version1 to
// Version2: each step changes the fleet the way machines and
// cluster-operator would.
func rolloutSteps() (*v1alpha1.Cluster, []*v1alpha1.Machine, []func()) {
	cl := clitest.Cluster("lab", "1")
	cl.Generation, cl.Status.ObservedGeneration = 2, 2
	cl.Status.Phase = v1alpha1.ClusterUpdating
	var ms []*v1alpha1.Machine
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		role := v1alpha1.RoleWorker
		if n == "node-1" {
			role = v1alpha1.RoleLeader
		}
		m := clitest.Machine(n, "lab", role, v1alpha1.RebootAuto)
		clitest.SetReady(m, clitest.Version1)
		ms = append(ms, m)
	}
	download := func(m *v1alpha1.Machine, done int64) {
		m.Status.Phase = v1alpha1.MachineDownloading
		m.Status.Download = &v1alpha1.DownloadProgress{Version: clitest.Version2, BytesDone: done, BytesTotal: 300 << 20}
	}
	stage := func(m *v1alpha1.Machine) { clitest.SetStaged(m, clitest.Version1, clitest.Version2, "c-"+m.Name) }
	turn := func(m *v1alpha1.Machine) {
		m.Status.Phase = v1alpha1.MachineUpdating
		cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: m.Name, Reason: v1alpha1.TurnRelease, GrantedAt: clitest.Since}}
	}
	done := func(m *v1alpha1.Machine) {
		clitest.SetReady(m, clitest.Version2)
		m.Status.Slot = "B"
		cl.Status.RebootTurns = nil
	}
	// says sets cluster-operator's word, the Progressing condition.
	says := func(reason, msg string) {
		cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: clitest.Since}}
	}
	const order = " Workers update to 2026.10.12-001 after every leader runs it; leaders not on it yet: node-1"
	steps := []func(){
		func() { says(v1alpha1.ReasonIdle, "No machine holds or waits for a reboot turn.") },
		func() { download(ms[0], 0); download(ms[1], 0); download(ms[2], 0) },
		func() { ms[0].Status.Download.BytesDone = 100 << 20 }, // a tenth more prints node-1's line
		func() { ms[0].Status.Download.BytesDone = 110 << 20 }, // less than a tenth more prints nothing
		func() {
			stage(ms[0])
			download(ms[1], 300<<20)
			download(ms[2], 150<<20)
			says(v1alpha1.ReasonGranting, "Waiting for a turn: node-1.")
		},
		func() {
			stage(ms[1])
			stage(ms[2])
			says(v1alpha1.ReasonGranting, "Waiting for a turn: node-1,node-2,node-3."+order+" (UpdatePending).")
		},
		func() {
			turn(ms[0])
			says(v1alpha1.ReasonGranting, "Holding a turn: node-1 (maxUnavailable 1). Waiting for a turn: node-2,node-3."+order+" (Updating).")
		},
		func() {
			ms[1].Status.Conditions = append(ms[1].Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionDrainBlocked, Status: metav1.ConditionTrue,
				Reason: "PodDisruptionBudget", Message: "pod shop/web-1 is protected by PodDisruptionBudget shop/web", LastTransitionTime: clitest.Since})
		},
		func() { done(ms[0]); says(v1alpha1.ReasonGranting, "Waiting for a turn: node-2,node-3.") },
		func() {
			turn(ms[1])
			ms[1].Status.Conditions = ms[1].Status.Conditions[:2]
			says(v1alpha1.ReasonGranting, "Holding a turn: node-2 (maxUnavailable 1). Waiting for a turn: node-3.")
		},
		func() { done(ms[1]) },
		func() { turn(ms[2]); says(v1alpha1.ReasonGranting, "Holding a turn: node-3 (maxUnavailable 1).") },
		func() { done(ms[2]); says(v1alpha1.ReasonIdle, "No machine holds or waits for a reboot turn.") },
		func() { cl.Status.Phase = v1alpha1.ClusterReady },
	}
	return cl, ms, steps
}

func TestTrackerGolden(t *testing.T) {
	cl, ms, steps := rolloutSteps()
	var out bytes.Buffer
	tr := newTracker(&out, clock.RealClock{})
	for i, step := range steps {
		step()
		complete, err := tr.observe(cl.DeepCopy(), ms)
		assert.NilError(t, err)
		assert.Equal(t, complete, i == len(steps)-1, "step %d", i)
	}
	golden.Assert(t, out.String(), "status.golden")
}

// Outside its maintenance window the rollout says when turns can come, and
// says it again when the window opens: read on the clock given, with the
// rule cluster-operator grants by.
func TestTrackerWindows(t *testing.T) {
	cl, ms, steps := rolloutSteps()
	cl.Spec.Disruption.Windows = []v1alpha1.MaintenanceWindow{{Days: []string{"Sat"}, Start: "22:00",
		Duration: metav1.Duration{Duration: 4 * time.Hour}, TimeZone: "Europe/Berlin"}}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 5, 17, 48, 0, 0, time.UTC)) // Saturday, 18:48 in Berlin
	var out bytes.Buffer
	tr := newTracker(&out, clk)
	for i, step := range steps {
		if i == 6 { // the first turn: the window opened
			clk.SetTime(time.Date(2026, 12, 5, 21, 0, 0, 0, time.UTC))
		}
		if i == 7 {
			clk.SetTime(clk.Now().Add(time.Minute)) // a minute later: nothing new to say
		}
		step()
		_, err := tr.observe(cl.DeepCopy(), ms)
		assert.NilError(t, err)
	}
	golden.Assert(t, out.String(), "status-window.golden")
}

func TestTrackerNotCompleteUntilObserved(t *testing.T) {
	cl, ms, steps := rolloutSteps()
	for _, s := range steps {
		s()
	}
	cl.Generation = 3 // a newer spec cluster-operator has not seen yet
	var out bytes.Buffer
	complete, err := newTracker(&out, clock.RealClock{}).observe(cl, ms)
	assert.NilError(t, err)
	assert.Assert(t, !complete)
}

func TestTrackerHalts(t *testing.T) {
	tests := []struct {
		name string
		set  func(cl *v1alpha1.Cluster)
		want string
	}{
		{"stalled", func(cl *v1alpha1.Cluster) {
			cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonRolloutStalled, Machine: "node-2", Version: clitest.Version2,
				Message: "node-2 held its turn for 30m without coming back", Since: clitest.Since}
		}, "the rollout of cluster lab is halted (RolloutStalled on node-2): node-2 held its turn for 30m without coming back\nNext: examine node-2 (kubectl describe machine node-2), then liken rollout resume lab"},
		{"trial failed", func(cl *v1alpha1.Cluster) {
			cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonTrialFailed, Machine: "node-1", Version: clitest.Version2, Since: clitest.Since}
		}, "halted (TrialFailed on node-1)\nNext: find why node-1 failed its trial"},
		{"condition only", func(cl *v1alpha1.Cluster) {
			cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonTrialFailed, Message: "node-3 failed its trial"}}
		}, "halted (TrialFailed on a machine): node-3 failed its trial"},
		{"message with terminal escapes", func(cl *v1alpha1.Cluster) {
			cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonTrialFailed,
				Message: "node-3 failed\x1b[2J\r\nNext: nothing to do"}}
		}, `halted (TrialFailed on a machine): node-3 failed\x1b[2J\x0d\x0aNext: nothing to do`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cl, ms, _ := rolloutSteps()
			tc.set(cl)
			_, err := newTracker(&bytes.Buffer{}, clock.RealClock{}).observe(cl, ms)
			var h *HaltedError
			assert.Assert(t, errors.As(err, &h))
			assert.ErrorContains(t, err, tc.want)
		})
	}
	// A halt of an earlier version does not stop a rollout of a new one.
	cl, ms, _ := rolloutSteps()
	cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonTrialFailed, Machine: "node-1", Version: clitest.Version1, Since: clitest.Since}
	_, err := newTracker(&bytes.Buffer{}, clock.RealClock{}).observe(cl, ms)
	assert.NilError(t, err)
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Status follows the objects through watches until the rollout completes.
func TestStatusFollows(t *testing.T) {
	cl, ms, steps := rolloutSteps()
	objs := []runtime.Object{cl.DeepCopy()}
	for _, m := range ms {
		objs = append(objs, m.DeepCopy())
	}
	c := fake.NewSimpleClientset(objs...)
	var out syncBuffer
	errc := make(chan error, 1)
	go func() { errc <- Status(context.Background(), c, StatusOptions{Watch: true}, &out) }()
	ctx := context.Background()
	for _, step := range steps {
		step()
		for _, m := range ms {
			_, err := c.LikenV1alpha1().Machines().UpdateStatus(ctx, m.DeepCopy(), metav1.UpdateOptions{})
			assert.NilError(t, err)
		}
		_, err := c.LikenV1alpha1().Clusters().UpdateStatus(ctx, cl.DeepCopy(), metav1.UpdateOptions{})
		assert.NilError(t, err)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-errc:
			if err != nil {
				return poll.Error(err)
			}
			return poll.Success()
		default:
			return poll.Continue("still following:\n%s", out.String())
		}
	}, poll.WithTimeout(30*time.Second))
	assert.Assert(t, is.Contains(out.String(), "Rollout of cluster lab to 2026.10.12-001 complete: 3/3 machines ready."))
}

func TestStatusPicksCluster(t *testing.T) {
	ctx := context.Background()
	err := Status(ctx, fake.NewSimpleClientset(), StatusOptions{}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "there is no Cluster to follow")
	c := fake.NewSimpleClientset(clitest.Cluster("b", "1"), clitest.Cluster("a", "1"))
	err = Status(ctx, c, StatusOptions{}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "there are 2 Clusters (a, b): name the one to follow, such as liken rollout status a")
	err = Status(ctx, c, StatusOptions{Cluster: "zz", Watch: true}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "cluster zz not found")
}

func TestStatusTimeout(t *testing.T) {
	cl, ms, _ := rolloutSteps()
	c := fake.NewSimpleClientset(cl, ms[0], ms[1], ms[2])
	err := Status(context.Background(), c, StatusOptions{Cluster: "lab", Watch: true, Timeout: 300 * time.Millisecond}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "timed out waiting for the rollout of cluster lab (0/3 machines ready on 2026.10.12-001)")
}

func TestStatusNoWatch(t *testing.T) {
	cl, ms, _ := rolloutSteps()
	c := fake.NewSimpleClientset(cl, ms[0], ms[1], ms[2])
	var out bytes.Buffer
	assert.NilError(t, Status(context.Background(), c, StatusOptions{Cluster: "lab"}, &out))
	golden.Assert(t, out.String(), "status-nowatch.golden")
}

func TestResume(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	cl := clitest.Cluster("lab", "1")
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonGranting, Message: "granting turns"}}
	c := fake.NewSimpleClientset(cl)
	err := Resume(ctx, c, clk, "lab", &bytes.Buffer{})
	assert.ErrorContains(t, err, "the rollout of cluster lab is not halted (Progressing is True, Granting: granting turns): there is nothing to resume")
	err = Resume(ctx, c, clk, "nope", &bytes.Buffer{})
	assert.ErrorContains(t, err, "cluster nope not found")

	cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonRolloutStalled, Machine: "node-2", Since: clitest.Since}
	_, err = c.LikenV1alpha1().Clusters().UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	assert.NilError(t, err)
	var out bytes.Buffer
	assert.NilError(t, Resume(ctx, c, clk, "lab", &out))
	golden.Assert(t, out.String(), "resume.golden")
	got, err := c.LikenV1alpha1().Clusters().Get(ctx, "lab", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, got.Annotations[v1alpha1.AnnotationResumeRollout], "2026-11-30T12:00:00Z")
}

// After each kind of halt, resume says what really happens next: after a
// failed trial every machine may try the release again, the one that
// failed included; after a failed canary the canary counts as passed;
// after a machine that did not settle, its place goes to the next machine.
func TestResumeSaysWhatHappensNext(t *testing.T) {
	cases := []struct {
		name   string
		halt   v1alpha1.RolloutHalt
		settle bool
		golden string
	}{
		{name: "a failed trial", halt: v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonTrialFailed, Machine: "node-1"},
			golden: "resume-trial-failed.golden"},
		{name: "a failed canary", halt: v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonCanaryFailed, Machine: "node-1"},
			golden: "resume-canary-failed.golden"},
		{name: "a machine that did not settle", halt: v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonRolloutStalled, Machine: "node-2"}, settle: true,
			golden: "resume-settle-stalled.golden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
			cl := clitest.Cluster("lab", "1")
			h := tc.halt
			h.Version, h.Since = cl.Spec.Version, clitest.Since
			cl.Status.Halt = &h
			if tc.settle {
				cl.Status.Settling = []v1alpha1.SettlingMachine{{Machine: h.Machine, Reason: v1alpha1.TurnRelease, GrantedAt: clitest.Since, ReturnedAt: clitest.Since}}
			}
			c := fake.NewSimpleClientset(cl)
			var out bytes.Buffer
			assert.NilError(t, Resume(ctx, c, clk, "lab", &out))
			golden.Assert(t, out.String(), tc.golden)
		})
	}
}

// A Manual leader (node-1) and two workers have all staged the release;
// a person approved node-3 only. liken rollout status says what
// cluster-operator decided (controllers/turns.Decide on the same objects):
// node-3 waits for node-1, the leader, to run the release, and node-1 for
// its own approval.
func TestStatusSaysWhyMachinesWait(t *testing.T) {
	cl := clitest.Cluster("ux", "1")
	var ms []*v1alpha1.Machine
	objs := []runtime.Object{cl}
	for i, n := range []string{"node-1", "node-2", "node-3"} {
		role := v1alpha1.RoleWorker
		if n == "node-1" {
			role = v1alpha1.RoleLeader
		}
		m := clitest.Machine(n, "ux", role, v1alpha1.RebootManual)
		change := fmt.Sprintf("c%d", i+1)
		if n == "node-3" {
			m.Annotations = map[string]string{v1alpha1.AnnotationApprovedChange: change}
		}
		clitest.SetStaged(m, clitest.Version1, clitest.Version2, change)
		ms = append(ms, m)
		objs = append(objs, m)
	}
	cl.Status = turns.Decide(turns.Input{Cluster: cl, Machines: ms, Now: clitest.Since.Time}).Status
	c := fake.NewSimpleClientset(objs...)
	var out bytes.Buffer
	assert.NilError(t, Status(context.Background(), c, StatusOptions{Cluster: "ux"}, &out))
	golden.Assert(t, out.String(), "status-leader-first.golden")
	assert.Assert(t, is.Contains(out.String(), "node-3  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines 0/3]  waiting for a turn"))
	assert.Assert(t, is.Contains(out.String(), "leaders not on it yet: node-1 (UpdatePending, waits for `liken approve-reboot ux node-1`)."))
}

// A k3sArgs change on a fleet at rest: the workers restart k3s at once and
// stay Ready; the leaders wait for their RestartK3s turns, one at a time,
// and the status says so instead of suggesting a reboot.
func TestTrackerRestartK3s(t *testing.T) {
	cl := clitest.Cluster("lab", "1")
	cl.Generation, cl.Status.ObservedGeneration = 2, 2
	cl.Status.Phase = v1alpha1.ClusterUpdating
	var ms []*v1alpha1.Machine
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		role := v1alpha1.RoleLeader
		if n == "node-3" {
			role = v1alpha1.RoleWorker
		}
		m := clitest.Machine(n, "lab", role, v1alpha1.RebootManual)
		clitest.SetReady(m, clitest.Version2)
		ms = append(ms, m)
	}
	wait := func(m *v1alpha1.Machine) {
		m.Status.Phase, m.Status.Change = v1alpha1.MachineRebootPending, "k-"+m.Name
		m.Status.Pending = []v1alpha1.PendingChange{{Field: "cluster.spec.settings.k3sArgs", Class: v1alpha1.ClassRestartK3s, Since: clitest.Since}}
		m.Status.Conditions = append(m.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionRebootPending, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAwaitingTurn, Message: "waits for a leader turn", LastTransitionTime: clitest.Since})
	}
	turn := func(m *v1alpha1.Machine) {
		m.Status.Phase, m.Status.Pending = v1alpha1.MachineRebooting, nil
		cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: m.Name, Reason: v1alpha1.TurnRestartK3s, Change: m.Status.Change, Leader: true, GrantedAt: clitest.Since}}
	}
	done := func(m *v1alpha1.Machine) {
		clitest.SetReady(m, clitest.Version2)
		cl.Status.RebootTurns = nil
	}
	steps := []func(){
		func() { wait(ms[0]); wait(ms[1]) },
		func() { turn(ms[0]) },
		func() { done(ms[0]); turn(ms[1]) },
		func() { done(ms[1]); cl.Status.Phase = v1alpha1.ClusterReady },
	}
	var out bytes.Buffer
	tr := newTracker(&out, clock.RealClock{})
	for i, step := range steps {
		step()
		complete, err := tr.observe(cl.DeepCopy(), ms)
		assert.NilError(t, err)
		assert.Equal(t, complete, i == len(steps)-1, "step %d", i)
	}
	golden.Assert(t, out.String(), "status-restartk3s.golden")
}

// node-1 came back from its turn on the new release and settles for the
// default settle time; node-2 waits for its place. liken rollout status
// says both, from cluster-operator's own decision on the same objects.
func TestStatusSaysAMachineSettles(t *testing.T) {
	cl := clitest.Cluster("ux", "1")
	cl.Spec.Version = clitest.Version2
	back := clitest.Machine("node-1", "ux", v1alpha1.RoleWorker, v1alpha1.RebootAuto)
	clitest.SetReady(back, clitest.Version2)
	back.Status.Observed.BootID = "boot-2"
	waits := clitest.Machine("node-2", "ux", v1alpha1.RoleWorker, v1alpha1.RebootAuto)
	clitest.SetStaged(waits, clitest.Version1, clitest.Version2, "c2")
	cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: "node-1", Reason: v1alpha1.TurnRelease, Change: "c1", BootID: "boot-1", Version: clitest.Version2, GrantedAt: clitest.Since}}
	cl.Status = turns.Decide(turns.Input{Cluster: cl, Machines: []*v1alpha1.Machine{back, waits}, Now: clitest.Since.Add(5 * time.Minute)}).Status
	assert.Equal(t, len(cl.Status.Settling), 1)
	c := fake.NewSimpleClientset(cl, back, waits)
	var out bytes.Buffer
	assert.NilError(t, Status(context.Background(), c, StatusOptions{Cluster: "ux"}, &out))
	assert.Check(t, is.Contains(out.String(), "node-1  Ready          2026.10.12-001                    [machines 1/2]  back from its turn, settling"), out.String())
	assert.Check(t, is.Contains(out.String(), "cluster-operator on cluster ux (Settling)"), out.String())
	assert.Check(t, is.Contains(out.String(), "node-1 waits for spec.disruption.settle (30s) to pass at 2026-11-30T10:05:30Z."), out.String())
}
