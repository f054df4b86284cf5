// Package node tests liken-node's drain against a real control plane:
// kube-apiserver, the disruption and DRA controllers of
// kube-controller-manager, kube-scheduler, and kwok's simulated kubelets.
package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/daemon/daemontest"
)

const version1 = "2026.11.01-001"

// machines are the identities the control plane knows; one per scenario.
var machines = []string{"m-pdb", "m-blocked", "m-claim"}

// env is one control plane shared by the scenarios of this package.
type env struct {
	t     *testing.T
	ctx   context.Context
	cp    *controlplane.ControlPlane
	kube  kubernetes.Interface
	liken versioned.Interface
	ch    *daemontest.Channel
	d1    string
}

func setup(t *testing.T) *env {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx}
	e.cp = controlplanetest.Start(t, controlplane.Options{Machines: machines})
	fleetsim.Install(ctx, t, e.cp)
	var err error
	e.kube, err = kubernetes.NewForConfig(e.cp.AdminConfig())
	assert.NilError(t, err)
	e.liken, err = versioned.NewForConfig(e.cp.AdminConfig())
	assert.NilError(t, err)
	e.ch = daemontest.NewChannel(t)
	e.d1 = e.ch.Publish(t, version1, 4<<10)
	return e
}

// scenario is one machine of its own Cluster, a spare node its pods move
// to, and a namespace for its workload.
type scenario struct {
	*env
	t       *testing.T
	name    string // the machine, its Node and its Cluster
	spare   string
	ns      string
	machine *daemontest.Machine
	run     *daemontest.Running
}

func (e *env) scenario(t *testing.T, name string, drainTimeout time.Duration) *scenario {
	s := &scenario{env: e, t: t, name: name, spare: name + "-spare", ns: name}
	ctx := e.ctx
	assert.NilError(t, e.cp.AddNode(ctx, name, nil))
	assert.NilError(t, e.cp.AddNode(ctx, s.spare, nil))
	s.setUnschedulable(s.spare, true) // the workload starts on the machine
	_, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = e.liken.LikenV1alpha1().Clusters().Create(ctx, &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: likenv1.ClusterSpec{
			Version:  version1,
			Releases: likenv1.ReleasesSpec{Source: e.ch.URL, Catalog: []likenv1.CatalogEntry{{Version: version1, Digest: e.d1}}},
			Network:  likenv1.NetworkSpec{Endpoint: "https://10.0.0.10:6443"},
			Disruption: likenv1.DisruptionSpec{
				DrainTimeout: &metav1.Duration{Duration: drainTimeout},
			},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = e.liken.LikenV1alpha1().Machines().Create(ctx, &likenv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       likenv1.MachineSpec{Cluster: name, Role: likenv1.RoleWorker, RebootPolicy: likenv1.RebootAuto},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	s.machine = daemontest.NewMachine(t, name, e.ch, version1)
	return s
}

// start runs liken-node for the machine with the machine's own identity.
func (s *scenario) start() {
	cfg := s.cp.Config("system:node:" + s.name)
	kube, err := kubernetes.NewForConfig(cfg)
	assert.NilError(s.t, err)
	lk, err := versioned.NewForConfig(cfg)
	assert.NilError(s.t, err)
	s.run = s.machine.Start(s.t, daemon.Options{Kube: kube, Liken: lk, Timing: daemon.Timing{
		Progress: 500 * time.Millisecond, Resync: 5 * time.Second,
		DrainPoll: 200 * time.Millisecond, EvictRetryMin: 200 * time.Millisecond, EvictRetryMax: time.Second, APIRetry: 500 * time.Millisecond,
	}})
}

func (s *scenario) setUnschedulable(node string, v bool) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, v)
	_, err := s.kube.CoreV1().Nodes().Patch(s.ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	assert.NilError(s.t, err)
}

func (s *scenario) getMachine() *likenv1.Machine {
	m, err := s.liken.LikenV1alpha1().Machines().Get(s.ctx, s.name, metav1.GetOptions{})
	assert.NilError(s.t, err)
	return m
}

func (s *scenario) waitMachine(what string, check func(*likenv1.Machine) bool, timeout time.Duration) *likenv1.Machine {
	s.t.Helper()
	var m *likenv1.Machine
	poll.WaitOn(s.t, func(poll.LogT) poll.Result {
		m = s.getMachine()
		if check(m) {
			return poll.Success()
		}
		return poll.Continue("%s: phase %s change %q conditions %v", what, m.Status.Phase, m.Status.Change, m.Status.Conditions)
	}, poll.WithTimeout(timeout), poll.WithDelay(100*time.Millisecond))
	return m
}

// requestTurn asks the machine for a reboot and grants the turn as
// cluster-operator would (the ledger entry), once the machine asks.
func (s *scenario) requestTurn() string {
	s.t.Helper()
	patch := `{"metadata":{"annotations":{"` + likenv1.AnnotationRequestReboot + `":"e2e"}}}`
	_, err := s.liken.LikenV1alpha1().Machines().Patch(s.ctx, s.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	assert.NilError(s.t, err)
	m := s.waitMachine("asking for a turn", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change != ""
	}, 30*time.Second)
	s.setLedger([]likenv1.RebootTurn{{Machine: s.name, Reason: likenv1.TurnReboot, Change: m.Status.Change, BootID: m.Status.Observed.BootID, GrantedAt: metav1.Now()}})
	return m.Status.Change
}

func (s *scenario) setLedger(turns []likenv1.RebootTurn) {
	s.t.Helper()
	c, err := s.liken.LikenV1alpha1().Clusters().Get(s.ctx, s.name, metav1.GetOptions{})
	assert.NilError(s.t, err)
	c.Status.RebootTurns = turns
	_, err = s.liken.LikenV1alpha1().Clusters().UpdateStatus(s.ctx, c, metav1.UpdateOptions{})
	assert.NilError(s.t, err)
}

func (s *scenario) waitReboot(timeout time.Duration) {
	s.t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.run.Wait() }()
	select {
	case err := <-done:
		assert.ErrorIs(s.t, err, daemon.ErrRebooted)
	case <-time.After(timeout):
		s.t.Fatalf("machine %s did not reboot within %s; status: %+v", s.name, timeout, s.getMachine().Status)
	}
}

// deployment creates a Deployment of n pods that may run on the machine
// and its spare, and waits until every pod is Ready on the machine.
func (s *scenario) deployment(name string, n int32, podSpec func(*corev1.PodSpec)) {
	s.t.Helper()
	labels := map[string]string{"app": name}
	spec := corev1.PodSpec{
		Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{s.name, s.spare},
			}}}},
		}}},
		Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists}},
	}
	if podSpec != nil {
		podSpec(&spec)
	}
	_, err := s.kube.AppsV1().Deployments(s.ns).Create(s.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}, metav1.CreateOptions{})
	assert.NilError(s.t, err)
	poll.WaitOn(s.t, func(poll.LogT) poll.Result {
		if got := s.readyOn(name, s.name); got != int(n) {
			return poll.Continue("%d of %d pods of %s Ready on %s", got, n, name, s.name)
		}
		return poll.Success()
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))
}

