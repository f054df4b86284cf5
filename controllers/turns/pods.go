package turns

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/eviction"
)

// Pod is what the drain check keeps of a pod (TrimPod), with the strings
// pods share interned: a few hundred bytes per pod, not a whole Pod
// (docs/benchmarks.md#the-drain-checks-pod-cache).
type Pod struct {
	namespace unique.Handle[string]
	// Name of the pod.
	Name string
	// ResourceVersion of the pod: the informer tells an update from a
	// resync by it.
	ResourceVersion string
	nodeName        unique.Handle[string]
	// Labels are the pod's labels, which PodDisruptionBudgets select.
	Labels PodLabels
	// Evicted: the drain of its node evicts it (eviction.Evicts, the node
	// daemon's own rule: DaemonSet, mirror, DRA driver and finished pods
	// stay).
	Evicted bool
	// TakesDisruption: its eviction takes a disruption from the budgets
	// that cover it (it is neither Pending nor being deleted).
	TakesDisruption bool
	// Finished: it succeeded or failed, and runs no more.
	Finished bool
	// DaemonSet: a DaemonSet controls it. Only such a pod and a Copy keep
	// Ready (and a DaemonSet pod Started), which the settle check reads.
	DaemonSet bool
	// Copy: it is a copy of cluster-operator (its Deployment's pod in
	// liken-system), which a leader's settle check counts.
	Copy bool
	// Ready: its Ready condition is True.
	Ready bool
	// Started is when the last of its containers started running; zero
	// while one is not running.
	Started time.Time
}

// Namespace of the pod.
func (p *Pod) Namespace() string { return p.namespace.Value() }

// NodeName is spec.nodeName.
func (p *Pod) NodeName() string { return p.nodeName.Value() }

// GetObjectMeta makes Pod an object the informer's cache can key
// (namespace/name) and tell apart by resourceVersion.
func (p *Pod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.Namespace(), Name: p.Name, ResourceVersion: p.ResourceVersion}
}

// key is namespace/name.
func (p *Pod) key() string { return p.Namespace() + "/" + p.Name }

// PodLabels are a pod's labels, interned as one string of key=value
// pairs sorted by key and separated by commas (neither character can
// appear in a label's key or value), and matched by a labels.Selector as
// a map would be.
type PodLabels struct{ h unique.Handle[string] }

// Has tells whether the label key is set.
func (l PodLabels) Has(key string) bool {
	_, ok := l.Lookup(key)
	return ok
}

// Get is the value of the label key, or "".
func (l PodLabels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Lookup is the value of the label key, and whether it is set.
func (l PodLabels) Lookup(key string) (string, bool) {
	if l == (PodLabels{}) {
		return "", false
	}
	for kv := range strings.SplitSeq(l.h.Value(), ",") {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

var _ labels.Labels = PodLabels{}

// podLabels packs m.
func podLabels(m map[string]string) PodLabels {
	if len(m) == 0 {
		return PodLabels{}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(m[k])
	}
	return PodLabels{unique.Make(b.String())}
}

// TrimPod is the pod informer's transform (cache.TransformFunc): it
// replaces a *corev1.Pod with the Pod the drain check needs, and passes
// anything else (a Pod already trimmed, a tombstone) through.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	evicted, takes := eviction.Evicts(p)
	out := &Pod{
		namespace:       unique.Make(p.Namespace),
		Name:            p.Name,
		ResourceVersion: p.ResourceVersion,
		nodeName:        unique.Make(p.Spec.NodeName),
		Labels:          podLabels(p.Labels),
		Evicted:         evicted,
		TakesDisruption: takes,
		Finished:        p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		out.DaemonSet = true
		out.Started = lastStarted(p)
	}
	out.Copy = p.Namespace == likenv1.SystemNamespace && p.Labels["app.kubernetes.io/name"] == likenv1.OperatorAppLabel
	if out.DaemonSet || out.Copy {
		out.Ready = slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		})
	}
	return out, nil
}

// lastStarted is when the last of pod's containers started running, or
// zero while one of them is not running.
func lastStarted(pod *corev1.Pod) time.Time {
	var last time.Time
	for _, cs := range pod.Status.ContainerStatuses {
		r := cs.State.Running
		if r == nil {
			return time.Time{}
		}
		if r.StartedAt.After(last) {
			last = r.StartedAt.Time
		}
	}
	return last
}

