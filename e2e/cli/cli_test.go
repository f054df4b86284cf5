// Package cli tests the liken command line against a real control plane (etcd, kube-apiserver) with liken's manifests installed.
package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
	"gotest.tools/v3/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
)

// env is one control plane shared by the subtests of TestCLI; each subtest
// uses its own Cluster and Machines.
type env struct {
	cp    *controlplane.ControlPlane
	admin versioned.Interface
}

// machines get an identity (system:node:<name>) from the control plane.
var machines = []string{
	"a-1", "a-2", "a-3", "a-4", "a-5", "b-1", // approve-reboot
	"r-1", "r-2", // request-reboot
	"s-1", "s-2", "s-3", // rollout status
	"h-1", // halts
}

func TestCLI(t *testing.T) {
	cp := controlplanetest.Start(t, controlplane.Options{Machines: machines})
	ctx := context.Background()
	fleetsim.Install(ctx, t, cp)
	admin, err := versioned.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	e := &env{cp: cp, admin: admin}

	t.Run("approve-reboot", e.testApprove)
	t.Run("request-reboot", e.testRequest)
	t.Run("rollout status", e.testRolloutStatus)
	t.Run("rollout status halted", e.testRolloutHalted)
	t.Run("rollout resume", e.testResume)
	t.Run("layer validation matches the API server", e.testValidationParity)
	t.Run("logs refused", e.testLogsRefused)
}

// testLogsRefused: liken logs goes through the API server's node proxy, so
// the cluster's RBAC decides who reads a machine's journal; a refusal
// names the permission, and a machine with no Node says so.
func (e *env) testLogsRefused(t *testing.T) {
	ctx := context.Background()
	for _, r := range []struct {
		args []string
		want string
	}{
		// A machine's own identity may not read another machine's logs.
		{[]string{"--kubeconfig", e.cp.MachineKubeconfig("a-2"), "logs", "a-1"}, "reading the logs of machine a-1 needs the permission to get nodes/proxy on its Node, which the API server refused"},
		{[]string{"logs", "zz"}, "machine zz has no Node: it has not joined the cluster, or the name is wrong"},
		{[]string{"logs", "a-1", "--boot", "1"}, "--boot 1: give 0 for this boot, -1 for the one before it"},
	} {
		code, out, stderr := e.liken(ctx, r.args...)
		assert.Equal(t, code, 1, "liken %s: %s", strings.Join(r.args, " "), out)
		assert.Check(t, is.Contains(stderr, r.want))
	}
}

