package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/daemon/daemontest"
)

const (
	v1 = "2026.11.01-001"
	v2 = "2026.11.20-001"
	v3 = "2026.11.25-001"
)

// env is one machine, its Cluster and Node on fake clientsets, and a real
// release channel.
type env struct {
	t      *testing.T
	kube   *kubefake.Clientset
	lk     *likenfake.Clientset
	ch     *daemontest.Channel
	m      *daemontest.Machine
	digest map[string]string

	mu     sync.Mutex
	refuse map[string]bool
	// version numbers the Machine's status versions; conflicts and
	// unchanged count the status writes refused for a stale
	// resourceVersion and those that changed nothing.
	version, conflicts, unchanged int
	evicted                       []string
	// kubeletDown keeps the test's kubelet from posting the Node's status
	// in the next boots; bootID is the current boot.
	kubeletDown bool
	bootID      string
}

func newEnv(t *testing.T, policy likenv1.RebootPolicy) *env {
	e := &env{t: t, ch: daemontest.NewChannel(t), digest: map[string]string{}, refuse: map[string]bool{}}
	e.digest[v1] = e.ch.Publish(t, v1, 4<<10)
	e.digest[v2] = e.ch.Publish(t, v2, 256<<10)
	e.digest[v3] = e.ch.Publish(t, v3, 128<<10)
	e.m = daemontest.NewMachine(t, "m1", e.ch, v1)
	c := &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "c1", Annotations: map[string]string{}},
		Spec: likenv1.ClusterSpec{
			Version: v1,
			Releases: likenv1.ReleasesSpec{Source: e.ch.URL, Catalog: []likenv1.CatalogEntry{
				{Version: v1, Digest: e.digest[v1]}, {Version: v2, Digest: e.digest[v2]}, {Version: v3, Digest: e.digest[v3]},
			}},
			Network:  likenv1.NetworkSpec{Endpoint: "https://10.0.0.10:6443"},
			Settings: likenv1.SharedSettings{Sysctls: map[string]string{"vm.max_map_count": "262144"}},
			Disruption: likenv1.DisruptionSpec{
				DrainTimeout: &metav1.Duration{Duration: 300 * time.Millisecond},
				TrialTimeout: &metav1.Duration{Duration: 3 * time.Second},
			},
		},
	}
	m := &likenv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m1", Generation: 1, Annotations: map[string]string{}},
		Spec:       likenv1.MachineSpec{Cluster: "c1", Role: likenv1.RoleWorker, RebootPolicy: policy},
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "m1"},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	e.lk = likenfake.NewSimpleClientset(c, m)
	// Like the API server, a status update changes only the status.
	e.lk.PrependReactor("update", "machines", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ua := a.(k8stesting.UpdateAction)
		if ua.GetSubresource() != "status" {
			return false, nil, nil
		}
		in := ua.GetObject().(*likenv1.Machine)
		gvr := likenv1.SchemeGroupVersion.WithResource("machines")
		cur, err := e.lk.Tracker().Get(gvr, "", in.Name)
		if err != nil {
			return true, nil, err
		}
		out := cur.(*likenv1.Machine).DeepCopy()
		if in.ResourceVersion != out.ResourceVersion {
			e.mu.Lock()
			e.conflicts++
			e.mu.Unlock()
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), in.Name, fmt.Errorf("resourceVersion %q is not the stored %q", in.ResourceVersion, out.ResourceVersion))
		}
		if out.Status, err = stored(in.Status); err != nil {
			return true, nil, err
		}
		if equality.Semantic.DeepEqual(out.Status, cur.(*likenv1.Machine).Status) {
			// Like the API server, an update that changes nothing stores
			// nothing and keeps the resourceVersion.
			e.mu.Lock()
			e.unchanged++
			e.mu.Unlock()
			return true, out, nil
		}
		e.mu.Lock()
		e.version++
		out.ResourceVersion = fmt.Sprintf("s%d", e.version)
		e.mu.Unlock()
		return true, out, e.lk.Tracker().Update(gvr, out, "")
	})
	e.kube = kubefake.NewClientset(node)
	// The kubelet of each new boot posts the Node's status: the boot's ID
	// and a Ready heartbeat (unless the test stopped it).
	e.m.OnBoot = func(bi daemon.BootInfo) {
		e.mu.Lock()
		down := e.kubeletDown
		e.bootID = bi.BootID
		e.mu.Unlock()
		if !down {
			e.postNode(bi.BootID, true)
		}
	}
	e.kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateAction)
		if ca.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := ca.GetObject().(*policyv1.Eviction)
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.refuse[ev.Name] {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		e.evicted = append(e.evicted, ev.Name)
		return true, nil, e.kube.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, ev.Namespace, ev.Name)
	})
	return e
}