func (s *scenario) pods(app string) []corev1.Pod {
	l, err := s.kube.CoreV1().Pods(s.ns).List(s.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	assert.NilError(s.t, err)
	return l.Items
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (s *scenario) readyOn(app, node string) int {
	n := 0
	for _, p := range s.pods(app) {
		if p.Spec.NodeName == node && podReady(&p) {
			n++
		}
	}
	return n
}

func (s *scenario) pdb(name, app string, minAvailable, maxUnavailable *intstr.IntOrString) {
	s.t.Helper()
	_, err := s.kube.PolicyV1().PodDisruptionBudgets(s.ns).Create(s.ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: minAvailable, MaxUnavailable: maxUnavailable,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}, metav1.CreateOptions{})
	assert.NilError(s.t, err)
	poll.WaitOn(s.t, func(poll.LogT) poll.Result {
		p, err := s.kube.PolicyV1().PodDisruptionBudgets(s.ns).Get(s.ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.ObservedGeneration < p.Generation || p.Status.ExpectedPods == 0 {
			return poll.Continue("the disruption controller has not computed %s yet", name)
		}
		return poll.Success()
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))
}

// availabilityWatcher follows the pods of an app through a watch and
// remembers the fewest Ready pods ever seen.
type availabilityWatcher struct {
	mu     sync.Mutex
	ready  map[string]bool
	lowest int
	events int
	stop   func()
}

func (s *scenario) watchAvailability(app string) *availabilityWatcher {
	s.t.Helper()
	list, err := s.kube.CoreV1().Pods(s.ns).List(s.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	assert.NilError(s.t, err)
	w := &availabilityWatcher{ready: map[string]bool{}}
	for _, p := range list.Items {
		w.ready[p.Name] = podReady(&p)
	}
	w.lowest = w.count()
	ctx, cancel := context.WithCancel(s.ctx)
	wi, err := s.kube.CoreV1().Pods(s.ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + app, ResourceVersion: list.ResourceVersion})
	assert.NilError(s.t, err)
	done := make(chan struct{})
	w.stop = func() { cancel(); wi.Stop(); <-done }
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			w.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(w.ready, p.Name)
			} else {
				w.ready[p.Name] = podReady(p)
			}
			w.events++
			w.lowest = min(w.lowest, w.count())
			w.mu.Unlock()
		}
	}()
	s.t.Cleanup(func() { w.stop() })
	return w
}

