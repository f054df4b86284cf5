package reboot

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	k8stesting "k8s.io/client-go/testing"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/controllers/turns"
	"liken.sh/liken/generated/clientset/versioned/fake"
)

// fixture is cluster mycluster: three leaders, two workers. node-2 holds a
// turn; node-1 and node-3 (leaders) and node-5 wait for their turn; node-4
// (Manual) waits for approval of its staged release.
func fixture() []runtime.Object {
	const c = "mycluster"
	cl := clitest.Cluster(c, "1")
	cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: "node-2", Reason: v1alpha1.TurnRelease, Change: "c2", Leader: true, GrantedAt: clitest.Since}}
	cl.Status.Turns = "node-2"
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonGranting,
		Message: "Holding a turn: node-2 (maxUnavailable 1). Waiting for a turn: node-3,node-5.", LastTransitionTime: clitest.Since}}
	n1 := clitest.Machine("node-1", c, v1alpha1.RoleLeader, v1alpha1.RebootAuto)
	clitest.SetReady(n1, clitest.Version2)
	n2 := clitest.Machine("node-2", c, v1alpha1.RoleLeader, v1alpha1.RebootAuto)
	clitest.SetStaged(n2, clitest.Version1, clitest.Version2, "c2")
	n2.Status.Phase = v1alpha1.MachineUpdating
	n3 := clitest.Machine("node-3", c, v1alpha1.RoleLeader, v1alpha1.RebootAuto)
	clitest.SetStaged(n3, clitest.Version1, clitest.Version2, "c3")
	n4 := clitest.Machine("node-4", c, v1alpha1.RoleWorker, v1alpha1.RebootManual)
	clitest.SetStaged(n4, clitest.Version1, clitest.Version2, "c4")
	n5 := clitest.Machine("node-5", c, v1alpha1.RoleWorker, v1alpha1.RebootAuto)
	clitest.SetStaged(n5, clitest.Version1, clitest.Version2, "c5")
	other := clitest.Cluster("other", "1")
	o1 := clitest.Machine("other-1", "other", v1alpha1.RoleLeader, v1alpha1.RebootManual)
	clitest.SetStaged(o1, clitest.Version1, clitest.Version2, "o1")
	return []runtime.Object{cl, n1, n2, n3, n4, n5, other, o1}
}

// clk is the clock of the tests: Monday 2026-11-30 12:00 UTC.
func clk() *clocktesting.FakePassiveClock {
	return clocktesting.NewFakePassiveClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
}

// withWindows gives mycluster in objs maintenance windows.
func withWindows(objs []runtime.Object, ws ...v1alpha1.MaintenanceWindow) []runtime.Object {
	objs[0].(*v1alpha1.Cluster).Spec.Disruption.Windows = ws
	return objs
}

func window(days []string, start string, d time.Duration, zone string) v1alpha1.MaintenanceWindow {
	return v1alpha1.MaintenanceWindow{Days: days, Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: zone}
}

// Outside the windows, approve-reboot and request-reboot say when the turn
// can come; inside, until when.
func TestRebootSaysWhenTheWindowOpens(t *testing.T) {
	saturday := window([]string{"Sat"}, "22:00", 4*time.Hour, "Europe/Berlin")
	c := fake.NewSimpleClientset(withWindows(fixture(), saturday)...)
	var out bytes.Buffer
	assert.NilError(t, Approve(context.Background(), c, clk(), 0, "mycluster", "node-4", &out))
	golden.Assert(t, out.String(), "approve-window.golden")

	out.Reset()
	assert.NilError(t, Request(context.Background(), c, clk(), "mycluster", "node-5", &out))
	golden.Assert(t, out.String(), "request-window.golden")

	monday := window([]string{"Mon"}, "11:00", 2*time.Hour, "UTC")
	c = fake.NewSimpleClientset(withWindows(fixture(), saturday, monday)...)
	out.Reset()
	assert.NilError(t, Approve(context.Background(), c, clk(), 0, "mycluster", "node-4", &out))
	assert.Assert(t, is.Contains(out.String(), "  Window:          open until Mon 2026-11-30 13:00 UTC, 1h from now; a turn not granted by then waits for the next window\n"))

	c = fake.NewSimpleClientset(withWindows(fixture(), window([]string{"Sat"}, "22:00", 4*time.Hour, "Berlin"))...)
	out.Reset()
	assert.NilError(t, Approve(context.Background(), c, clk(), 0, "mycluster", "node-4", &out))
	assert.Assert(t, is.Contains(out.String(), `  Window:          a maintenance window cannot be read (spec.disruption.windows[0].timeZone: Invalid value: "Berlin": unknown time zone`))
}