// TrimBudget is the PodDisruptionBudget informer's transform: it drops the
// managed fields and the annotations, which the drain check does not
// read.
func TrimBudget(obj any) (any, error) {
	if b, ok := obj.(*policyv1.PodDisruptionBudget); ok {
		b.ManagedFields, b.Annotations = nil, nil
	}
	return obj, nil
}

// ByNode is the name of the pod informer index keyed by spec.nodeName.
const ByNode = "byNode"

// ByCopy is the name of the pod informer index that holds cluster-operator's
// copies, under the key ByCopy.
const ByCopy = "byCopy"

// PodIndexers is the pod informer's index set: pods by node name, and
// cluster-operator's copies (an index by namespace would cost as much
// again as the one by node).
var PodIndexers = cache.Indexers{ByNode: indexByNode, ByCopy: indexCopies}

func indexCopies(obj any) ([]string, error) {
	if p, ok := obj.(*Pod); ok && p.Copy {
		return []string{ByCopy}, nil
	}
	return nil, nil
}

func indexByNode(obj any) ([]string, error) {
	if p, ok := obj.(*Pod); ok && p.NodeName() != "" {
		return []string{p.NodeName()}, nil
	}
	return nil, nil
}

// NewPodInformer is the pod informer of the drain check: every pod of the
// cluster, kept as Pod (TrimPod), indexed by node name only.
func NewPodInformer(client kubernetes.Interface) cache.SharedIndexInformer {
	inf := coreinformers.NewPodInformer(client, metav1.NamespaceAll, 0, PodIndexers)
	if err := inf.SetTransform(TrimPod); err != nil {
		panic(err) // not started yet: cannot fail
	}
	return inf
}

// samePod tells whether two versions of a pod read the same to the drain
// check: the pod's status changes often and means nothing to it.
func samePod(a, b *Pod) bool {
	return a.nodeName == b.nodeName && a.Evicted == b.Evicted && a.TakesDisruption == b.TakesDisruption && a.Labels == b.Labels &&
		a.Finished == b.Finished && a.Ready == b.Ready && a.Started.Equal(b.Started) && a.Copy == b.Copy
}

// budgetsReader reads the PodDisruptionBudgets and the pods of nodes from
// informer indexers, for one decision: it parses each budget's selector
// once.
type budgetsReader struct {
	pods, budgets cache.Indexer
	byNamespace   map[string][]budgetSelector
	allowed       map[string]int32
}

type budgetSelector struct {
	key string
	sel labels.Selector
}

// inNamespace are the budgets of namespace ns that cover some pod.
func (r *budgetsReader) inNamespace(ns string) ([]budgetSelector, error) {
	if out, ok := r.byNamespace[ns]; ok {
		return out, nil
	}
	objs, err := r.budgets.ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		return nil, fmt.Errorf("listing the PodDisruptionBudgets of namespace %s: %w", ns, err)
	}
	var out []budgetSelector
	for _, o := range objs {
		b, ok := o.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		sel, ok := eviction.BudgetSelector(b)
		if !ok {
			continue
		}
		key := b.Namespace + "/" + b.Name
		out = append(out, budgetSelector{key: key, sel: sel})
		r.allowed[key] = b.Status.DisruptionsAllowed
	}
	r.byNamespace[ns] = out
	return out, nil
}

