package operator

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
)

const (
	clusterName = "lab"
	version1    = "2026.11.01-001"
	version2    = "2026.11.20-001"
)

var digest1, digest2 = "sha256:" + strings.Repeat("1", 64), "sha256:" + strings.Repeat("2", 64)

// fleetSpec describes the simulated fleet of a test.
type fleetSpec struct {
	leaders, workers int
	maxUnavailable   string
	// rebootFor is how long a simulated reboot keeps a machine down.
	rebootFor time.Duration
	// renewEvery is the heartbeat period of every machine.
	renewEvery time.Duration
	// silentKubelets: back from a reboot, no machine posts its Node's
	// Ready; the test does.
	silentKubelets bool
}

// env is a real control plane with liken's manifests, one Cluster, its
// Machines simulated from the test (status and heartbeat written as the
// machines' own identities), and cluster-operator processes.
type env struct {
	t        *testing.T
	ctx      context.Context
	cp       *controlplane.ControlPlane
	liken    versioned.Interface
	kube     kubernetes.Interface
	machines map[string]*fleetsim.Machine
	names    []string
	spec     fleetSpec
	channel  *httptest.Server
}

func setup(t *testing.T, spec fleetSpec) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, machines: map[string]*fleetsim.Machine{}, spec: spec}
	for i := range spec.leaders + spec.workers {
		e.names = append(e.names, fmt.Sprintf("node-%d", i+1))
	}
	e.cp = controlplanetest.Start(t, controlplane.Options{Machines: e.names})
	fleetsim.Install(ctx, t, e.cp)
	var err error
	e.liken, err = versioned.NewForConfig(e.cp.AdminConfig())
	assert.NilError(t, err)
	e.kube, err = kubernetes.NewForConfig(e.cp.AdminConfig())
	assert.NilError(t, err)

	e.channel = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/liken/index.yaml" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "apiVersion: liken.sh/v1alpha1\nkind: ReleaseIndex\nreleases:\n"+
			"- {version: %q, digest: %q, published: 2026-11-01T10:00:00Z}\n"+
			"- {version: %q, digest: %q, published: 2026-11-20T10:00:00Z}\n", version1, digest1, version2, digest2)
	}))
	t.Cleanup(e.channel.Close)

	mu := intstr.Parse(spec.maxUnavailable)
	_, err = e.liken.LikenV1alpha1().Clusters().Create(ctx, &likenv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: clusterName},
		Spec: likenv1.ClusterSpec{
			Version: version1,
			Releases: likenv1.ReleasesSpec{
				Source:  e.channel.URL + "/liken",
				Catalog: []likenv1.CatalogEntry{{Version: version1, Digest: digest1}, {Version: version2, Digest: digest2}},
			},
			Network: likenv1.NetworkSpec{Endpoint: e.cp.Server},
			// Settle 0s: the simulated machines run no workloads to wait
			// for, and the tests time the turns.
			Disruption: likenv1.DisruptionSpec{MaxUnavailable: &mu, Settle: &metav1.Duration{}},
		},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)

	for i, name := range e.names {
		role := likenv1.RoleWorker
		if i < spec.leaders {
			role = likenv1.RoleLeader
		}
		assert.NilError(t, e.cp.AddNode(ctx, name, nil))
		_, err := e.liken.LikenV1alpha1().Machines().Create(ctx, &likenv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       likenv1.MachineSpec{Cluster: clusterName, Role: role, RebootPolicy: likenv1.RebootAuto},
		}, metav1.CreateOptions{})
		assert.NilError(t, err)
		e.machines[name] = fleetsim.StartMachine(ctx, t, e.cp, name, fleetsim.MachineOptions{
			Cluster: clusterName, Version: version1, Tick: 200 * time.Millisecond, RenewEvery: spec.renewEvery, RebootFor: spec.rebootFor,
			PowerOff: spec.rebootFor > 0, SilentKubelet: spec.silentKubelets,
		})
	}
	return e
}

func (e *env) cluster() *likenv1.Cluster {
	e.t.Helper()
	c, err := e.liken.LikenV1alpha1().Clusters().Get(e.ctx, clusterName, metav1.GetOptions{})
	assert.NilError(e.t, err)
	return c
}

func (e *env) machine(name string) *likenv1.Machine {
	e.t.Helper()
	m, err := e.liken.LikenV1alpha1().Machines().Get(e.ctx, name, metav1.GetOptions{})
	assert.NilError(e.t, err)
	return m
}