// stored is st as the API server keeps it: written as JSON and read back,
// so its times keep only whole seconds.
func stored(st likenv1.MachineStatus) (likenv1.MachineStatus, error) {
	var out likenv1.MachineStatus
	b, err := json.Marshal(st)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

func (e *env) options() daemon.Options {
	return daemon.Options{
		Kube: e.kube, Liken: e.lk,
		Timing: daemon.Timing{
			Progress: 50 * time.Millisecond, Resync: 300 * time.Millisecond,
			RetryMin: 100 * time.Millisecond, RetryMax: time.Second, DrainPoll: 10 * time.Millisecond,
			EvictRetryMin: 10 * time.Millisecond, EvictRetryMax: 50 * time.Millisecond, APIRetry: 50 * time.Millisecond,
		},
	}
}

func (e *env) start() *daemontest.Running { return e.m.Start(e.t, e.options()) }

func (e *env) machine() *likenv1.Machine {
	m, err := e.lk.LikenV1alpha1().Machines().Get(context.Background(), "m1", metav1.GetOptions{})
	assert.NilError(e.t, err)
	return m
}

func (e *env) cluster() *likenv1.Cluster {
	c, err := e.lk.LikenV1alpha1().Clusters().Get(context.Background(), "c1", metav1.GetOptions{})
	assert.NilError(e.t, err)
	return c
}

func (e *env) node() *corev1.Node {
	n, err := e.kube.CoreV1().Nodes().Get(context.Background(), "m1", metav1.GetOptions{})
	assert.NilError(e.t, err)
	return n
}

func (e *env) editCluster(f func(c *likenv1.Cluster)) {
	e.t.Helper()
	c := e.cluster()
	f(c)
	_, err := e.lk.LikenV1alpha1().Clusters().Update(context.Background(), c, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

func (e *env) editMachine(f func(m *likenv1.Machine)) {
	e.t.Helper()
	m := e.machine()
	f(m)
	m.Generation++
	_, err := e.lk.LikenV1alpha1().Machines().Update(context.Background(), m, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

// grant plays cluster-operator: it records a turn for the change the
// machine reports.
func (e *env) grant() string {
	e.t.Helper()
	m := e.machine()
	assert.Assert(e.t, m.Status.Change != "", "the machine asks for no turn")
	e.grantChange(m.Status.Change)
	return m.Status.Change
}

func (e *env) grantChange(change string) {
	e.t.Helper()
	m := e.machine()
	c := e.cluster()
	c.Status.RebootTurns = []likenv1.RebootTurn{{Machine: "m1", Reason: likenv1.TurnReboot, Change: change, BootID: m.Status.Observed.BootID, GrantedAt: metav1.Now()}}
	_, err := e.lk.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

func (e *env) revoke() {
	e.t.Helper()
	c := e.cluster()
	c.Status.RebootTurns = nil
	_, err := e.lk.LikenV1alpha1().Clusters().UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

// setNodeReady posts the Node's Ready condition for the current boot;
// false also stops the kubelet of later boots, as a
// release whose kubelet never starts does.
func (e *env) setNodeReady(ready bool) {
	e.t.Helper()
	e.mu.Lock()
	e.kubeletDown = !ready
	id := e.bootID
	e.mu.Unlock()
	e.postNode(id, ready)
}

// postNode writes the Node's status as a kubelet of boot bootID does.
func (e *env) postNode(bootID string, ready bool) {
	e.t.Helper()
	n := e.node()
	s := corev1.ConditionTrue
	if !ready {
		s = corev1.ConditionFalse
	}
	n.Status.NodeInfo.BootID = bootID
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, LastHeartbeatTime: metav1.Now()}}
	_, err := e.kube.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
	assert.NilError(e.t, err)
}

func (e *env) addPod(name string, claim bool) {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app", Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: "m1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if claim {
		n := "gpu"
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &n}}
	}
	_, err := e.kube.CoreV1().Pods("app").Create(context.Background(), p, metav1.CreateOptions{})
	assert.NilError(e.t, err)
}

func (e *env) setRefuse(pod string, v bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refuse[pod] = v
}

func (e *env) evictions() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.evicted...)
}

// waitFor polls the Machine until check passes.
func (e *env) waitFor(what string, check func(m *likenv1.Machine) bool) *likenv1.Machine {
	e.t.Helper()
	var last *likenv1.Machine
	poll.WaitOn(e.t, func(poll.LogT) poll.Result {
		last = e.machine()
		if check(last) {
			return poll.Success()
		}
		return poll.Continue("%s; machine status: phase %s change %q pending %v conditions %s", what, last.Status.Phase, last.Status.Change, last.Status.Pending, conds(last))
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(10*time.Millisecond))
	return last
}

func (e *env) waitPhase(p likenv1.MachinePhase) *likenv1.Machine {
	e.t.Helper()
	return e.waitFor("phase "+string(p), func(m *likenv1.Machine) bool { return m.Status.Phase == p })
}

func conds(m *likenv1.Machine) string {
	var s []string
	for _, c := range m.Status.Conditions {
		s = append(s, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(s, "; ")
}

func cond(m *likenv1.Machine, typ string) metav1.Condition {
	c := meta.FindStatusCondition(m.Status.Conditions, typ)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

// waitExit waits for the daemon to stop for a reboot.
func waitExit(t *testing.T, r *daemontest.Running) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Wait() }()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, daemon.ErrRebooted)
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not reboot")
	}
}

func (e *env) events() []string {
	list, err := e.kube.EventsV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	assert.NilError(e.t, err)
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Reason+": "+ev.Note)
	}
	return out
}