// liken runs the liken command in-process as the admin (or with the
// kubeconfig given first in args) and returns its exit code and output.
func (e *env) liken(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	if len(args) == 0 || args[0] != "--kubeconfig" {
		args = append([]string{"--kubeconfig", e.cp.AdminKubeconfig}, args...)
	}
	code := cli.Run(ctx, cli.NewRootCommand(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// create makes the cluster and its machines and sets each machine's status
// as the machine itself (its own identity, through the admission policy).
func (e *env) create(t *testing.T, cl *v1alpha1.Cluster, ms ...*v1alpha1.Machine) {
	t.Helper()
	ctx := context.Background()
	status := cl.Status
	got, err := e.admin.LikenV1alpha1().Clusters().Create(ctx, cl, metav1.CreateOptions{})
	assert.NilError(t, err)
	got.Status = status
	_, err = e.admin.LikenV1alpha1().Clusters().UpdateStatus(ctx, got, metav1.UpdateOptions{})
	assert.NilError(t, err)
	for _, m := range ms {
		status := m.Status
		_, err := e.admin.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
		assert.NilError(t, err)
		m.Status = status
		e.writeStatus(t, m)
	}
}

// writeStatus writes m.Status as the machine does, re-reading on conflict.
func (e *env) writeStatus(t *testing.T, m *v1alpha1.Machine) {
	t.Helper()
	c, err := versioned.NewForConfig(e.cp.Config("system:node:" + m.Name))
	assert.NilError(t, err)
	ctx := context.Background()
	for range 5 {
		cur, err := c.LikenV1alpha1().Machines().Get(ctx, m.Name, metav1.GetOptions{})
		assert.NilError(t, err)
		cur.Status = m.Status
		if _, err = c.LikenV1alpha1().Machines().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err == nil {
			return
		}
		t.Logf("writing the status of %s: %v", m.Name, err)
	}
	t.Fatalf("could not write the status of %s", m.Name)
}

// writeClusterStatus writes cl.Status as cluster-operator would.
func (e *env) writeClusterStatus(t *testing.T, cl *v1alpha1.Cluster) {
	t.Helper()
	ctx := context.Background()
	cur, err := e.admin.LikenV1alpha1().Clusters().Get(ctx, cl.Name, metav1.GetOptions{})
	assert.NilError(t, err)
	cur.Status = cl.Status
	cur.Status.ObservedGeneration = cur.Generation
	_, err = e.admin.LikenV1alpha1().Clusters().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	assert.NilError(t, err)
}

func (e *env) machine(t *testing.T, name string) *v1alpha1.Machine {
	t.Helper()
	m, err := e.admin.LikenV1alpha1().Machines().Get(context.Background(), name, metav1.GetOptions{})
	assert.NilError(t, err)
	return m
}

func (e *env) testApprove(t *testing.T) {
	ctx := context.Background()
	cl := clitest.Cluster("alpha", "2")
	cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: "a-1", Reason: v1alpha1.TurnRelease, Change: "c-a-1", Leader: true, GrantedAt: clitest.Since}}
	var ms []*v1alpha1.Machine
	for i, n := range []string{"a-1", "a-2", "a-3", "a-4", "a-5"} {
		role, policy := v1alpha1.RoleWorker, v1alpha1.RebootManual
		if i < 2 {
			role = v1alpha1.RoleLeader
		}
		if n == "a-3" {
			policy = v1alpha1.RebootAuto
		}
		m := clitest.Machine(n, "alpha", role, policy)
		clitest.SetStaged(m, clitest.Version1, clitest.Version2, "c-"+n)
		ms = append(ms, m)
	}
	ms[0].Status.Phase = v1alpha1.MachineUpdating
	clitest.SetReady(ms[4], clitest.Version2)
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonGranting,
		Message: "Holding a turn: a-1 (maxUnavailable 2). Waiting for a turn: a-3.", LastTransitionTime: clitest.Since}}
	other := clitest.Cluster("beta", "1")
	b1 := clitest.Machine("b-1", "beta", v1alpha1.RoleLeader, v1alpha1.RebootManual)
	clitest.SetStaged(b1, clitest.Version1, clitest.Version2, "c-b-1")
	e.create(t, cl, ms...)
	e.create(t, other, b1)

	// a-4 (a Manual worker) waits for approval: approve exactly its change.
	code, out, stderr := e.liken(ctx, "approve-reboot", "alpha", "a-4", "--wait=0")
	assert.Equal(t, code, 0, stderr)
	golden.Assert(t, out, "approve.golden")
	assert.Equal(t, e.machine(t, "a-4").Annotations[v1alpha1.AnnotationApprovedChange], "c-a-4")

	refusals := []struct {
		args []string
		want string
	}{
		{[]string{"approve-reboot", "alpha", "b-1"}, "error: machine b-1 is not in cluster alpha: it belongs to cluster beta (did you mean: liken approve-reboot beta b-1?)\n"},
		{[]string{"approve-reboot", "alpha", "a-3"}, "its rebootPolicy is Auto, so it takes its turn without approval"},
		{[]string{"approve-reboot", "alpha", "a-5"}, "it is Ready with nothing staged. To reboot it anyway: liken request-reboot alpha a-5"},
		{[]string{"approve-reboot", "alpha", "a-1"}, "it already holds its turn (phase Updating)"},
		{[]string{"approve-reboot", "alpha", "zz"}, "machine zz not found"},
		{[]string{"approve-reboot", "alpha"}, "MACHINE is missing; usage: liken approve-reboot CLUSTER MACHINE"},
		// A machine's own identity may not approve its reboot.
		{[]string{"--kubeconfig", e.cp.MachineKubeconfig("a-2"), "approve-reboot", "alpha", "a-2"}, "the API server refused access to machine a-2"},
	}
	for _, r := range refusals {
		code, out, stderr := e.liken(ctx, r.args...)
		assert.Equal(t, code, 1, "liken %s: %s", strings.Join(r.args, " "), out)
		assert.Assert(t, is.Contains(stderr, r.want))
	}
	for _, n := range []string{"a-2", "a-3", "a-5", "b-1"} {
		_, ok := e.machine(t, n).Annotations[v1alpha1.AnnotationApprovedChange]
		assert.Assert(t, !ok, "%s was approved", n)
	}

	// An approval covers only the change staged when it was given: once a-4
	// stages something else, it waits for approval again.
	m := e.machine(t, "a-4")
	clitest.SetStaged(m, clitest.Version1, clitest.Version2, "c-a-4-new")
	e.writeStatus(t, m)
	code, out, stderr = e.liken(ctx, "approve-reboot", "alpha", "a-4", "--wait=0")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "Approved the change staged on a-4: release 2026.10.12-001 (change c-a-4-new)."))
	assert.Equal(t, e.machine(t, "a-4").Annotations[v1alpha1.AnnotationApprovedChange], "c-a-4-new")
}

