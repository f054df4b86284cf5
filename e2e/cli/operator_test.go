package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/generated/clientset/versioned"
)

// TestWithClusterOperator runs the commands against a real cluster-operator
// process and machines simulated from the test (status and heartbeat
// written as each machine's own identity, following docs/design/protocol.md):
// a Manual fleet moves only when liken approve-reboot approves, liken
// rollout status follows it to the end, liken request-reboot takes one
// reboot through a turn, and liken rollout resume lifts a stall.
func TestWithClusterOperator(t *testing.T) {
	names := []string{"o-1", "o-2", "t-1"}
	cp := controlplane.StartForTest(t, controlplane.Options{Machines: names})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, f := range []string{"00-namespace.yaml", "10-crd-cluster.yaml", "11-crd-machine.yaml", "20-rbac-operator.yaml", "21-rbac-machine.yaml", "22-admission-machine.yaml"} {
		out, err := cp.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join("..", "..", "manifests", f))
		assert.NilError(t, err, out)
	}
	out, err := cp.Kubectl(ctx, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh")
	assert.NilError(t, err, out)
	admin, err := versioned.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	e := &env{cp: cp, admin: admin}

	omega := clitest.Cluster("omega", "1")
	tau := clitest.Cluster("tau", "1")
	tau.Spec.Disruption.StallTimeout = &metav1.Duration{Duration: 3 * time.Second}
	for _, cl := range []*v1alpha1.Cluster{omega, tau} {
		_, err := admin.LikenV1alpha1().Clusters().Create(ctx, cl, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
	sims := map[string]*sim{}
	for _, m := range []*v1alpha1.Machine{
		clitest.Machine("o-1", "omega", v1alpha1.RoleLeader, v1alpha1.RebootManual),
		clitest.Machine("o-2", "omega", v1alpha1.RoleWorker, v1alpha1.RebootManual),
		clitest.Machine("t-1", "tau", v1alpha1.RoleLeader, v1alpha1.RebootAuto),
	} {
		assert.NilError(t, cp.AddNode(ctx, m.Name, nil))
		_, err := admin.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
		assert.NilError(t, err)
		s := newSim(t, cp, m.Name, m.Spec.Cluster)
		sims[m.Name] = s
		go s.run(ctx)
	}
	sims["t-1"].setHang(true) // t-1 never comes back from its turn
	startOperator(t, cp)

	// omega: nothing moves before approval.
	status := e.start(ctx, "rollout", "status", "omega")
	status.waitOutput(t, "o-1  UpdatePending  2026.10.10-001 -> 2026.10.12-001  [machines 0/2]  awaiting approval: liken approve-reboot omega o-1")
	waitCluster(t, admin, "omega", "granting to begin", func(cl *v1alpha1.Cluster) bool {
		p := meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ConditionProgressing)
		return p != nil && p.Reason != v1alpha1.ReasonStartupGrace
	})
	cl, err := admin.LikenV1alpha1().Clusters().Get(ctx, "omega", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(cl.Status.RebootTurns), 0, "a turn was granted without approval")

	// The leader first: approve o-1, it takes its turn and comes back on
	// the new release; then o-2.
	for _, n := range []string{"o-1", "o-2"} {
		status.waitOutput(t, "awaiting approval: liken approve-reboot omega "+n)
		code, out, stderr := e.liken(ctx, "approve-reboot", "omega", n)
		assert.Equal(t, code, 0, stderr)
		assert.Assert(t, is.Contains(out, "Approved the change staged on "+n))
		status.waitOutput(t, n+"  Updating")
		status.waitOutput(t, n+"  Ready          2026.10.12-001")
	}
	assert.Equal(t, status.waitExit(t), 0, status.errOut.String())
	assert.Assert(t, is.Contains(status.out.String(), "Rollout of cluster omega to 2026.10.12-001 complete: 2/2 machines ready."))

	// request-reboot: o-2 stages a reboot, waits for approval, takes a turn
	// and comes back from a new boot.
	boot := sims["o-2"].bootID()
	code, _, stderr := e.liken(ctx, "request-reboot", "omega", "o-2")
	assert.Equal(t, code, 0, stderr)
	waitMachine(t, admin, "o-2", "the reboot request to be staged", func(m *v1alpha1.Machine) bool {
		return m.Status.Phase == v1alpha1.MachineRebootPending && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.ConditionRebootPending)
	})
	code, out, stderr = e.liken(ctx, "approve-reboot", "omega", "o-2")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "a requested reboot"))
	waitMachine(t, admin, "o-2", "o-2 to reboot", func(m *v1alpha1.Machine) bool {
		return m.Status.Phase == v1alpha1.MachineReady && m.Status.Observed.BootID != boot && m.Status.ObservedRebootRequest != ""
	})

	// tau: t-1 takes its turn and never returns; the rollout stalls, liken
	// rollout status exits 1, and liken rollout resume releases the turn.
	code, _, stderr = e.liken(ctx, "rollout", "status", "tau", "--timeout", "60s")
	assert.Equal(t, code, 1)
	assert.Assert(t, is.Contains(stderr, "is halted (RolloutStalled on t-1)"), stderr)
	code, out, stderr = e.liken(ctx, "rollout", "resume", "tau")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(out, "The turn t-1 held is released"))
	waitCluster(t, admin, "tau", "the halt to be lifted and the turn released", func(cl *v1alpha1.Cluster) bool {
		return cl.Status.Halt == nil && cl.Status.ObservedResume == cl.Annotations[v1alpha1.AnnotationResumeRollout]
	})
}