func TestApprove(t *testing.T) {
	c := fake.NewSimpleClientset(fixture()...)
	var out bytes.Buffer
	assert.NilError(t, Approve(context.Background(), c, clk(), 0, "mycluster", "node-4", &out))
	golden.Assert(t, out.String(), "approve.golden")
	m, err := c.LikenV1alpha1().Machines().Get(context.Background(), "node-4", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, m.Annotations[v1alpha1.AnnotationApprovedChange], "c4")

	// Approving again changes nothing and says so.
	out.Reset()
	assert.NilError(t, Approve(context.Background(), c, clk(), 0, "mycluster", "node-4", &out))
	assert.Assert(t, is.Contains(out.String(), "was already approved"))
}

// A halted rollout answers every approval: approve-reboot says at once
// what cluster-operator says.
func TestApproveBlocked(t *testing.T) {
	objs := fixture()
	cl := objs[0].(*v1alpha1.Cluster)
	cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonTrialFailed, Machine: "node-2", Version: clitest.Version2, Since: clitest.Since}
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonTrialFailed,
		Message: "The trial boot of release 2026.10.12-001 on machine node-2 failed.", LastTransitionTime: clitest.Since}}
	c := fake.NewSimpleClientset(objs...)
	var out bytes.Buffer
	assert.NilError(t, Approve(context.Background(), c, clk(), time.Hour, "mycluster", "node-4", &out))
	assert.Assert(t, is.Contains(out.String(), "  Operator says:   The trial boot of release 2026.10.12-001 on machine node-2 failed.\n"))
}

// ux is the lab of a person who approved a worker first: node-1, a Manual
// leader, and the workers node-2 and node-3 have all staged release
// Version2; nobody approved anything yet, and cluster-operator said so.
func ux() []runtime.Object {
	cl := clitest.Cluster("ux", "1")
	n1 := clitest.Machine("node-1", "ux", v1alpha1.RoleLeader, v1alpha1.RebootManual)
	n2 := clitest.Machine("node-2", "ux", v1alpha1.RoleWorker, v1alpha1.RebootManual)
	n3 := clitest.Machine("node-3", "ux", v1alpha1.RoleWorker, v1alpha1.RebootManual)
	objs := []runtime.Object{cl}
	for i, m := range []*v1alpha1.Machine{n1, n2, n3} {
		clitest.SetStaged(m, clitest.Version1, clitest.Version2, fmt.Sprintf("c%d", i+1))
		objs = append(objs, m)
	}
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonIdle,
		Message: "No machine holds or waits for a reboot turn.", LastTransitionTime: clitest.Since}}
	return objs
}

// operator answers each approval the way cluster-operator does: after the
// patch lands it takes the turn decision on what the API now holds
// (controllers/turns.Decide) and writes the Cluster's status.
func operator(t *testing.T, c *fake.Clientset) {
	c.PrependReactor("patch", "machines", func(action k8stesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := k8stesting.ObjectReaction(c.Tracker())(action)
		if err != nil {
			return handled, obj, err
		}
		cl, gerr := c.Tracker().Get(v1alpha1.SchemeGroupVersion.WithResource("clusters"), "", "ux")
		assert.NilError(t, gerr)
		list, gerr := c.Tracker().List(v1alpha1.SchemeGroupVersion.WithResource("machines"), v1alpha1.SchemeGroupVersion.WithKind("Machine"), "")
		assert.NilError(t, gerr)
		var ms []*v1alpha1.Machine
		for i := range list.(*v1alpha1.MachineList).Items {
			ms = append(ms, &list.(*v1alpha1.MachineList).Items[i])
		}
		cluster := cl.(*v1alpha1.Cluster).DeepCopy()
		cluster.Status = turns.Decide(turns.Input{Cluster: cluster, Machines: ms, Now: clk().Now()}).Status
		assert.NilError(t, c.Tracker().Update(v1alpha1.SchemeGroupVersion.WithResource("clusters"), cluster, ""))
		return handled, obj, err
	})
}

