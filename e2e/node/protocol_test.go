package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/node/daemon/daemontest"
)

const version2 = "2026.11.20-001"

// fleet is a real control plane, a real cluster-operator process and
// liken-node daemons (in this process, as the machines' own identities)
// whose reboots the test's firmware loop carries out.
type fleet struct {
	t       *testing.T
	ctx     context.Context
	cp      *controlplane.ControlPlane
	kube    kubernetes.Interface
	liken   versioned.Interface
	ch      *daemontest.Channel
	digests map[string]string
	names   []string
	sims    map[string]*daemontest.Machine

	mu    sync.Mutex
	turns map[string][]likenv1.RebootTurn // every grant seen, per machine
	most  int                             // most turns held at once
}

func newFleet(t *testing.T, policies map[string]likenv1.RebootPolicy) *fleet {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fleet{t: t, ctx: ctx, digests: map[string]string{}, sims: map[string]*daemontest.Machine{}, turns: map[string][]likenv1.RebootTurn{}}
	f.names = []string{"n-1", "n-2", "n-3"}
	f.cp = controlplanetest.Start(t, controlplane.Options{Machines: f.names})
	fleetsim.Install(ctx, t, f.cp)
	var err error
	f.kube, err = kubernetes.NewForConfig(f.cp.AdminConfig())
	assert.NilError(t, err)
	f.liken, err = versioned.NewForConfig(f.cp.AdminConfig())
	assert.NilError(t, err)
	f.ch = daemontest.NewChannel(t)
	f.digests[version1] = f.ch.Publish(t, version1, 4<<10)
	f.digests[version2] = f.ch.Publish(t, version2, 64<<10)
	_, err = f.liken.LikenV1alpha1().Clusters().Create(ctx, &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet"},
		Spec: likenv1.ClusterSpec{
			Version: version1,
			Releases: likenv1.ReleasesSpec{Source: f.ch.URL, Catalog: []likenv1.CatalogEntry{
				{Version: version1, Digest: f.digests[version1]}, {Version: version2, Digest: f.digests[version2]},
			}},
			Network: likenv1.NetworkSpec{Endpoint: "https://10.0.0.10:6443"},
			Disruption: likenv1.DisruptionSpec{
				DrainTimeout: &metav1.Duration{Duration: time.Minute},
				TrialTimeout: &metav1.Duration{Duration: time.Minute},
				Settle:       &metav1.Duration{},
			},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	for i, n := range f.names {
		role := likenv1.RoleWorker
		if i == 0 {
			role = likenv1.RoleLeader
		}
		assert.NilError(t, f.cp.AddNode(ctx, n, nil))
		_, err := f.liken.LikenV1alpha1().Machines().Create(ctx, &likenv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec:       likenv1.MachineSpec{Cluster: "fleet", Role: role, RebootPolicy: policies[n]},
		}, metav1.CreateOptions{})
		assert.NilError(t, err)
		f.sims[n] = daemontest.NewMachine(t, n, f.ch, version1)
	}
	f.watchLedger()
	for _, n := range f.names {
		f.power(n)
	}
	f.startOperator()
	return f
}

// watchLedger records every turn the Cluster's ledger ever lists and the
// most turns held at once.
func (f *fleet) watchLedger() {
	w, err := f.liken.LikenV1alpha1().Clusters().Watch(f.ctx, metav1.ListOptions{})
	assert.NilError(f.t, err)
	go func() {
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*likenv1.Cluster)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			f.mu.Lock()
			f.most = max(f.most, len(c.Status.RebootTurns))
			for _, t := range c.Status.RebootTurns {
				known := false
				for _, k := range f.turns[t.Machine] {
					if k.Change == t.Change && k.GrantedAt.Equal(&t.GrantedAt) {
						known = true
					}
				}
				if !known {
					f.turns[t.Machine] = append(f.turns[t.Machine], t)
				}
			}
			f.mu.Unlock()
		}
	}()
	f.t.Cleanup(w.Stop)
}