func waitCluster(t *testing.T, c versioned.Interface, name, what string, ok func(*v1alpha1.Cluster) bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		cl, err := c.LikenV1alpha1().Clusters().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if ok(cl) {
			return poll.Success()
		}
		return poll.Continue("waiting for %s: status %+v", what, cl.Status)
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(100*time.Millisecond))
}

func waitMachine(t *testing.T, c versioned.Interface, name, what string, ok func(*v1alpha1.Machine) bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		m, err := c.LikenV1alpha1().Machines().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return poll.Error(err)
		}
		if ok(m) {
			return poll.Success()
		}
		return poll.Continue("waiting for %s: status %+v", what, m.Status)
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(100*time.Millisecond))
}

// startOperator runs the cluster-operator binary ($LIKEN_BIN or
// _output/bin) with a short startup grace, until the test ends.
func startOperator(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	dir := os.Getenv("LIKEN_BIN")
	if dir == "" {
		dir = filepath.Join("..", "..", "_output", "bin")
	}
	bin := filepath.Join(dir, "cluster-operator")
	_, err := os.Stat(bin)
	assert.NilError(t, err, "cluster-operator binary: run make build, or set LIKEN_BIN")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	logPath := filepath.Join(cp.Dir, "cluster-operator.log")
	logFile, err := os.Create(logPath)
	assert.NilError(t, err)
	cmd := exec.Command(bin, "--kubeconfig", cp.OperatorKubeconfig, "--identity", "e2e-cli", "--metrics-bind-address", addr, "--startup-grace", "2s", "-v", "2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_, _ = cmd.Process.Wait()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("cluster-operator log:\n%s", b)
		}
	})
}

// sim is a machine that follows the turn protocol: it heartbeats, stages
// a release or a requested reboot, waits for approval (Manual) and for its
// turn, reboots and comes back Ready from a new boot.
type sim struct {
	t       *testing.T
	name    string
	cluster string
	liken   versioned.Interface
	kube    kubernetes.Interface

	mu       sync.Mutex
	version  string
	boot     int
	observed string // the last reboot request acted on
	hang     bool   // takes its turn and never comes back
}

func newSim(t *testing.T, cp *controlplane.ControlPlane, name, cluster string) *sim {
	cfg := cp.Config("system:node:" + name)
	s := &sim{t: t, name: name, cluster: cluster, version: clitest.Version1, boot: 1}
	var err error
	s.liken, err = versioned.NewForConfig(cfg)
	assert.NilError(t, err)
	s.kube, err = kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	return s
}

func (s *sim) setHang(v bool) { s.mu.Lock(); s.hang = v; s.mu.Unlock() }

func (s *sim) bootID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%s-boot-%d", s.name, s.boot)
}