func (e *env) waitEvent(reason, contains string) {
	e.t.Helper()
	poll.WaitOn(e.t, func(poll.LogT) poll.Result {
		for _, ev := range e.events() {
			if strings.HasPrefix(ev, reason+": ") && strings.Contains(ev, contains) {
				return poll.Success()
			}
		}
		return poll.Continue("no event %s containing %q in %v", reason, contains, e.events())
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
}

func TestReadyOnTheClusterVersion(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.start()
	m := e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, m.Status.Version, v1)
	assert.Equal(t, m.Status.Slot, "A")
	assert.Equal(t, m.Status.Observed.BootID, "m1-boot-1")
	assert.Assert(t, m.Status.Observed.LastBoot != nil)
	assert.Equal(t, cond(m, likenv1.ConditionReady).Status, metav1.ConditionTrue)
	assert.Equal(t, m.Status.ObservedGeneration, int64(1))
	assert.Equal(t, e.m.Recorder.Count(changes.OpBoot), 1, "the first boot applies the configuration")

	// The daemon writes no Lease: the machine's heartbeat is the Node
	// Lease its kubelet renews.
	for _, a := range e.kube.Actions() {
		assert.Assert(t, a.GetResource().Resource != "leases", "the daemon sent %s on a Lease", a.GetVerb())
	}
}

// TestUpgradeWithTrial follows one release from the catalog to a committed
// slot: download, stage, approval, turn, drain, trial boot, commit.
func TestUpgradeWithTrial(t *testing.T) {
	e := newEnv(t, likenv1.RebootManual)
	e.addPod("web", false)
	e.addPod("gpu-job", true)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)

	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	m := e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v2)
	assert.Assert(t, m.Status.Change != "")
	assert.DeepEqual(t, []string{m.Status.Pending[0].Field}, []string{changes.FieldVersion})
	rp := cond(m, likenv1.ConditionRebootPending)
	assert.Equal(t, rp.Reason, likenv1.ReasonAwaitingApproval)
	assert.Assert(t, is.Contains(rp.Message, "liken approve-reboot c1 m1"))
	assert.Equal(t, cond(m, likenv1.ConditionReleaseVerified).Status, metav1.ConditionTrue)
	e.waitEvent(daemon.ReasonReleaseStaged, v2)

	// A turn without approval is not taken.
	change := e.grant()
	assert.Assert(t, is.Len(e.evictions(), 0))
	e.editMachine(func(m *likenv1.Machine) { m.Annotations[likenv1.AnnotationApprovedChange] = change })
	waitExit(t, r)
	assert.Equal(t, e.evictions()[0], "gpu-job", "the pod holding a ResourceClaim goes first")
	assert.Assert(t, e.node().Spec.Unschedulable)
	assert.Equal(t, e.node().Annotations[likenv1.AnnotationCordoned], change)
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA, Trial: boot.SlotB})

	// The trial boot commits once the node is Ready and the status written.
	r = e.start()
	assert.Assert(t, r.Boot.Trial)
	m = e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, m.Status.Version, v2)
	assert.Equal(t, m.Status.Slot, "B")
	assert.Equal(t, m.Status.Change, "")
	assert.Assert(t, is.Len(m.Status.Pending, 0))
	st, err = boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotB})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := e.node(); n.Spec.Unschedulable || n.Annotations[likenv1.AnnotationCordoned] != "" {
			return poll.Continue("node still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(10*time.Millisecond))
	assert.DeepEqual(t, slotStates(m), map[string]likenv1.SlotState{"A": likenv1.SlotPrevious, "B": likenv1.SlotActive})
	e.waitEvent(daemon.ReasonTrialSucceeded, v2)
}

func slotStates(m *likenv1.Machine) map[string]likenv1.SlotState {
	out := map[string]likenv1.SlotState{}
	for _, s := range m.Status.Slots {
		out[s.Name] = s.State
	}
	return out
}

// TestTrialThatNeverRejoins: the node never turns Ready, the trial times
// out at the default trial timeout (on the injected clock), the machine
// reboots to its proven slot and reports TrialFailed.
func TestTrialThatNeverRejoins(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) {
		c.Spec.Version = v2
		c.Spec.Disruption.TrialTimeout = nil // the default
	})
	e.trialGivesUp()

	r := e.start()
	assert.Assert(t, !r.Boot.Trial)
	assert.Equal(t, r.Boot.Slot, boot.SlotA)
	m := e.waitPhase(likenv1.MachineDegraded)
	tf := cond(m, likenv1.ConditionTrialFailed)
	assert.Equal(t, tf.Status, metav1.ConditionTrue)
	assert.Assert(t, is.Contains(tf.Message, "the kubelet of this boot has not posted the Node's status"), tf.Message)
	assert.Equal(t, m.Status.Version, v1)
	assert.Equal(t, slotStates(m)["B"], likenv1.SlotFailed)
	assert.Equal(t, m.Status.Change, "", "a machine whose trial failed asks for no turn")
	assert.Equal(t, cond(m, likenv1.ConditionReleaseVerified).Reason, likenv1.ReasonTrialFailed)
	assert.Equal(t, m.Status.Staged, "")

	// A new version clears the failure and downloads into the same slot.
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v3 })
	m = e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v3)
	assert.Equal(t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionFalse)
}