// Approving a worker while the leader waits for its own approval: the
// command says what cluster-operator answers, that the workers wait until
// node-1, the leader, runs the release, and that node-1 waits for its
// approval.
func TestApproveSaysWhatTheOperatorAnswers(t *testing.T) {
	c := fake.NewSimpleClientset(ux()...)
	operator(t, c)
	var out bytes.Buffer
	assert.NilError(t, Approve(context.Background(), c, clk(), time.Minute, "ux", "node-3", &out))
	golden.Assert(t, out.String(), "approve-leader-first.golden")
	assert.Assert(t, is.Contains(out.String(), "Workers update to 2026.10.12-001 after every leader runs it; leaders not on it yet: node-1 (UpdatePending, waits for `liken approve-reboot ux node-1`)."))

	// Without cluster-operator, the command does not pass its last word
	// off as an answer.
	c = fake.NewSimpleClientset(ux()...)
	out.Reset()
	assert.NilError(t, Approve(context.Background(), c, clk(), 300*time.Millisecond, "ux", "node-3", &out))
	assert.Assert(t, is.Contains(out.String(), "  Operator says:   (no answer to this approval yet; is cluster-operator running? kubectl -n liken-system get pods) Its last word: No machine holds or waits for a reboot turn.\n"))
}

// A machine that takes and ends its turn between two reads of the Cluster
// (the ledger never shows it, the Progressing message is what it was) has
// had its answer: the command says the machine moved on, at once, and
// does not wait out --wait nor fail when the wait ends.
func TestApproveSeesATurnAlreadyTaken(t *testing.T) {
	c := fake.NewSimpleClientset(ux()...)
	c.PrependReactor("patch", "machines", func(k8stesting.Action) (bool, runtime.Object, error) {
		m, err := c.Tracker().Get(v1alpha1.SchemeGroupVersion.WithResource("machines"), "", "node-3")
		assert.NilError(t, err)
		done := m.(*v1alpha1.Machine).DeepCopy()
		done.Status.Phase, done.Status.Change, done.Status.Version = v1alpha1.MachineReady, "", clitest.Version2
		assert.NilError(t, c.Tracker().Update(v1alpha1.SchemeGroupVersion.WithResource("machines"), done, ""))
		return false, nil, nil
	})
	var out bytes.Buffer
	start := time.Now()
	assert.NilError(t, Approve(context.Background(), c, clk(), time.Minute, "ux", "node-3", &out))
	assert.Assert(t, time.Since(start) < 10*time.Second, "waited %s", time.Since(start))
	assert.Assert(t, is.Contains(out.String(), "Next: node-3 has taken its turn already; it is Ready now.\n"), out.String())
}