func (e *env) testRequest(t *testing.T) {
	ctx := context.Background()
	cl := clitest.Cluster("rho", "1")
	r1 := clitest.Machine("r-1", "rho", v1alpha1.RoleLeader, v1alpha1.RebootManual)
	clitest.SetReady(r1, clitest.Version2)
	r2 := clitest.Machine("r-2", "rho", v1alpha1.RoleWorker, v1alpha1.RebootAuto)
	clitest.SetReady(r2, clitest.Version2)
	e.create(t, cl, r1, r2)

	code, out, stderr := e.liken(ctx, "request-reboot", "rho", "r-1")
	assert.Equal(t, code, 0, stderr)
	first := e.machine(t, "r-1").Annotations[v1alpha1.AnnotationRequestReboot]
	_, err := time.Parse(time.RFC3339Nano, first)
	assert.NilError(t, err, "request value %q", first)
	assert.Assert(t, is.Contains(out, "Requested a reboot of r-1 (request "+first+")."))
	assert.Assert(t, is.Contains(out, "then waits for your approval, because its rebootPolicy is Manual:\n  liken approve-reboot rho r-1\n"))

	// Pending: asking again changes nothing.
	code, out, _ = e.liken(ctx, "request-reboot", "rho", "r-1")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(out, "already has a reboot request pending"))
	assert.Equal(t, e.machine(t, "r-1").Annotations[v1alpha1.AnnotationRequestReboot], first)

	// The machine acted on it: a new request gets a new value.
	m := e.machine(t, "r-1")
	m.Status.ObservedRebootRequest = first
	e.writeStatus(t, m)
	code, _, stderr = e.liken(ctx, "request-reboot", "rho", "r-1")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, e.machine(t, "r-1").Annotations[v1alpha1.AnnotationRequestReboot] != first)

	code, out, stderr = e.liken(ctx, "request-reboot", "rho", "r-2")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "then waits for a turn under the disruption budget of cluster rho"))

	code, _, stderr = e.liken(ctx, "request-reboot", "alpha", "r-2")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "machine r-2 is not in cluster alpha: it belongs to cluster rho"))
}

// syncBuffer collects the output of a command running in a goroutine.
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

// running is liken running in the background.
type running struct {
	out, errOut syncBuffer
	code        chan int
}

func (e *env) start(ctx context.Context, args ...string) *running {
	r := &running{code: make(chan int, 1)}
	args = append([]string{"--kubeconfig", e.cp.AdminKubeconfig}, args...)
	go func() { r.code <- cli.Run(ctx, cli.NewRootCommand(), args, &r.out, &r.errOut) }()
	return r
}

// waitOutput waits until the output holds want.
func (r *running) waitOutput(t *testing.T, want string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(r.out.String(), want) {
			return poll.Success()
		}
		return poll.Continue("waiting for %q in:\n%s%s", want, r.out.String(), r.errOut.String())
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(20*time.Millisecond))
}

// waitExit waits for the command to end and returns its exit code.
func (r *running) waitExit(t *testing.T) int {
	t.Helper()
	var code int
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case code = <-r.code:
			return poll.Success()
		default:
			return poll.Continue("still running:\n%s", r.out.String())
		}
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(20*time.Millisecond))
	return code
}