func (f *fleet) grants(machine string) []likenv1.RebootTurn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]likenv1.RebootTurn(nil), f.turns[machine]...)
}

// power runs a machine: its daemon, and after each reboot the simulated
// firmware's next boot (the node reads NotReady while it reboots).
func (f *fleet) power(name string) {
	cfg := f.cp.Config("system:node:" + name)
	kube, err := kubernetes.NewForConfig(cfg)
	assert.NilError(f.t, err)
	lk, err := versioned.NewForConfig(cfg)
	assert.NilError(f.t, err)
	o := daemon.Options{Kube: kube, Liken: lk, Timing: daemon.Timing{
		Progress: 500 * time.Millisecond, Resync: 5 * time.Second,
		DrainPoll: 200 * time.Millisecond, APIRetry: 500 * time.Millisecond,
	}}
	// The Node's kubelet posts each boot's ID and a Ready heartbeat.
	admin, err := kubernetes.NewForConfig(f.cp.AdminConfig())
	assert.NilError(f.t, err)
	f.sims[name].OnBoot = func(bi daemon.BootInfo) {
		if err := controlplane.PostNodeBoot(f.ctx, admin, name, bi.BootID); err != nil && f.ctx.Err() == nil {
			f.t.Errorf("posting the Node status of %s: %v", name, err)
		}
	}
	go func() {
		for f.ctx.Err() == nil {
			r := f.sims[name].Start(f.t, o)
			select {
			case <-f.ctx.Done():
				_ = r.Stop()
				return
			case <-waitChan(r):
			}
			if err := r.Wait(); !errors.Is(err, daemon.ErrRebooted) {
				if err != nil && f.ctx.Err() == nil {
					f.t.Errorf("liken-node on %s stopped: %v", name, err)
				}
				return
			}
			_ = f.cp.SetPower(f.ctx, name, false)
			_ = f.cp.SetPower(f.ctx, name, true)
		}
	}()
}

func waitChan(r *daemontest.Running) <-chan struct{} {
	c := make(chan struct{})
	go func() { _ = r.Wait(); close(c) }()
	return c
}

func (f *fleet) startOperator() {
	fleetsim.StartOperator(f.t, f.cp, "op-1", "--startup-grace", "2s")
}

func (f *fleet) machine(name string) *likenv1.Machine {
	m, err := f.liken.LikenV1alpha1().Machines().Get(f.ctx, name, metav1.GetOptions{})
	assert.NilError(f.t, err)
	return m
}