func (w *availabilityWatcher) count() int {
	n := 0
	for _, r := range w.ready {
		if r {
			n++
		}
	}
	return n
}

func (w *availabilityWatcher) result() (lowest, events int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lowest, w.events
}

func TestDrain(t *testing.T) {
	e := setup(t)
	t.Run("PDBIsNeverViolated", e.pdbIsNeverViolated)
	t.Run("ZeroDisruptionsGiveDrainBlocked", e.zeroDisruptionsGiveDrainBlocked)
	t.Run("ClaimHoldersGoFirst", e.claimHoldersGoFirst)
}

// pdbIsNeverViolated drains a machine running 4 pods of a Deployment whose
// PodDisruptionBudget wants 3 available: a watch on the pods proves that
// fewer than 3 were never Ready, and the machine reboots once all 4 moved.
func (e *env) pdbIsNeverViolated(t *testing.T) {
	s := e.scenario(t, "m-pdb", time.Minute)
	s.deployment("web", 4, nil)
	s.pdb("web", "web", ptr.To(intstr.FromInt32(3)), nil)
	s.setUnschedulable(s.spare, false)
	w := s.watchAvailability("web")
	s.start()
	start := time.Now()
	change := s.requestTurn()
	s.waitReboot(2 * time.Minute)
	t.Logf("drain of 4 pods under minAvailable=3 and reboot took %s", time.Since(start).Round(time.Millisecond))
	lowest, events := w.result()
	t.Logf("fewest Ready pods seen: %d over %d watch events", lowest, events)
	assert.Assert(t, events > 8, "the watch saw the pods move")
	assert.Assert(t, lowest >= 3, "only %d pods were Ready at one point; the budget wants 3", lowest)
	assert.Equal(t, s.readyOn("web", s.name), 0)
	n, err := s.kube.CoreV1().Nodes().Get(s.ctx, s.name, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, n.Spec.Unschedulable)
	assert.Equal(t, n.Annotations[likenv1.AnnotationCordoned], change)

	// After the reboot the machine uncordons its node and reports Ready.
	s.start()
	s.waitMachine("Ready after the reboot", func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.ObservedRebootRequest == "e2e"
	}, time.Minute)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n, err := s.kube.CoreV1().Nodes().Get(s.ctx, s.name, metav1.GetOptions{})
		if err != nil || n.Spec.Unschedulable {
			return poll.Continue("node still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
}

// zeroDisruptionsGiveDrainBlocked: a budget that allows no disruption
// blocks the drain; past the drain timeout the machine reports
// DrainBlocked naming the pods and the budget, as a condition and as an
// event, and does not force anything. Taking the turn back uncordons.
func (e *env) zeroDisruptionsGiveDrainBlocked(t *testing.T) {
	s := e.scenario(t, "m-blocked", 3*time.Second)
	s.deployment("db", 2, nil)
	s.pdb("db-budget", "db", nil, ptr.To(intstr.FromInt32(0)))
	s.setUnschedulable(s.spare, false)
	s.start()
	change := s.requestTurn()
	m := s.waitMachine("DrainBlocked", func(m *likenv1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionDrainBlocked)
		return c != nil && c.Status == metav1.ConditionTrue
	}, time.Minute)
	msg := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionDrainBlocked).Message
	t.Logf("DrainBlocked: %s", msg)
	assert.Assert(t, is.Contains(msg, "m-blocked/db-budget"))
	for _, p := range s.pods("db") {
		assert.Assert(t, is.Contains(msg, "m-blocked/"+p.Name))
	}
	assert.Equal(t, m.Status.Phase, likenv1.MachineRebooting)
	assert.Equal(t, s.readyOn("db", s.name), 2, "nothing was forced")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		evs, err := s.kube.EventsV1().Events(metav1.NamespaceAll).List(s.ctx, metav1.ListOptions{})
		if err != nil {
			return poll.Continue("%v", err)
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == s.name && ev.Reason == likenv1.ConditionDrainBlocked && strings.Contains(ev.Note, "m-blocked/db-budget") {
				return poll.Success()
			}
		}
		return poll.Continue("no DrainBlocked event yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))

	s.setLedger(nil)
	s.waitMachine("turn given back", func(m *likenv1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionDrainBlocked)
		return m.Status.Phase == likenv1.MachineRebootPending && m.Status.Change == change && c != nil && c.Status == metav1.ConditionFalse
	}, 30*time.Second)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n, err := s.kube.CoreV1().Nodes().Get(s.ctx, s.name, metav1.GetOptions{})
		if err != nil || n.Spec.Unschedulable || n.Annotations[likenv1.AnnotationCordoned] != "" {
			return poll.Continue("node still cordoned")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	exited, _ := s.run.Exited()
	assert.Assert(t, !exited, "no reboot after the turn was taken back")
}