// testRolloutStatus drives a rollout of three machines the way the
// machines and cluster-operator write it, and follows it with liken
// rollout status until it exits 0.
func (e *env) testRolloutStatus(t *testing.T) {
	ctx := context.Background()
	cl := clitest.Cluster("sigma", "1")
	cl.Status.Phase = v1alpha1.ClusterUpdating
	var ms []*v1alpha1.Machine
	for i, n := range []string{"s-1", "s-2", "s-3"} {
		role := v1alpha1.RoleWorker
		if i == 0 {
			role = v1alpha1.RoleLeader
		}
		m := clitest.Machine(n, "sigma", role, v1alpha1.RebootAuto)
		clitest.SetReady(m, clitest.Version1)
		ms = append(ms, m)
	}
	ms[2].Spec.RebootPolicy = v1alpha1.RebootManual
	e.create(t, cl, ms...)
	e.writeClusterStatus(t, cl)

	r := e.start(ctx, "rollout", "status", "sigma")
	r.waitOutput(t, "s-3  Ready          2026.10.10-001")

	type step struct {
		do   func()
		want string
	}
	download := func(m *v1alpha1.Machine, done int64) {
		m.Status.Phase = v1alpha1.MachineDownloading
		m.Status.Download = &v1alpha1.DownloadProgress{Version: clitest.Version2, BytesDone: done, BytesTotal: 200 << 20}
		e.writeStatus(t, m)
	}
	stage := func(m *v1alpha1.Machine) {
		clitest.SetStaged(m, clitest.Version1, clitest.Version2, "c-"+m.Name)
		e.writeStatus(t, m)
	}
	turn := func(m *v1alpha1.Machine) {
		cl.Status.RebootTurns = []v1alpha1.RebootTurn{{Machine: m.Name, Reason: v1alpha1.TurnRelease, GrantedAt: clitest.Since}}
		e.writeClusterStatus(t, cl)
		// The ledger first, as cluster-operator writes it: the machine
		// holds its turn before it reports Updating.
		ready := 0
		for _, o := range ms {
			if o.Status.Phase == v1alpha1.MachineReady && o.Status.Version == clitest.Version2 {
				ready++
			}
		}
		r.waitOutput(t, fmt.Sprintf("%s  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines %d/3]  holds its turn", m.Name, ready))
		m.Status.Phase = v1alpha1.MachineUpdating
		e.writeStatus(t, m)
	}
	done := func(m *v1alpha1.Machine) {
		clitest.SetReady(m, clitest.Version2)
		m.Status.Slot = "B"
		e.writeStatus(t, m)
		cl.Status.RebootTurns = nil
		e.writeClusterStatus(t, cl)
	}
	steps := []step{
		{func() { download(ms[0], 50<<20) }, "s-1  Downloading"},
		{func() { download(ms[1], 0) }, "s-2  Downloading"},
		{func() { stage(ms[0]) }, "s-1  UpdatePending"},
		{func() { stage(ms[1]) }, "s-2  UpdatePending"},
		{func() { turn(ms[0]) }, "s-1  Updating"},
		{func() { done(ms[0]) }, "s-1  Ready          2026.10.12-001"},
		{func() { turn(ms[1]) }, "s-2  Updating"},
		{func() { done(ms[1]) }, "s-2  Ready          2026.10.12-001"},
		{func() { download(ms[2], 200<<20) }, "s-3  Downloading"},
		{func() { stage(ms[2]) }, "awaiting approval: liken approve-reboot sigma s-3"},
	}
	for _, s := range steps {
		s.do()
		r.waitOutput(t, s.want)
	}
	// Approve s-3 with the command line, as a person would.
	code, _, stderr := e.liken(ctx, "approve-reboot", "sigma", "s-3", "--wait=0")
	assert.Equal(t, code, 0, stderr)
	m := e.machine(t, "s-3")
	ms[2].Annotations = m.Annotations
	clitest.SetStaged(ms[2], clitest.Version1, clitest.Version2, "c-s-3")
	e.writeStatus(t, ms[2])
	r.waitOutput(t, "s-3  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines 2/3]  waiting for a turn: see what cluster-operator says\n")
	turn(ms[2])
	r.waitOutput(t, "s-3  Updating")
	done(ms[2])
	r.waitOutput(t, "s-3  Ready          2026.10.12-001")
	select {
	case code := <-r.code:
		t.Fatalf("exited %d before cluster-operator reported Ready:\n%s", code, r.out.String())
	default:
	}
	cl.Status.Phase = v1alpha1.ClusterReady
	e.writeClusterStatus(t, cl)
	assert.Equal(t, r.waitExit(t), 0, r.errOut.String())
	golden.Assert(t, r.out.String(), "rollout-status.golden")
}

