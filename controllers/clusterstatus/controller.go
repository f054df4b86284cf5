// Package clusterstatus is the status controller: it keeps a Cluster's
// phase, the MACHINES, LEADERS, NEWEST and ENDPOINT columns, the TURNS
// column, the Ready condition and observedGeneration up to date.
package clusterstatus

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/fleet"
	"liken.sh/liken/controllers/internal/metrics"
	"liken.sh/liken/controllers/internal/worker"
	likeninformers "liken.sh/liken/generated/informers/externalversions/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
)

// FieldManager is the field manager of the status controller's writes.
const FieldManager = "cluster-operator-status"

// Reasons of the Cluster's Ready condition.
const (
	// ReasonAllMachinesReady: every machine is Ready on spec.version.
	ReasonAllMachinesReady = "AllMachinesReady"
	// ReasonMachinesNotReady: some machine is not Ready on spec.version.
	ReasonMachinesNotReady = "MachinesNotReady"
	// ReasonNoMachines: the cluster has no Machine yet.
	ReasonNoMachines = "NoMachines"
)

// Phases counted by the machines-by-phase metric; a machine without a
// phase counts as Unknown.
var phases = []likenv1.MachinePhase{
	likenv1.MachineReady, likenv1.MachineDownloading, likenv1.MachineUpdatePending, likenv1.MachineRebootPending,
	likenv1.MachineUpdating, likenv1.MachineRebooting, likenv1.MachineLost, likenv1.MachineDegraded, "Unknown",
}

// StatusWriter is the one write the status controller makes.
type StatusWriter interface {
	UpdateStatus(ctx context.Context, c *likenv1.Cluster, opts metav1.UpdateOptions) (*likenv1.Cluster, error)
}

// Config is what the status controller needs.
type Config struct {
	Clusters likeninformers.ClusterInformer
	Machines likeninformers.MachineInformer
	Writer   StatusWriter
	Metrics  *metrics.Metrics
	Clock    clock.WithTicker
}

// Controller is the status controller.
type Controller struct {
	cfg      Config
	clusters likenlisters.ClusterLister
	machines cache.Indexer
	queue    *worker.Queue
	synced   []cache.InformerSynced
}

// New wires the controller to its informers. Call before they start.
func New(cfg Config) (*Controller, error) {
	if err := fleet.AddIndexers(cfg.Machines.Informer()); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, clusters: cfg.Clusters.Lister(), machines: cfg.Machines.Informer().GetIndexer()}
	c.queue = worker.New("clusterstatus", cfg.Clock, c.sync)
	c.synced = []cache.InformerSynced{cfg.Clusters.Informer().HasSynced, cfg.Machines.Informer().HasSynced}
	onCluster := func(obj any) {
		if k, ok := worker.KeyOf(obj); ok {
			c.queue.Add(k)
		}
	}
	onMachine := func(obj any) {
		if k, ok := fleet.ClusterOfMachine(obj); ok {
			c.queue.Add(k)
		}
	}
	for inf, fn := range map[cache.SharedIndexInformer]func(any){
		cfg.Clusters.Informer(): onCluster,
		cfg.Machines.Informer(): onMachine,
	} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: fn, UpdateFunc: func(_, n any) { fn(n) }, DeleteFunc: fn,
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return c.queue.Run(ctx, workers, c.synced...)
}

// Sync updates the status of the cluster named key (tests drive it
// directly).
func (c *Controller) Sync(ctx context.Context, key string) (time.Duration, error) {
	return c.sync(ctx, key)
}

func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	cluster, err := c.clusters.Get(key)
	if apierrors.IsNotFound(err) {
		c.cfg.Metrics.Machines.DeletePartialMatch(map[string]string{"cluster": key})
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	machines, err := fleet.MachinesOf(c.machines, cluster.Name)
	if err != nil {
		return 0, err
	}
	c.countPhases(cluster.Name, machines)
	st := Compute(cluster, machines, c.cfg.Clock.Now())
	if equality.Semantic.DeepEqual(cluster.Status, st) {
		return 0, nil
	}
	updated := cluster.DeepCopy()
	updated.Status = st
	if _, err := c.cfg.Writer.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return 0, fmt.Errorf("writing the status of cluster %s: %w", cluster.Name, err)
	}
	if cluster.Status.Phase != st.Phase {
		klog.FromContext(ctx).Info("Cluster phase changed", "cluster", klog.KObj(cluster), "from", cluster.Status.Phase, "to", st.Phase, "machines", st.Machines)
	}
	return 0, nil
}

func (c *Controller) countPhases(cluster string, machines []*likenv1.Machine) {
	counts := map[likenv1.MachinePhase]int{}
	for _, m := range machines {
		p := m.Status.Phase
		if !slices.Contains(phases, p) {
			p = "Unknown"
		}
		counts[p]++
	}
	for _, p := range phases {
		c.cfg.Metrics.Machines.WithLabelValues(cluster, string(p)).Set(float64(counts[p]))
	}
}

// Compute returns the cluster's status with the fields this controller
// owns brought up to date; the other fields are kept as read.
func Compute(c *likenv1.Cluster, machines []*likenv1.Machine, now time.Time) likenv1.ClusterStatus {
	st := *c.Status.DeepCopy()
	ready, settled := 0, 0
	var behind []string
	for _, m := range machines {
		onTarget := m.Status.Version == c.Spec.Version
		if onTarget && m.Status.Phase == likenv1.MachineReady {
			ready++
		} else {
			behind = append(behind, describe(m, c.Spec.Version))
		}
		if onTarget && m.Status.Change == "" && len(m.Status.Pending) == 0 {
			settled++
		}
	}
	st.Machines = fmt.Sprintf("%d/%d", ready, len(machines))
	st.Phase = likenv1.ClusterUpdating
	if settled == len(machines) && len(st.RebootTurns) == 0 {
		st.Phase = likenv1.ClusterReady
	}
	st.Leaders = fleet.Leaders(machines)
	st.Endpoint = c.Spec.Network.Endpoint
	st.Turns = fleet.TurnsString(st.RebootTurns)
	versions := make([]string, 0, len(c.Spec.Releases.Catalog))
	for _, e := range c.Spec.Releases.Catalog {
		versions = append(versions, e.Version)
	}
	st.Releases.Newest = fleet.NewestVersion(versions)
	st.ObservedGeneration = c.Generation

	cond := metav1.Condition{Type: likenv1.ConditionReady, ObservedGeneration: c.Generation}
	switch {
	case len(machines) == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNoMachines
		cond.Message = fmt.Sprintf("No Machine names cluster %s in spec.cluster yet.", c.Name)
	case len(behind) == 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonAllMachinesReady
		cond.Message = fmt.Sprintf("All %d machines are Ready on %s.", len(machines), c.Spec.Version)
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonMachinesNotReady
		const show = 8
		list := strings.Join(behind[:min(show, len(behind))], ", ")
		if len(behind) > show {
			list += fmt.Sprintf(" and %d more", len(behind)-show)
		}
		cond.Message = fmt.Sprintf("%d of %d machines are not Ready on %s: %s.", len(behind), len(machines), c.Spec.Version, list)
	}
	fleet.SetCondition(&st.Conditions, cond, now)
	return st
}

// describe says in a few words where a machine stands.
func describe(m *likenv1.Machine, target string) string {
	phase := string(m.Status.Phase)
	if phase == "" {
		phase = "no status yet"
	}
	if m.Status.Version != "" && m.Status.Version != target {
		return fmt.Sprintf("%s (%s, runs %s)", m.Name, phase, m.Status.Version)
	}
	return fmt.Sprintf("%s (%s)", m.Name, phase)
}