func TestApproveRefuses(t *testing.T) {
	tests := []struct {
		name    string
		cluster string
		machine string
		change  func(m *v1alpha1.Machine)
		want    string
	}{
		{name: "other cluster", cluster: "mycluster", machine: "other-1",
			want: "machine other-1 is not in cluster mycluster: it belongs to cluster other (did you mean: liken approve-reboot other other-1?)"},
		{name: "no such machine", cluster: "mycluster", machine: "node-9", want: "machine node-9 not found"},
		{name: "no such cluster", cluster: "nope", machine: "node-4", want: "machine node-4 is not in cluster nope"},
		{name: "ready", cluster: "mycluster", machine: "node-1",
			want: "machine node-1 is not waiting for approval: it is Ready with nothing staged. To reboot it anyway: liken request-reboot mycluster node-1"},
		{name: "auto", cluster: "mycluster", machine: "node-5",
			want: "machine node-5 is not waiting for approval: its rebootPolicy is Auto, so it takes its turn without approval"},
		{name: "holds its turn", cluster: "mycluster", machine: "node-2", want: "it already holds its turn (phase Updating)"},
		{name: "downloading", cluster: "mycluster", machine: "node-4", change: func(m *v1alpha1.Machine) {
			m.Status = v1alpha1.MachineStatus{Phase: v1alpha1.MachineDownloading, Version: clitest.Version1,
				Download: &v1alpha1.DownloadProgress{Version: clitest.Version2, BytesDone: 100 << 20, BytesTotal: 400 << 20}}
		}, want: "it is still downloading 2026.10.12-001 (100.0 MiB of 400.0 MiB). It asks for approval once the release is verified and staged"},
		{name: "lost", cluster: "mycluster", machine: "node-4", change: func(m *v1alpha1.Machine) { m.Status.Phase = v1alpha1.MachineLost },
			want: "it is Lost (cluster-operator saw no heartbeat on its Node Lease)"},
		{name: "degraded", cluster: "mycluster", machine: "node-4", change: func(m *v1alpha1.Machine) { m.Status.Phase = v1alpha1.MachineDegraded },
			want: "it is Degraded and needs a person; kubectl describe machine node-4 shows why"},
		{name: "no status", cluster: "mycluster", machine: "node-4", change: func(m *v1alpha1.Machine) { m.Status = v1alpha1.MachineStatus{} },
			want: "it has not reported a status yet"},
		{name: "no change", cluster: "mycluster", machine: "node-4", change: func(m *v1alpha1.Machine) { m.Status.Change = "" },
			want: "no staged change (status.change is empty)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := fixture()
			for _, o := range objs {
				if m, ok := o.(*v1alpha1.Machine); ok && m.Name == tc.machine && tc.change != nil {
					tc.change(m)
				}
			}
			c := fake.NewSimpleClientset(objs...)
			var out bytes.Buffer
			err := Approve(context.Background(), c, clk(), 0, tc.cluster, tc.machine, &out)
			assert.ErrorContains(t, err, tc.want)
			assert.Equal(t, out.String(), "")
			if m, err := c.LikenV1alpha1().Machines().Get(context.Background(), tc.machine, metav1.GetOptions{}); err == nil {
				_, approved := m.Annotations[v1alpha1.AnnotationApprovedChange]
				assert.Assert(t, !approved, "approved anyway")
			}
		})
	}
}

func TestRequest(t *testing.T) {
	c := fake.NewSimpleClientset(fixture()...)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	var out bytes.Buffer
	assert.NilError(t, Request(context.Background(), c, clk, "mycluster", "node-4", &out))
	golden.Assert(t, out.String(), "request-manual.golden")
	m, err := c.LikenV1alpha1().Machines().Get(context.Background(), "node-4", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, m.Annotations[v1alpha1.AnnotationRequestReboot], "2026-11-30T12:00:00Z")

	// While the request is pending, asking again does nothing.
	out.Reset()
	clk.SetTime(clk.Now().Add(time.Minute))
	assert.NilError(t, Request(context.Background(), c, clk, "mycluster", "node-4", &out))
	assert.Assert(t, is.Contains(out.String(), "already has a reboot request pending (made 2026-11-30T12:00:00Z)"))

	// Once the machine acted on it, a new request gets a new value.
	m.Status.ObservedRebootRequest = "2026-11-30T12:00:00Z"
	_, err = c.LikenV1alpha1().Machines().UpdateStatus(context.Background(), m, metav1.UpdateOptions{})
	assert.NilError(t, err)
	out.Reset()
	assert.NilError(t, Request(context.Background(), c, clk, "mycluster", "node-4", &out))
	m, err = c.LikenV1alpha1().Machines().Get(context.Background(), "node-4", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, m.Annotations[v1alpha1.AnnotationRequestReboot], "2026-11-30T12:01:00Z")

	out.Reset()
	assert.NilError(t, Request(context.Background(), c, clk, "mycluster", "node-5", &out))
	golden.Assert(t, out.String(), "request-auto.golden")

	// A Degraded machine asks for no turn: the request waits, and the
	// output says so and what to do.
	n3, err := c.LikenV1alpha1().Machines().Get(context.Background(), "node-3", metav1.GetOptions{})
	assert.NilError(t, err)
	n3.Status.Phase = v1alpha1.MachineDegraded
	_, err = c.LikenV1alpha1().Machines().UpdateStatus(context.Background(), n3, metav1.UpdateOptions{})
	assert.NilError(t, err)
	out.Reset()
	assert.NilError(t, Request(context.Background(), c, clk, "mycluster", "node-3", &out))
	golden.Assert(t, out.String(), "request-degraded.golden")

	err = Request(context.Background(), c, clk, "other", "node-5", &out)
	assert.ErrorContains(t, err, "machine node-5 is not in cluster other: it belongs to cluster mycluster (did you mean: liken request-reboot mycluster node-5?)")
}