func (e *env) testRolloutHalted(t *testing.T) {
	ctx := context.Background()
	cl := clitest.Cluster("eta", "1")
	cl.Status.Phase = v1alpha1.ClusterUpdating
	h1 := clitest.Machine("h-1", "eta", v1alpha1.RoleLeader, v1alpha1.RebootAuto)
	clitest.SetStaged(h1, clitest.Version1, clitest.Version2, "c-h-1")
	e.create(t, cl, h1)
	e.writeClusterStatus(t, cl)

	r := e.start(ctx, "rollout", "status", "eta")
	r.waitOutput(t, "h-1  UpdatePending")
	h1.Status.Phase = v1alpha1.MachineUpdating
	e.writeStatus(t, h1)
	r.waitOutput(t, "h-1  Updating")
	cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: v1alpha1.ReasonRolloutStalled, Machine: "h-1", Version: clitest.Version2,
		Message: "h-1 has held its turn for 30m0s without coming back", Since: clitest.Since}
	cl.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonRolloutStalled, Message: "h-1 has held its turn for 30m0s without coming back", LastTransitionTime: clitest.Since}}
	e.writeClusterStatus(t, cl)
	assert.Equal(t, r.waitExit(t), 1)
	assert.Equal(t, r.errOut.String(), "error: the rollout of cluster eta is halted (RolloutStalled on h-1): h-1 has held its turn for 30m0s without coming back\n"+
		"Next: examine h-1 (kubectl describe machine h-1), then liken rollout resume eta\n")

	// A halted rollout fails at once, and --timeout ends a wait.
	code, _, stderr := e.liken(ctx, "rollout", "status", "eta")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "halted (RolloutStalled on h-1)"))
	code, _, stderr = e.liken(ctx, "rollout", "status", "rho", "--timeout", "1s")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "timed out waiting for the rollout of cluster rho"))
	code, _, stderr = e.liken(ctx, "rollout", "status")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "name the one to follow, such as liken rollout status"))
}

func (e *env) testResume(t *testing.T) {
	ctx := context.Background()
	// eta is halted (see testRolloutHalted).
	code, out, stderr := e.liken(ctx, "rollout", "resume", "eta")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "Asked cluster-operator to resume the rollout of cluster eta (halted: RolloutStalled on h-1)."))
	cl, err := e.admin.LikenV1alpha1().Clusters().Get(ctx, "eta", metav1.GetOptions{})
	assert.NilError(t, err)
	value := cl.Annotations[v1alpha1.AnnotationResumeRollout]
	_, err = time.Parse(time.RFC3339Nano, value)
	assert.NilError(t, err, "resume value %q", value)

	code, _, stderr = e.liken(ctx, "rollout", "resume", "rho")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "the rollout of cluster rho is not halted"))
	code, _, stderr = e.liken(ctx, "rollout", "resume", "nope")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "cluster nope not found"))
}