// TestTrialWithoutAPI: the trial boot never reaches the API server; the
// timer alone brings the machine back to its proven slot, once the trial
// timeout has passed and not before.
func TestTrialWithoutAPI(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)

	o := e.options()
	broken := likenfake.NewSimpleClientset()
	broken.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("connection refused")
	})
	o.Liken = broken
	clk := clocktesting.NewFakeClock(time.Now())
	o.Clock = clk
	r = e.m.Start(t, o)
	assert.Assert(t, r.Boot.Trial)
	// The boot writes nothing the test could wait on: the clock moves on
	// in hundredths of the timeout until the trial's timer fires.
	timeout := e.cluster().Spec.Disruption.TrialTimeoutOrDefault()
	moved := stepUntilReboot(t, clk, r, timeout/100)
	assert.Assert(t, moved >= timeout, "the trial gave up %s after it booted, before its timeout of %s", moved, timeout)

	r = e.start()
	m := e.waitPhase(likenv1.MachineDegraded)
	assert.Assert(t, is.Contains(cond(m, likenv1.ConditionTrialFailed).Message, "has not reached the API server"))
	assert.Equal(t, r.Boot.Slot, boot.SlotA)
}

// TestRetargetWhileDownloading: a new version while the download runs
// stops it and downloads the new target into the same slot.
func TestRetargetWhileDownloading(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.ch.SetDelay(time.Hour) // the artifact of v2 never arrives
	e.start()
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitFor("slot B downloading", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineDownloading && slotStates(m)["B"] == likenv1.SlotDownloading && m.Status.Download != nil
	})
	e.ch.SetDelay(0)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v3 })
	m := e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v3)
	assert.Equal(t, m.Status.Slots[1].Version, v3)

	// Back to the running version: the staged release is withdrawn.
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v1 })
	m = e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, slotStates(m)["B"], likenv1.SlotEmpty)
	assert.Equal(t, m.Status.Staged, "")
}

