// Package fleet holds the small facts about Clusters, Machines and Nodes
// that several cluster-operator controllers read the same way.
package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
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

// MachinesOf lists the machines of cluster from a Machine informer's
// indexer, sorted by name (byte order). The objects are shared with the
// cache: DeepCopy before changing one.
func MachinesOf(indexer cache.Indexer, cluster string) ([]*likenv1.Machine, error) {
	objs, err := indexer.ByIndex(ByCluster, cluster)
	if err != nil {
		return nil, fmt.Errorf("listing machines of cluster %s: %w", cluster, err)
	}
	out := make([]*likenv1.Machine, 0, len(objs))
	for _, o := range objs {
		if m, ok := o.(*likenv1.Machine); ok {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *likenv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
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

// NodeStateOf reads the Node named like the machine.
func NodeStateOf(nodes corelisters.NodeLister, name string) (NodeState, *corev1.Node, error) {
	n, err := nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return NodeMissing, nil, nil
	}
	if err != nil {
		return NodeMissing, nil, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return NodeReady, n, nil
			}
			return NodeNotReady, n, nil
		}
	}
	return NodeNotReady, n, nil
}

// IsLeader is true for a machine with role Leader.
func IsLeader(m *likenv1.Machine) bool { return m.Spec.Role == likenv1.RoleLeader }

// IsManual is true unless the machine's rebootPolicy is Auto (Manual is
// the default).
func IsManual(m *likenv1.Machine) bool { return m.Spec.RebootPolicy != likenv1.RebootAuto }

// Approved is true when a person approved exactly the change the machine
// staged (annotation liken.sh/approved-change equals status.change).
func Approved(m *likenv1.Machine, change string) bool {
	return change != "" && m.Annotations[likenv1.AnnotationApprovedChange] == change
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
		if IsLeader(m) {
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