// testValidationParity checks that liken layer refuses exactly what the API
// server refuses: each document goes through both.
func (e *env) testValidationParity(t *testing.T) {
	ctx := context.Background()
	cluster := func(name, body string) string {
		return fmt.Sprintf("apiVersion: liken.sh/v1alpha1\nkind: Cluster\nmetadata:\n  name: %s\nspec:\n%s", name, body)
	}
	machine := func(name, body string) string {
		return fmt.Sprintf("apiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata:\n  name: %s\nspec:\n%s", name, body)
	}
	const okSpec = "  version: \"2026.10.10-001\"\n  releases:\n    source: https://r.example.com\n    catalog:\n    - {version: \"2026.10.10-001\", digest: \"sha256:" + "1111111111111111111111111111111111111111111111111111111111111111" + "\"}\n  network: {endpoint: \"https://10.0.0.1:6443\"}\n"
	docs := []struct {
		name  string
		doc   string
		valid bool
	}{
		{"valid cluster", cluster("p-ok", okSpec), true},
		{"version not in catalog", cluster("p-1", strings.Replace(okSpec, `version: "2026.10.10-001"`, `version: "2026.10.11-001"`, 1)), false},
		{"bad digest", cluster("p-2", strings.Replace(okSpec, "sha256:1111", "sha256:X111", 1)), false},
		{"source scheme", cluster("p-3", strings.Replace(okSpec, "https://r.example.com", "ftp://r.example.com", 1)), false},
		{"percentage", cluster("p-4", okSpec+"  disruption: {maxUnavailable: \"101%\"}\n"), false},
		{"valid percentage", cluster("p-5", okSpec+"  disruption: {maxUnavailable: \"25%\", drainTimeout: 90s}\n"), true},
		{"zero timeout", cluster("p-6", okSpec+"  disruption: {trialTimeout: 0s}\n"), false},
		{"zero settle", cluster("p-6s", okSpec+"  disruption: {settle: 0s}\n"), true},
		{"negative settle", cluster("p-6n", okSpec+"  disruption: {settle: -5s}\n"), false},
		{"settle as long as the stall timeout", cluster("p-6l", okSpec+"  disruption: {settle: 15m, stallTimeout: 15m}\n"), false},
		{"canary", cluster("p-c1", okSpec+"  disruption: {canary: {duration: 2h}}\n"), true},
		{"short canary", cluster("p-c2", okSpec+"  disruption: {canary: {duration: 30s}}\n"), false},
		{"gate", cluster("p-g1", okSpec+"  disruption: {gates: [{blockingPods: {selector: {matchLabels: {example.com/no-reboot: \"true\"}, matchExpressions: [{key: tier, operator: In, values: [db]}]}, namespaces: [shop]}}]}\n"), true},
		{"prometheus gate", cluster("p-g7", okSpec+"  disruption: {gates: [{prometheus: {url: \"http://prometheus.monitoring:9090\", alerts: \"Kube.*|Etcd.*\"}}]}\n"), true},
		{"prometheus gate pattern", cluster("p-g8", okSpec+"  disruption: {gates: [{prometheus: {url: \"http://p:9090\", alerts: \"Kube(\"}}]}\n"), false},
		{"gate of two kinds", cluster("p-g9", okSpec+"  disruption: {gates: [{prometheus: {url: \"http://p\"}, blockingPods: {selector: {matchLabels: {a: b}}}}]}\n"), false},
		{"gate without kind", cluster("p-g2", okSpec+"  disruption: {gates: [{}]}\n"), false},
		{"gate selecting everything", cluster("p-g3", okSpec+"  disruption: {gates: [{blockingPods: {selector: {}}}]}\n"), false},
		{"gate In without values", cluster("p-g4", okSpec+"  disruption: {gates: [{blockingPods: {selector: {matchExpressions: [{key: tier, operator: In}]}}}]}\n"), false},
		{"gate label key", cluster("p-g5", okSpec+"  disruption: {gates: [{blockingPods: {selector: {matchLabels: {\"bad key\": x}}}}]}\n"), false},
		{"gate label value", cluster("p-g6", okSpec+"  disruption: {gates: [{blockingPods: {selector: {matchLabels: {app: \"-x\"}}}}]}\n"), false},
		{"short poll", cluster("p-7", strings.Replace(okSpec, "    source:", "    pollInterval: 5s\n    source:", 1)), false},
		{"pod CIDR", cluster("p-8", strings.Replace(okSpec, `network: {endpoint: "https://10.0.0.1:6443"}`, `network: {endpoint: "https://10.0.0.1:6443", podCIDR: "10.42.0.0/33"}`, 1)), false},
		{"valid machine", machine("p-m1", "  cluster: c\n  role: Worker\n  ports: [{name: eth0, mac: \"52:54:00:12:34:56\", mtu: 9000}]\n"), true},
		{"role", machine("p-m2", "  cluster: c\n  role: Boss\n"), false},
		{"mac", machine("p-m3", "  cluster: c\n  role: Worker\n  ports: [{name: eth0, mac: \"52:54:00:12:34\"}]\n"), false},
		{"mtu", machine("p-m4", "  cluster: c\n  role: Worker\n  ports: [{name: eth0, mtu: 100}]\n"), false},
		{"duplicate port", machine("p-m5", "  cluster: c\n  role: Worker\n  ports: [{name: eth0}, {name: eth0}]\n"), false},
		{"mount point", machine("p-m6", "  cluster: c\n  role: Worker\n  disks: [{device: /dev/sdb, mountPoint: /var/../etc}]\n"), false},
		{"filesystem", machine("p-m7", "  cluster: c\n  role: Worker\n  disks: [{device: /dev/sdb, mountPoint: /var/data, filesystem: btrfs}]\n"), false},
		{"module parameter", machine("p-m8", "  cluster: c\n  role: Worker\n  kernelModules: [{name: vfio, parameters: [novalue]}]\n"), false},
		{"name", machine("P_M9", "  cluster: c\n  role: Worker\n"), false},
	}
	dir := t.TempDir()
	for i, d := range docs {
		_, lerr := layer.ValidateDocument("doc.yaml", []byte(d.doc))
		p := filepath.Join(dir, fmt.Sprintf("doc-%d.yaml", i))
		assert.NilError(t, os.WriteFile(p, []byte(d.doc), 0o600))
		out, serr := e.cp.Kubectl(ctx, "create", "--dry-run=server", "-f", p)
		assert.Equal(t, lerr == nil, d.valid, "%s: liken layer: %v", d.name, lerr)
		assert.Equal(t, serr == nil, d.valid, "%s: API server: %s", d.name, out)
	}
}