// TestCorruptReleaseIsRetried: bytes that do not match the release
// document leave ReleaseVerified=False and an event naming the artifact.
func TestCorruptReleaseIsRetried(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	art := filepath.Join(e.ch.Dir, v2, "rootfs.squashfs")
	good, err := os.ReadFile(art)
	assert.NilError(t, err)
	bad := append([]byte(nil), good...)
	bad[100] ^= 0xff
	assert.NilError(t, os.WriteFile(art, bad, 0o644))
	e.start()
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	m := e.waitFor("ReleaseVerified=False", func(m *likenv1.Machine) bool {
		return cond(m, likenv1.ConditionReleaseVerified).Status == metav1.ConditionFalse
	})
	assert.Equal(t, cond(m, likenv1.ConditionReleaseVerified).Reason, "ChecksumMismatch")
	assert.Equal(t, m.Status.Staged, "")
	assert.Assert(t, m.Status.Change == "")
	e.waitEvent(daemon.ReasonReleaseFailed, "rootfs.squashfs")
	assert.NilError(t, os.WriteFile(art, good, 0o644))
	m = e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v2)
}

// TestRestartResumesAStagedRelease: a daemon restart keeps what is on disk.
func TestRestartResumesAStagedRelease(t *testing.T) {
	e := newEnv(t, likenv1.RebootManual)
	r := e.start()
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	m := e.waitPhase(likenv1.MachineUpdatePending)
	change := m.Status.Change
	assert.NilError(t, r.Stop())
	// SIGTERM is not a reboot; the next start is the same boot.
	r = e.m.StartIn(t, e.options(), r.Boot)
	m = e.waitFor("same change after restart", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdatePending && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(t, m.Status.Change, change)
}

// TestRecheckMismatchRebootsWithoutTrial: a staged slot whose bytes changed
// after staging is caught by the re-check before the reboot: the machine
// reboots without a trial, stays on its proven slot, and downloads again.
func TestRecheckMismatchRebootsWithoutTrial(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	f := filepath.Join(e.m.Root, "slots", "B", "rootfs.squashfs")
	b, err := os.ReadFile(f)
	assert.NilError(t, err)
	b[0] ^= 0xff
	assert.NilError(t, os.WriteFile(f, b, 0o644))
	e.grant()
	waitExit(t, r)
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA}, "no trial armed")
	e.waitEvent(daemon.ReasonSlotRecheckFailed, "Slot B no longer matches")
	e.waitEvent(daemon.ReasonSlotRecheckFailed, "the slot's bytes changed on disk after liken verified them")

	// Back on the proven slot, the machine downloads the release again.
	// cluster-operator keeps the turn until the machine is Ready from a
	// new boot, so the same turn now reboots it into a trial.
	r = e.start()
	assert.Assert(t, !r.Boot.Trial)
	assert.Equal(t, r.Boot.Version, v1)
	waitExit(t, r)
	st, err = boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA, Trial: boot.SlotB})
	r = e.start()
	assert.Assert(t, r.Boot.Trial)
	m := e.waitFor("Ready on the new release", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Observed.BootID == r.Boot.BootID
	})
	assert.Equal(t, m.Status.Version, v2)
	assert.Equal(t, e.m.Boots(), 3)
}