func (s *sim) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var renewed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(renewed) >= time.Second && s.renew(ctx) == nil {
			renewed = time.Now()
		}
		s.step(ctx)
	}
}

func (s *sim) renew(ctx context.Context) error {
	leases := s.kube.CoordinationV1().Leases(v1alpha1.SystemNamespace)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: v1alpha1.SystemNamespace},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

func (s *sim) step(ctx context.Context) {
	m, err := s.liken.LikenV1alpha1().Machines().Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return
	}
	cl, err := s.liken.LikenV1alpha1().Clusters().Get(ctx, s.cluster, metav1.GetOptions{})
	if err != nil {
		return
	}
	s.mu.Lock()
	version, boot, hang, observed := s.version, s.boot, s.hang, s.observed
	s.mu.Unlock()
	bootID := fmt.Sprintf("%s-boot-%d", s.name, boot)
	since := metav1.NewTime(time.Unix(1700000000, 0))
	st := v1alpha1.MachineStatus{Phase: v1alpha1.MachineReady, Version: version, Slot: "A",
		ObservedRebootRequest: observed, Observed: v1alpha1.ObservedState{BootID: bootID}}
	request := m.Annotations[v1alpha1.AnnotationRequestReboot]
	release := version != cl.Spec.Version
	switch {
	case release:
		st.Phase, st.Staged, st.Change = v1alpha1.MachineUpdatePending, cl.Spec.Version, "release-"+cl.Spec.Version+"-"+bootID
		st.Pending = []v1alpha1.PendingChange{{Field: "cluster.spec.version", Class: v1alpha1.ClassReboot, Since: since}}
	case request != "" && request != observed:
		st.Phase, st.Change = v1alpha1.MachineRebootPending, "reboot-"+request
	}
	if st.Change != "" {
		reason, msg := v1alpha1.ReasonAwaitingTurn, "waits for a reboot turn"
		if m.Spec.RebootPolicy != v1alpha1.RebootAuto && m.Annotations[v1alpha1.AnnotationApprovedChange] != st.Change {
			reason, msg = v1alpha1.ReasonAwaitingApproval, fmt.Sprintf("waits for approval: liken approve-reboot %s %s", s.cluster, s.name)
		}
		st.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionRebootPending, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: since}}
		for _, turn := range cl.Status.RebootTurns {
			if turn.Machine != s.name || turn.Change != st.Change {
				continue
			}
			// The turn: report it, then "reboot" into the target.
			st.Phase = v1alpha1.MachineRebooting
			if release {
				st.Phase = v1alpha1.MachineUpdating
			}
			m.Status = st
			updated, err := s.liken.LikenV1alpha1().Machines().UpdateStatus(ctx, m, metav1.UpdateOptions{})
			if err != nil || hang {
				return
			}
			m = updated
			s.mu.Lock()
			s.boot++
			if release {
				s.version = cl.Spec.Version
			} else {
				s.observed = request
			}
			version, boot, observed = s.version, s.boot, s.observed
			s.mu.Unlock()
			st = v1alpha1.MachineStatus{Phase: v1alpha1.MachineReady, Version: version, Slot: "B",
				ObservedRebootRequest: observed, Observed: v1alpha1.ObservedState{BootID: fmt.Sprintf("%s-boot-%d", s.name, boot)}}
			break
		}
	}
	if st.Phase == v1alpha1.MachineReady {
		st.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "runs " + st.Version, LastTransitionTime: since}}
	}
	if hang && (m.Status.Phase == v1alpha1.MachineUpdating || m.Status.Phase == v1alpha1.MachineRebooting) {
		return // down for good
	}
	if m.Status.Phase != st.Phase || m.Status.Change != st.Change || m.Status.Version != st.Version ||
		m.Status.Observed.BootID != st.Observed.BootID || len(m.Status.Conditions) == 0 || m.Status.Conditions[0].Reason != st.Conditions[0].Reason ||
		m.Status.ObservedRebootRequest != st.ObservedRebootRequest {
		m.Status = st
		_, _ = s.liken.LikenV1alpha1().Machines().UpdateStatus(ctx, m, metav1.UpdateOptions{})
	}
}