// setVersion points spec.version at v.
func (e *env) setVersion(v string) {
	e.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"version":%q}}`, v)
	_, err := e.liken.LikenV1alpha1().Clusters().Patch(e.ctx, clusterName, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
	assert.NilError(e.t, err)
}

// setMaxUnavailable sets spec.disruption.maxUnavailable ("2" or "40%").
func (e *env) setMaxUnavailable(v string) {
	e.t.Helper()
	val := v
	if !strings.HasSuffix(v, "%") {
		val = strings.TrimSpace(v)
	} else {
		val = strconv.Quote(v)
	}
	patch := fmt.Sprintf(`{"spec":{"disruption":{"maxUnavailable":%s}}}`, val)
	_, err := e.liken.LikenV1alpha1().Clusters().Patch(e.ctx, clusterName, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{})
	assert.NilError(e.t, err)
}

// holder is the identity holding the operator Lease.
func (e *env) holder() string {
	l, err := e.kube.CoordinationV1().Leases(likenv1.SystemNamespace).Get(e.ctx, likenv1.OperatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (e *env) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	poll.WaitOn(e.t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("waiting for %s", what)
	}, poll.WithTimeout(timeout), poll.WithDelay(200*time.Millisecond))
}

// waitRolledOut waits until every machine runs v and the Cluster reads
// Ready with an empty ledger.
func (e *env) waitRolledOut(v string, timeout time.Duration) {
	e.t.Helper()
	e.waitFor("the rollout to "+v, timeout, func() bool {
		c := e.cluster()
		return c.Status.Phase == likenv1.ClusterReady && c.Status.Machines == fmt.Sprintf("%d/%d", len(e.names), len(e.names)) &&
			len(c.Status.RebootTurns) == 0 && c.Spec.Version == v
	})
}

func progressing(c *likenv1.Cluster) metav1.Condition {
	if p := meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionProgressing); p != nil {
		return *p
	}
	return metav1.Condition{}
}

// startOperator runs the cluster-operator binary as
// liken:cluster-operator with the given extra flags.
func (e *env) startOperator(id string, flags ...string) *fleetsim.Operator {
	e.t.Helper()
	return fleetsim.StartOperator(e.t, e.cp, id, flags...)
}

// ledgerRecorder watches every version of the Cluster, the Machines and
// the Nodes (etcd revisions order them all), to check the budget
// afterwards against what was actually written.
type ledgerRecorder struct {
	mu       sync.Mutex
	clusters []clusterVersion
	// unavailable history per machine: Lost phase and NotReady node.
	lost, notReady map[string][]flag
	gaps           []string
}

type clusterVersion struct {
	rv    int64
	at    time.Time
	obj   *likenv1.Cluster
	total int
}

type flag struct {
	rv int64
	on bool
}

func (e *env) record() *ledgerRecorder {
	r := &ledgerRecorder{lost: map[string][]flag{}, notReady: map[string][]flag{}}
	clusters := e.liken.LikenV1alpha1().Clusters()
	machines := e.liken.LikenV1alpha1().Machines()
	nodes := e.kube.CoreV1().Nodes()
	watchAll := func(name string, list func(metav1.ListOptions) (runtime.Object, error), w func(metav1.ListOptions) (watch.Interface, error), seen func(rv int64, obj any)) {
		ready := make(chan struct{})
		go func() {
			rv, items, err := listItems(list)
			if err != nil {
				r.gap(name + " list: " + err.Error())
				close(ready)
				return
			}
			for _, o := range items {
				seen(rvOf(o), o)
			}
			close(ready)
			for e.ctx.Err() == nil {
				wi, err := w(metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
				if err != nil {
					if e.ctx.Err() == nil {
						r.gap(name + " watch: " + err.Error())
					}
					return
				}
				for ev := range wi.ResultChan() {
					if ev.Type == watch.Error {
						r.gap(fmt.Sprintf("%s watch error: %v", name, apierrors.FromObject(ev.Object)))
						wi.Stop()
						return
					}
					acc, err := meta.Accessor(ev.Object)
					if err != nil {
						continue
					}
					rv = acc.GetResourceVersion()
					if ev.Type != watch.Bookmark {
						seen(rvOf(ev.Object), ev.Object)
					}
				}
			}
		}()
		<-ready
	}
	total := len(e.names)
	watchAll("clusters", func(o metav1.ListOptions) (runtime.Object, error) { return clusters.List(e.ctx, o) }, func(o metav1.ListOptions) (watch.Interface, error) { return clusters.Watch(e.ctx, o) }, func(rv int64, obj any) {
		c := obj.(*likenv1.Cluster)
		r.mu.Lock()
		r.clusters = append(r.clusters, clusterVersion{rv: rv, at: time.Now(), obj: c.DeepCopy(), total: total})
		r.mu.Unlock()
	})
	watchAll("machines", func(o metav1.ListOptions) (runtime.Object, error) { return machines.List(e.ctx, o) }, func(o metav1.ListOptions) (watch.Interface, error) { return machines.Watch(e.ctx, o) }, func(rv int64, obj any) {
		m := obj.(*likenv1.Machine)
		r.set(r.lost, m.Name, rv, m.Status.Phase == likenv1.MachineLost)
	})
	watchAll("nodes", func(o metav1.ListOptions) (runtime.Object, error) { return nodes.List(e.ctx, o) }, func(o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(e.ctx, o) }, func(rv int64, obj any) {
		n := obj.(*corev1.Node)
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		r.set(r.notReady, n.Name, rv, !ready)
	})
	return r
}

// listItems runs list and returns the list's revision and its items.
func listItems(list func(metav1.ListOptions) (runtime.Object, error)) (string, []runtime.Object, error) {
	l, err := list(metav1.ListOptions{})
	if err != nil {
		return "", nil, err
	}
	acc, err := meta.ListAccessor(l)
	if err != nil {
		return "", nil, err
	}
	items, err := meta.ExtractList(l)
	return acc.GetResourceVersion(), items, err
}

func rvOf(obj any) int64 {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(acc.GetResourceVersion(), 10, 64)
	return n
}

func (r *ledgerRecorder) gap(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gaps = append(r.gaps, s)
}

func (r *ledgerRecorder) set(m map[string][]flag, name string, rv int64, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m[name] = append(m[name], flag{rv: rv, on: on})
}

// at is the value of a flag history at revision rv.
func at(h []flag, rv int64) bool {
	on := false
	for _, f := range h {
		if f.rv <= rv {
			on = f.on
		}
	}
	return on
}

// grant is one turn as recorded.
type grant struct {
	machine string
	leader  bool
	at      time.Time
	rv      int64
	// seen is when the recorder received the version that added it.
	seen time.Time
}

// grants lists every distinct turn recorded, in order.
func (r *ledgerRecorder) grants() []grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []grant
	for _, v := range r.clusters {
		for _, t := range v.obj.Status.RebootTurns {
			k := t.Machine + "@" + t.GrantedAt.UTC().Format(time.RFC3339)
			if !seen[k] {
				seen[k] = true
				out = append(out, grant{machine: t.Machine, leader: t.Leader, at: t.GrantedAt.Time, rv: v.rv, seen: v.at})
			}
		}
	}
	return out
}

// check proves the contract over every recorded version of the Cluster:
// the ledger never exceeded maxUnavailable and never held two leaders;
// at every version that added a turn, turns plus machines Lost or NotReady
// without a turn stayed within maxUnavailable, and no leader got a turn
// while another leader was down. It returns the number of versions.
func (r *ledgerRecorder) check(t *testing.T) int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Assert(t, len(r.gaps) == 0, "the recording has gaps: %v", r.gaps)
	var problems []string
	prev := map[string]bool{}
	for _, v := range r.clusters {
		c := v.obj
		max, err := c.Spec.Disruption.MaxUnavailableFor(v.total)
		assert.NilError(t, err)
		turns := c.Status.RebootTurns
		inLedger := map[string]bool{}
		leaders := 0
		for _, tr := range turns {
			inLedger[tr.Machine] = true
			if tr.Leader {
				leaders++
			}
		}
		if len(turns) > max {
			problems = append(problems, fmt.Sprintf("rv %d: %d turns (%s) over maxUnavailable %d", v.rv, len(turns), c.Status.Turns, max))
		}
		if leaders > 1 {
			problems = append(problems, fmt.Sprintf("rv %d: %d leaders hold turns (%s)", v.rv, leaders, c.Status.Turns))
		}
		for _, tr := range turns {
			if prev[tr.Machine] {
				continue
			}
			// A new grant: check the whole budget at this revision.
			down := 0
			var downNames []string
			leaderDown := false
			for name, h := range r.lost {
				if !inLedger[name] && (at(h, v.rv) || at(r.notReady[name], v.rv)) {
					down++
					downNames = append(downNames, name)
				}
			}
			for _, other := range turns {
				if other.Machine != tr.Machine && other.Leader {
					leaderDown = true
				}
			}
			for _, l := range c.Status.Leaders {
				if l != tr.Machine && (at(r.lost[l], v.rv) || at(r.notReady[l], v.rv)) {
					leaderDown = true
				}
			}
			if len(turns)+down > max {
				problems = append(problems, fmt.Sprintf("rv %d: granting %s made %d turns (%s) + %d down without a turn (%v) over maxUnavailable %d",
					v.rv, tr.Machine, len(turns), c.Status.Turns, down, downNames, max))
			}
			if tr.Leader && leaderDown {
				problems = append(problems, fmt.Sprintf("rv %d: leader %s got a turn while another leader held one or was down (%s)", v.rv, tr.Machine, c.Status.Turns))
			}
		}
		prev = inLedger
	}
	assert.Assert(t, len(problems) == 0, "the contract was broken:\n%s", strings.Join(problems, "\n"))
	return len(r.clusters)
}

// serviceAccountToken creates the service account name in liken-system,
// bound to the ClusterRole liken:metrics-reader when reader, and returns a
// token for it (TokenRequest), as a metrics scraper in the cluster has.
func (e *env) serviceAccountToken(name string, reader bool) string {
	e.t.Helper()
	_, err := e.kube.CoreV1().ServiceAccounts(likenv1.SystemNamespace).Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	assert.NilError(e.t, err)
	if reader {
		_, err := e.kube.RbacV1().ClusterRoleBindings().Create(e.ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "liken:metrics-reader:" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "liken:metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: likenv1.SystemNamespace}},
		}, metav1.CreateOptions{})
		assert.NilError(e.t, err)
	}
	tr, err := e.kube.CoreV1().ServiceAccounts(likenv1.SystemNamespace).CreateToken(e.ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	assert.NilError(e.t, err)
	return tr.Status.Token
}