// TestProgressIsWrittenAtMostEveryInterval: a slow download reports its
// progress, but no more often than Timing.Progress.
func TestProgressIsWrittenAtMostEveryInterval(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	var mu sync.Mutex
	var writes []time.Time
	var done []int64
	e.lk.PrependReactor("update", "machines", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ua, ok := a.(k8stesting.UpdateAction); ok && ua.GetSubresource() == "status" {
			if dl := ua.GetObject().(*likenv1.Machine).Status.Download; dl != nil {
				mu.Lock()
				writes = append(writes, time.Now())
				done = append(done, dl.BytesDone)
				mu.Unlock()
			}
		}
		return false, nil, nil
	})
	e.ch.SetRate(128 << 10) // v2 is 256 KiB: about 2 s
	o := e.options()
	o.Timing.Progress = 400 * time.Millisecond
	e.m.Start(t, o)
	e.waitPhase(likenv1.MachineReady)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	e.waitPhase(likenv1.MachineUpdatePending)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d progress writes, bytes done %v", len(writes), done)
	assert.Assert(t, len(writes) >= 3, "progress is reported while downloading")
	for i := 1; i < len(writes); i++ {
		gap := writes[i].Sub(writes[i-1])
		if done[i] != done[i-1] {
			assert.Assert(t, gap >= 350*time.Millisecond, "two progress writes %s apart", gap)
		}
	}
}

// TestRestartMidDownloadResumes: a daemon stopped in the middle of a
// download resumes it from its checkpoint, not from the first byte.
func TestRestartMidDownloadResumes(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	size := int64(4 << 20)
	digest := e.ch.Publish(t, "2026.11.29-001", int(size))
	e.editCluster(func(c *likenv1.Cluster) {
		c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, likenv1.CatalogEntry{Version: "2026.11.29-001", Digest: digest})
	})
	e.ch.SetRate(2 << 20) // about 2 s for the whole release
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	before := e.ch.BytesServed()
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = "2026.11.29-001" })
	// The release package checkpoints every 8 MiB and when it stops.
	e.waitFor("half downloaded", func(m *likenv1.Machine) bool {
		return m.Status.Download != nil && m.Status.Download.BytesDone > size/3
	})
	assert.NilError(t, r.Stop())
	e.ch.SetRate(0)
	r = e.m.StartIn(t, e.options(), r.Boot)
	m := e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, "2026.11.29-001")
	served := e.ch.BytesServed() - before
	t.Logf("served %d bytes for a %d-byte release across a restart", served, size)
	assert.Assert(t, served < size+size/2, "the download restarted from the beginning (%d bytes served)", served)
}

// TestRestartDuringTrial: a daemon restarted during its trial boot keeps
// the trial (and its deadline) and commits once the node is Ready.
func TestRestartDuringTrial(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.grant()
	waitExit(t, r)
	e.setNodeReady(false)
	r = e.start()
	assert.Assert(t, r.Boot.Trial)
	e.waitFor("trial boot reported", func(m *likenv1.Machine) bool {
		return m.Status.Observed.BootID == r.Boot.BootID && m.Status.Phase == likenv1.MachineUpdating
	})
	assert.NilError(t, r.Stop())
	r = e.m.StartIn(t, e.options(), r.Boot)
	e.setNodeReady(true)
	m := e.waitPhase(likenv1.MachineReady)
	assert.Equal(t, m.Status.Version, v2)
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotB})
	exited, _ := r.Exited()
	assert.Assert(t, !exited)
}

// TestRetargetDuringTurn: a new spec.version while the machine drains for
// the staged release gives the turn back, uncordons, and stages the new
// target in the same slot; no reboot happens in between.
func TestRetargetDuringTurn(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.addPod("db", false)
	e.setRefuse("db", true)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	change := e.grant()
	e.waitFor("draining", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdating && e.node().Spec.Unschedulable
	})
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v3 })
	m := e.waitFor("the new target staged", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdatePending && m.Status.Staged == v3
	})
	assert.Assert(t, m.Status.Change != change)
	assert.Equal(t, m.Status.Slots[1].Version, v3)
	e.waitEvent(daemon.ReasonTurnTakenBack, change)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if e.node().Spec.Unschedulable {
			return poll.Continue("still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(10*time.Millisecond))
	exited, _ := r.Exited()
	assert.Assert(t, !exited, "no reboot")
	st, err := boot.NewGRUB(e.m.BootDir).State()
	assert.NilError(t, err)
	assert.Equal(t, st, boot.State{Proven: boot.SlotA})
}

// TestTrialFailureAfterAResumeStillHolds: a rollout resumed once (the
// Cluster carries liken.sh/resume-rollout) must still report the next
// failed trial and hold the release back, rather than clear the failure
// at once and try the release again.
func TestTrialFailureAfterAResumeStillHolds(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[likenv1.AnnotationResumeRollout] = "resumed-once"
		c.Spec.Version = v2
	})
	e.trialGivesUp()

	r := e.start()
	assert.Assert(t, !r.Boot.Trial)
	m := e.waitPhase(likenv1.MachineDegraded)
	assert.Equal(t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionTrue)
	assert.Equal(t, m.Status.Change, "", "a machine whose trial failed asks for no turn")
}