// claimHoldersGoFirst: a pod that holds a DRA ResourceClaim (allocated by
// the scheduler from a ResourceSlice of the machine) is evicted and gone
// before any other pod of the node is touched; a DaemonSet-like driver
// pod stays.
func (e *env) claimHoldersGoFirst(t *testing.T) {
	s := e.scenario(t, "m-claim", time.Minute)
	ctx := s.ctx
	driver := "gpu.example.com"
	_, err := s.kube.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", driver),
		}}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = s.kube.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.name + "-gpus"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(s.name),
			Pool:     resourcev1.ResourcePool{Name: s.name, ResourceSliceCount: 1},
			Devices:  []resourcev1.Device{{Name: "gpu-0"}},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	_, err = s.kube.ResourceV1().ResourceClaims(s.ns).Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu"},
		}}}},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)

	s.deployment("web", 3, nil)
	s.deployment("trainer", 1, func(p *corev1.PodSpec) {
		p.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("gpu")}}
		p.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	})
	// The driver's kubelet plugin: it registers through the kubelet's
	// plugin folder and must stay to unprepare the claim.
	s.deployment("gpu-driver", 1, func(p *corev1.PodSpec) {
		p.Volumes = []corev1.Volume{{Name: "registry", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins_registry"}}}}
	})
	claim, err := s.kube.ResourceV1().ResourceClaims(s.ns).Get(ctx, "gpu", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Assert(t, claim.Status.Allocation != nil, "the scheduler allocated the claim on the machine")
	s.setUnschedulable(s.spare, false)

	// Follow every pod of the namespace through one watch: its events
	// come in the order the API server applied them.
	list, err := s.kube.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wi, err := s.kube.CoreV1().Pods(s.ns).Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	assert.NilError(t, err)
	var timeline []string
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		seen := map[string]bool{}
		for ev := range wi.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.Spec.NodeName != s.name {
				continue
			}
			app := p.Labels["app"]
			mu.Lock()
			switch {
			case ev.Type == watch.Deleted:
				timeline = append(timeline, "gone:"+app)
			case p.DeletionTimestamp != nil && !seen[p.Name]:
				seen[p.Name] = true
				timeline = append(timeline, "evicted:"+app)
			}
			mu.Unlock()
		}
	}()

	s.start()
	s.requestTurn()
	s.waitReboot(2 * time.Minute)
	cancel()
	<-done
	t.Logf("timeline of the node's pods: %v", timeline)
	assert.Assert(t, len(timeline) >= 2)
	assert.Equal(t, timeline[0], "evicted:trainer")
	firstOther := -1
	goneTrainer := -1
	for i, ev := range timeline {
		if ev == "gone:trainer" && goneTrainer < 0 {
			goneTrainer = i
		}
		if strings.HasPrefix(ev, "evicted:") && ev != "evicted:trainer" && firstOther < 0 {
			firstOther = i
		}
	}
	assert.Assert(t, goneTrainer >= 0, "the claim holder left the node")
	assert.Assert(t, firstOther > goneTrainer, "another pod was evicted before the claim holder was gone: %v", timeline)
	assert.Equal(t, s.readyOn("web", s.name), 0, "the other pods left too")
	assert.Equal(t, s.readyOn("gpu-driver", s.name), 1, "the DRA driver pod stays")
}
