// Package fleet holds the small facts about Clusters, Machines and Nodes
// that several cluster-operator controllers read the same way.
package fleet

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/rules"
)

// ByCluster is the name of the Machine informer index keyed by
// spec.cluster.
const ByCluster = "byCluster"

// Indexers is the Machine informer index set that MachinesOf needs.
var Indexers = cache.Indexers{ByCluster: indexByCluster}

func indexByCluster(obj any) ([]string, error) {
	m, ok := obj.(*likenv1.Machine)
	if !ok || m.Spec.Cluster == "" {
		return nil, nil
	}
	return []string{m.Spec.Cluster}, nil
}

// AddIndexers installs Indexers on a Machine informer (before it starts).
// It is safe to call more than once.
func AddIndexers(inf cache.SharedIndexInformer) error {
	if _, ok := inf.GetIndexer().GetIndexers()[ByCluster]; ok {
		return nil
	}
	return inf.AddIndexers(Indexers)
}

// Roster lists each cluster's machines in name order, remembering the
// order between calls: at 5,000 machines a sort was most of the cost of
// reading the fleet. Safe for concurrent use; the zero value is ready.
type Roster struct {
	mu     sync.Mutex
	orders map[string]*order
}

// order is a cluster's machine names in byte order, and each name's index.
type order struct {
	names []string
	rank  map[string]int
}

// MachinesOf lists the machines of cluster, sorted by name (byte order).
// The objects are shared with the cache: DeepCopy before changing one.
func (r *Roster) MachinesOf(indexer cache.Indexer, cluster string) ([]*likenv1.Machine, error) {
	objs, err := indexer.ByIndex(ByCluster, cluster)
	if err != nil {
		return nil, fmt.Errorf("listing machines of cluster %s: %w", cluster, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if out, ok := r.orders[cluster].place(objs); ok {
		return out, nil
	}
	// The membership changed (or this is the first call): sort, and
	// remember the order.
	out := make([]*likenv1.Machine, 0, len(objs))
	for _, o := range objs {
		if m, ok := o.(*likenv1.Machine); ok {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *likenv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	o := &order{names: make([]string, len(out)), rank: make(map[string]int, len(out))}
	for i, m := range out {
		o.names[i] = m.Name
		o.rank[m.Name] = i
	}
	if r.orders == nil {
		r.orders = map[string]*order{}
	}
	r.orders[cluster] = o
	return out, nil
}

// Forget drops what the roster remembers of cluster (it was deleted).
func (r *Roster) Forget(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.orders, cluster)
}

// place puts objs at their remembered ranks; ok is false unless objs are
// exactly the remembered machines (same count, every name known, none
// twice), in which case the result is in name order.
func (o *order) place(objs []any) ([]*likenv1.Machine, bool) {
	if o == nil || len(objs) != len(o.names) {
		return nil, false
	}
	out := make([]*likenv1.Machine, len(objs))
	for _, obj := range objs {
		m, ok := obj.(*likenv1.Machine)
		if !ok {
			return nil, false
		}
		i, ok := o.rank[m.Name]
		if !ok || out[i] != nil {
			return nil, false
		}
		out[i] = m
	}
	return out, true
}

// ClusterOfMachine is the queue key of the Cluster a Machine event
// concerns (deletion tombstones included); ok is false when there is none.
func ClusterOfMachine(obj any) (string, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(*likenv1.Machine)
	if !ok || m.Spec.Cluster == "" {
		return "", false
	}
	return m.Spec.Cluster, true
}

// NodeState is what the budget needs to know of a machine's Node.
type NodeState int

// Node states.
const (
	// NodeMissing: no Node object carries the machine's name (it has not
	// joined yet, or it was deleted). It does not count as NotReady; the
	// heartbeat decides whether the machine is Lost.
	NodeMissing NodeState = iota
	// NodeReady: the Node's Ready condition is True.
	NodeReady
	// NodeNotReady: the Node's Ready condition is False or Unknown, or
	// absent.
	NodeNotReady
)

// StateOf is the state of a machine's Node; n is nil when the machine
// has no Node.
func StateOf(n *corev1.Node) NodeState {
	if n == nil {
		return NodeMissing
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return NodeReady
			}
			return NodeNotReady
		}
	}
	return NodeNotReady
}

// ReadyHeartbeat is the lastHeartbeatTime of the Node's Ready condition:
// when its kubelet last posted it (zero when there is none).
func ReadyHeartbeat(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}

// TurnsString is the TURNS column: the machines of the ledger,
// comma-separated, in ledger order.
func TurnsString(turns []likenv1.RebootTurn) string {
	names := make([]string, 0, len(turns))
	for _, t := range turns {
		names = append(names, t.Machine)
	}
	return strings.Join(names, ",")
}

// Leaders are the names of the leader machines, sorted.
func Leaders(machines []*likenv1.Machine) []string {
	var out []string
	for _, m := range machines {
		if rules.IsLeader(m) {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// NewestVersion is the highest of the versions (YYYY.MM.DD-NNN sorts as
// text), or "" when there is none.
func NewestVersion(versions []string) string {
	newest := ""
	for _, v := range versions {
		if v > newest {
			newest = v
		}
	}
	return newest
}

// FindTurn returns the ledger entry of machine, or nil.
func FindTurn(turns []likenv1.RebootTurn, machine string) *likenv1.RebootTurn {
	for i := range turns {
		if turns[i].Machine == machine {
			return &turns[i]
		}
	}
	return nil
}

// SetCondition sets cond in conds (LastTransitionTime becomes now only
// when the status changes) and keeps conds sorted by type, so that writers
// of different conditions never reorder each other's.
func SetCondition(conds *[]metav1.Condition, cond metav1.Condition, now time.Time) {
	cond.LastTransitionTime = metav1.NewTime(now)
	meta.SetStatusCondition(conds, cond)
	slices.SortFunc(*conds, func(a, b metav1.Condition) int { return strings.Compare(a.Type, b.Type) })
}

// CordonedByLiken is true for a Node that liken cordoned for a turn: it is
// unschedulable and carries the annotation liken.sh/cordoned. A Node a
// person cordoned is left cordoned by liken and does not count.
func CordonedByLiken(n *corev1.Node) bool {
	_, ours := n.Annotations[likenv1.AnnotationCordoned]
	return n.Spec.Unschedulable && ours
}