// trialGivesUp runs the machine through a Release turn whose trial never
// rejoins (its Node stays NotReady): the trial gives up and reboots. The
// Cluster must already target v2.
func (e *env) trialGivesUp() {
	e.t.Helper()
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.setNodeReady(false)
	e.grant()
	waitExit(e.t, r)
	e.trialTimesOut()
}

// trialTimesOut boots the armed trial on an injected clock, waits until
// it reported itself, and moves the clock past the Cluster's trial
// timeout: the trial gives up and reboots.
func (e *env) trialTimesOut() {
	e.t.Helper()
	e.trialTimesOutAfter("the trial boot's status", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdating && m.Status.Slot == "B"
	})
}

// trialTimesOutAfter is trialTimesOut, once the trial boot's Machine
// status satisfies ok.
func (e *env) trialTimesOutAfter(what string, ok func(m *likenv1.Machine) bool) {
	e.t.Helper()
	o := e.options()
	clk := clocktesting.NewFakeClock(time.Now())
	o.Clock = clk
	r := e.m.Start(e.t, o)
	assert.Assert(e.t, r.Boot.Trial)
	e.waitFor(what, ok)
	stepUntilReboot(e.t, clk, r, e.cluster().Spec.Disruption.TrialTimeoutOrDefault()+time.Second)
}

// stepUntilReboot moves clk on by step, again and again (a timer armed
// after a step fires at a later one), until the daemon r stops for a
// reboot, and returns how far the clock moved.
func stepUntilReboot(t *testing.T, clk *clocktesting.FakeClock, r *daemontest.Running, step time.Duration) time.Duration {
	t.Helper()
	start := clk.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if exited, _ := r.Exited(); exited {
			return poll.Success()
		}
		clk.Step(step)
		return poll.Continue("the daemon runs, %s on", clk.Since(start))
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	assert.ErrorIs(t, r.Wait(), daemon.ErrRebooted)
	return clk.Since(start)
}

// TestTrialFailureAfterAResumeDuringTheTrial: a person resumes the rollout
// (for another machine's halt) after this machine armed its trial and
// before the trial fails. The failure still holds the release back and is
// reported: the resume value that counts is the one when the failure is
// first seen, not the one when the trial was armed.
func TestTrialFailureAfterAResumeDuringTheTrial(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	e.setNodeReady(false)
	e.grant()
	waitExit(t, r) // the trial is armed

	e.editCluster(func(c *likenv1.Cluster) { c.Annotations[likenv1.AnnotationResumeRollout] = "resumed-during-the-trial" })
	e.trialTimesOut()

	r = e.start()
	assert.Assert(t, !r.Boot.Trial)
	m := e.waitPhase(likenv1.MachineDegraded)
	assert.Equal(t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionTrue)
	assert.Equal(t, m.Status.Change, "", "a machine whose trial failed asks for no turn")
	assert.Equal(t, slotStates(m)["B"], likenv1.SlotFailed)

	// A later resume, one the person gave after seeing this failure,
	// retries the release (cluster-operator has ended the failed turn).
	e.revoke()
	e.editCluster(func(c *likenv1.Cluster) { c.Annotations[likenv1.AnnotationResumeRollout] = "resumed-after-the-failure" })
	m = e.waitPhase(likenv1.MachineUpdatePending)
	assert.Equal(t, m.Status.Staged, v2)
	assert.Equal(t, cond(m, likenv1.ConditionTrialFailed).Status, metav1.ConditionFalse)
	exited, _ := r.Exited()
	assert.Assert(t, !exited)
}