func (f *fleet) waitAll(what string, check func(m *likenv1.Machine) bool, timeout time.Duration) {
	f.t.Helper()
	poll.WaitOn(f.t, func(poll.LogT) poll.Result {
		for _, n := range f.names {
			m := f.machine(n)
			if !check(m) {
				return poll.Continue("%s: %s is %s on %s (change %q, boot %s)", what, n, m.Status.Phase, m.Status.Version, m.Status.Change, m.Status.Observed.BootID)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(200*time.Millisecond))
}

func (f *fleet) patchCluster(patch string) {
	f.t.Helper()
	_, err := f.liken.LikenV1alpha1().Clusters().Patch(f.ctx, "fleet", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	assert.NilError(f.t, err)
}

func (f *fleet) annotate(machine, key, value string) {
	f.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	_, err := f.liken.LikenV1alpha1().Machines().Patch(f.ctx, machine, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	assert.NilError(f.t, err)
}

func ready(version string) func(*likenv1.Machine) bool {
	return func(m *likenv1.Machine) bool {
		return m.Status.Phase == likenv1.MachineReady && m.Status.Version == version
	}
}

// TestProtocolWithOperator runs the turn protocol end to end between the
// real cluster-operator and liken-node: a release rollout one machine at a
// time (the Manual machine only after its approval), a change of class
// Reboot that takes exactly one turn per machine, and an approval that
// covers only the change it named.
func TestProtocolWithOperator(t *testing.T) {
	f := newFleet(t, map[string]likenv1.RebootPolicy{"n-1": likenv1.RebootAuto, "n-2": likenv1.RebootAuto, "n-3": likenv1.RebootManual})
	f.waitAll("Ready on the first release", ready(version1), time.Minute)

	// A release: the Auto machines take turns; the Manual one waits.
	start := time.Now()
	f.patchCluster(`{"spec":{"version":"` + version2 + `"}}`)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, n := range []string{"n-1", "n-2"} {
			if m := f.machine(n); !ready(version2)(m) {
				return poll.Continue("%s is %s on %s", n, m.Status.Phase, m.Status.Version)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))
	m := f.machine("n-3")
	assert.Equal(t, m.Status.Phase, likenv1.MachineUpdatePending)
	rp := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionRebootPending)
	assert.Equal(t, rp.Reason, likenv1.ReasonAwaitingApproval)
	assert.Assert(t, len(f.grants("n-3")) == 0, "no turn for a machine that awaits approval")
	f.annotate("n-3", likenv1.AnnotationApprovedChange, m.Status.Change)
	f.waitAll("Ready on the new release", ready(version2), 2*time.Minute)
	t.Logf("release rollout of 3 machines took %s", time.Since(start).Round(time.Millisecond))
	for _, n := range f.names {
		assert.Equal(t, f.machine(n).Status.Slot, "B")
		assert.Equal(t, len(f.grants(n)), 1, "%s: one Release turn", n)
		assert.Equal(t, f.grants(n)[0].Reason, likenv1.TurnRelease)
	}

	// A Reboot change reaches every machine with exactly one turn each.
	boots := map[string]int{}
	for _, n := range f.names {
		boots[n] = f.sims[n].Boots()
	}
	f.patchCluster(`{"spec":{"settings":{"kernelArgs":["mitigations=auto"]}}}`)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, n := range []string{"n-1", "n-2"} {
			if m := f.machine(n); len(f.grants(n)) < 2 || !ready(version2)(m) {
				return poll.Continue("%s is %s with %d grants", n, m.Status.Phase, len(f.grants(n)))
			}
		}
		if m := f.machine("n-3"); m.Status.Change == "" {
			return poll.Continue("n-3 asks for no turn yet")
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))

	// n-3 (Manual): an approval of an earlier change does not approve a
	// newer one.
	first := f.machine("n-3").Status.Change
	_, err := f.liken.LikenV1alpha1().Machines().Patch(f.ctx, "n-3", types.MergePatchType,
		[]byte(`{"spec":{"kernelModules":[{"name":"vfio_pci"}]}}`), metav1.PatchOptions{})
	assert.NilError(t, err)
	var second string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		m := f.machine("n-3")
		if m.Status.Change != "" && m.Status.Change != first && m.Status.Phase == likenv1.MachineRebootPending {
			second = m.Status.Change
			return poll.Success()
		}
		return poll.Continue("n-3: %s change %q", m.Status.Phase, m.Status.Change)
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	f.annotate("n-3", likenv1.AnnotationApprovedChange, first)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		m := f.machine("n-3")
		rp := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionRebootPending)
		if m.Annotations[likenv1.AnnotationApprovedChange] == first && rp != nil && rp.Reason == likenv1.ReasonAwaitingApproval && m.Status.Change == second {
			return poll.Success()
		}
		return poll.Continue("n-3 %s", m.Status.Phase)
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	f.annotate("n-3", likenv1.AnnotationApprovedChange, second)
	f.waitAll("Ready after the Reboot change", func(m *likenv1.Machine) bool {
		return ready(version2)(m) && m.Status.Change == "" && len(m.Status.Pending) == 0
	}, 2*time.Minute)
	for _, n := range f.names {
		assert.Equal(t, f.sims[n].Boots()-boots[n], 1, "%s: exactly one reboot for the Reboot change", n)
	}
	g := f.grants("n-3")
	assert.Equal(t, len(g), 2, "n-3: the release turn and one turn for the approved change: %+v", g)
	assert.Equal(t, g[1].Change, second, "n-3 was granted a turn only for the change it approved last")
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, f.most, 1, "maxUnavailable 1: never two turns at once")
}