// drainOf is what draining node would take from the budgets now: for
// each budget that covers a pod the drain evicts (and whose eviction
// takes a disruption), those pods. The zero Drain when it takes none.
func (r *budgetsReader) drainOf(node string) (Drain, error) {
	objs, err := r.pods.ByIndex(ByNode, node)
	if err != nil {
		return Drain{}, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	var d Drain
	for _, o := range objs {
		p, ok := o.(*Pod)
		if !ok || !p.Evicted || !p.TakesDisruption {
			continue
		}
		budgets, err := r.inNamespace(p.Namespace())
		if err != nil {
			return Drain{}, err
		}
		for _, b := range budgets {
			if !b.sel.Matches(p.Labels) {
				continue
			}
			if d.Needs == nil {
				d.Needs = map[string][]string{}
			}
			d.Needs[b.key] = append(d.Needs[b.key], p.key())
		}
	}
	for _, pods := range d.Needs {
		slices.Sort(pods)
	}
	return d, nil
}

// unsettled says what the workloads of machine node, back from a turn
// granted at grantedAt whose drain took disruptions from budgets, still
// lack: a budget without all of its pods healthy, a DaemonSet pod on it
// not Ready or, after a reboot, whose containers have not all started
// since the grant (a status the kubelet of the new boot has not written
// yet). Nil when nothing.
func (r *budgetsReader) unsettled(node string, budgets []string, grantedAt time.Time, rebooted bool) ([]string, error) {
	var out []string
	for _, key := range budgets {
		obj, exists, err := r.budgets.GetByKey(key)
		if err != nil {
			return nil, fmt.Errorf("reading PodDisruptionBudget %s: %w", key, err)
		}
		b, ok := obj.(*policyv1.PodDisruptionBudget)
		if !exists || !ok {
			continue // deleted: nothing to wait for
		}
		switch {
		case b.Status.ObservedGeneration < b.Generation:
			out = append(out, fmt.Sprintf("PodDisruptionBudget %s to be counted again since its last change", key))
		case b.Status.CurrentHealthy < b.Status.ExpectedPods:
			out = append(out, fmt.Sprintf("PodDisruptionBudget %s to have all of its pods healthy (%d of %d)", key, b.Status.CurrentHealthy, b.Status.ExpectedPods))
		}
	}
	objs, err := r.pods.ByIndex(ByNode, node)
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	var notReady, notStarted []string
	for _, o := range objs {
		p, ok := o.(*Pod)
		if !ok || !p.DaemonSet {
			continue
		}
		switch {
		case !p.Ready:
			notReady = append(notReady, p.key())
		case rebooted && p.Started.Before(grantedAt):
			notStarted = append(notStarted, p.key())
		}
	}
	if len(notReady) > 0 {
		slices.Sort(notReady)
		out = append(out, "DaemonSet pods "+listed(notReady)+" to be Ready")
	}
	if len(notStarted) > 0 {
		slices.Sort(notStarted)
		out = append(out, "DaemonSet pods "+listed(notStarted)+" to start again since the reboot")
	}
	return out, nil
}

// copiesWait says what a leader back from its turn waits for while fewer
// copies of cluster-operator are ready than its Deployment asks for
// (want): a drain took one away, and the next leader's drain would take
// another. Ready copies being deleted do not count. "" when none is
// missing.
func (r *budgetsReader) copiesWait(want int32) (string, error) {
	objs, err := r.pods.ByIndex(ByCopy, ByCopy)
	if err != nil {
		return "", fmt.Errorf("listing cluster-operator's copies: %w", err)
	}
	var ready int32
	for _, o := range objs {
		if p, ok := o.(*Pod); ok && p.Ready && p.TakesDisruption && !p.Finished {
			ready++
		}
	}
	if ready >= want {
		return "", nil
	}
	return fmt.Sprintf("cluster-operator to have all of its copies ready (%d of %d)", ready, want), nil
}

// listed joins the first maxListed names with commas, and counts the rest.
func listed(names []string) string {
	var l nameList
	for _, n := range names {
		l.add(n)
	}
	return l.String()
}

// drainNote describes the budgets that block a drain, for messages:
// "PodDisruptionBudget shop/web (0 disruptions allowed) covering pods
// shop/web-1".
func drainNote(blocks []drainBlock) string {
	parts := make([]string, 0, len(blocks))
	for i, b := range blocks {
		if i == maxListed {
			parts = append(parts, fmt.Sprintf("and %d more", len(blocks)-maxListed))
			break
		}
		allowed := fmt.Sprintf("%d disruptions allowed", b.allowed)
		if b.allowed == 1 {
			allowed = "1 disruption allowed"
		}
		if b.taken > 0 {
			allowed += fmt.Sprintf(", %d of them taken by the drains of turns already granted", min(b.taken, int(max(b.allowed, 0))))
		}
		pods := b.pods
		more := ""
		if len(pods) > maxListed {
			pods, more = pods[:maxListed], fmt.Sprintf(" and %d more", len(b.pods)-maxListed)
		}
		parts = append(parts, fmt.Sprintf("PodDisruptionBudget %s (%s) covering pods %s%s", b.budget, allowed, strings.Join(pods, ","), more))
	}
	return strings.Join(parts, "; ")
}