// TestTurnStopsWhenTheAPIServerNoLongerGrantsIt: the cache still lists
// the machine's turn, but the API server's ledger no longer does (a
// take-back the informer has not delivered yet). The machine reads the
// ledger from the API server before it cordons, and neither cordons nor
// drains nor reboots; it starts no turn again from the stale copy (a few
// reads, not a loop), and once the cache delivers the take-back it waits
// for a turn again.
func TestTurnStopsWhenTheAPIServerNoLongerGrantsIt(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	e.editCluster(func(c *likenv1.Cluster) { c.Spec.Version = v2 })
	var mu sync.Mutex
	stale, reads := false, 0
	e.lk.PrependReactor("get", "clusters", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if !stale {
			return false, nil, nil
		}
		reads++
		obj, err := e.lk.Tracker().Get(a.GetResource(), "", a.(k8stesting.GetAction).GetName())
		if err != nil {
			return true, nil, err
		}
		c := obj.(*likenv1.Cluster).DeepCopy()
		c.Status.RebootTurns = nil // taken back
		return true, c, nil
	})
	cordons := 0
	e.kube.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"unschedulable":true`) {
			mu.Lock()
			cordons++
			mu.Unlock()
		}
		return false, nil, nil
	})
	r := e.start()
	e.waitPhase(likenv1.MachineUpdatePending)
	mu.Lock()
	stale = true
	mu.Unlock()
	change := e.grant()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		mu.Lock()
		defer mu.Unlock()
		if reads > 0 {
			return poll.Success()
		}
		return poll.Continue("the machine has not read the ledger from the API server")
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(5*time.Millisecond))
	e.waitEvent(daemon.ReasonTurnStarted, change)

	// The take-back reaches the cache.
	mu.Lock()
	stale = false
	mu.Unlock()
	e.revoke()
	m := e.waitFor("waiting for a turn again", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineUpdatePending && cond(m, likenv1.ConditionRebootPending).Reason == likenv1.ReasonAwaitingTurn &&
			len(e.cluster().Status.RebootTurns) == 0
	})
	assert.Equal(t, m.Status.Change, change)
	assert.Assert(t, !e.node().Spec.Unschedulable, "cordoned without a turn")
	assert.Assert(t, is.Len(e.evictions(), 0), "drained without a turn")
	assert.Equal(t, e.m.Boots(), 1, "rebooted without a turn")
	exited, _ := r.Exited()
	assert.Assert(t, !exited)
	mu.Lock()
	defer mu.Unlock()
	assert.Assert(t, reads <= 3, "the machine read the ledger %d times from the stale copy", reads)
	assert.Equal(t, cordons, 0, "cordoned without a turn")
	for _, ev := range e.events() {
		assert.Check(t, !strings.Contains(ev, daemon.ReasonTurnResumed), "the turn was resumed from the stale copy: %s", ev)
	}
}

// TestStartRepairsASlotStoreTheBootLoaderContradicts: the slot store says
// slot B is Active and A Empty (its state file was unreadable during a
// trial of B), while the boot loader proves A, which booted. liken-node
// makes the store agree at start and says so in a Warning event; the
// machine is Ready, with B Failed and A Active, so it can download again.
func TestStartRepairsASlotStoreTheBootLoaderContradicts(t *testing.T) {
	e := newEnv(t, likenv1.RebootAuto)
	r := e.start()
	e.waitPhase(likenv1.MachineReady)
	assert.NilError(t, r.Stop())
	p := filepath.Join(e.m.Root, "state", "slots.json")
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	var st map[string]any
	assert.NilError(t, json.Unmarshal(b, &st))
	ss := st["slots"].([]any)
	ss[0].(map[string]any)["state"] = string(likenv1.SlotEmpty)
	ss[1].(map[string]any)["state"] = string(likenv1.SlotActive)
	b, err = json.Marshal(st)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(p, b, 0o644))

	r = e.m.StartIn(t, e.options(), r.Boot)
	m := e.waitFor("Ready with the store repaired", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && len(m.Status.Slots) == 2 && m.Status.Slots[1].State == likenv1.SlotFailed
	})
	assert.Equal(t, m.Status.Slots[0].State, likenv1.SlotActive)
	e.waitEvent(daemon.ReasonSlotStoreRepaired, "slot B was Active, but the boot loader proves slot A")
}
