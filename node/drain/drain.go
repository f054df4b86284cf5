// Package drain cordons a machine's own node and drains it through the
// Eviction API, so PodDisruptionBudgets apply and nothing is ever forced.
package drain

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/eviction"
)

// Cordon marks node unschedulable. When liken makes the change it records
// it with the annotation liken.sh/cordoned=value and returns true; a node
// someone else cordoned is left alone and Cordon returns false (liken will
// not uncordon it). A node liken cordoned earlier returns true.
func Cordon(ctx context.Context, c kubernetes.Interface, node, value string) (bool, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading node %s to cordon it: %w", node, err)
	}
	if _, ours := n.Annotations[likenv1.AnnotationCordoned]; ours {
		if n.Spec.Unschedulable {
			return true, nil
		}
	} else if n.Spec.Unschedulable {
		klog.FromContext(ctx).Info("Node was already cordoned by someone else; liken will leave it cordoned", "node", node)
		return false, nil
	}
	patch := map[string]any{
		"metadata": map[string]any{
			"annotations":     map[string]any{likenv1.AnnotationCordoned: value},
			"resourceVersion": n.ResourceVersion,
		},
		"spec": map[string]any{"unschedulable": true},
	}
	if err := patchNode(ctx, c, node, patch); err != nil {
		return false, fmt.Errorf("cordoning node %s: %w", node, err)
	}
	klog.FromContext(ctx).Info("Cordoned node", "node", node)
	return true, nil
}

// Uncordon makes node schedulable again, but only if liken cordoned it
// (the annotation liken.sh/cordoned is present); it removes the
// annotation. It returns whether it changed the node.
func Uncordon(ctx context.Context, c kubernetes.Interface, node string) (bool, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading node %s to uncordon it: %w", node, err)
	}
	if _, ours := n.Annotations[likenv1.AnnotationCordoned]; !ours {
		return false, nil
	}
	patch := map[string]any{
		"metadata": map[string]any{
			"annotations":     map[string]any{likenv1.AnnotationCordoned: nil},
			"resourceVersion": n.ResourceVersion,
		},
		"spec": map[string]any{"unschedulable": nil},
	}
	if err := patchNode(ctx, c, node, patch); err != nil {
		return false, fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	klog.FromContext(ctx).Info("Uncordoned node that liken had cordoned", "node", node)
	return true, nil
}

func patchNode(ctx context.Context, c kubernetes.Interface, node string, patch map[string]any) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{FieldManager: "liken-node"})
	return err
}

// Blocked describes a drain that could not finish within its timeout.
type Blocked struct {
	// Since is when the drain started.
	Since time.Time
	// Pods are the pods still waiting to go, as namespace/name.
	Pods []string
	// PDBs are the PodDisruptionBudgets that refused an eviction, as
	// namespace/name.
	PDBs []string
	// Errors are other reasons evictions failed, one per pod.
	Errors []string
}

// Message says what blocks the drain and what a person can do.
func (b Blocked) Message(node string, timeout time.Duration) string {
	var s strings.Builder
	fmt.Fprintf(&s, "the drain of node %s has not finished after %s: ", node, timeout)
	if len(b.Pods) > 0 {
		fmt.Fprintf(&s, "pods %s are still on the node", strings.Join(b.Pods, ", "))
	} else {
		s.WriteString("no pod is left but the drain is not done")
	}
	if len(b.PDBs) > 0 {
		fmt.Fprintf(&s, "; PodDisruptionBudgets %s allow no more disruptions", strings.Join(b.PDBs, ", "))
	}
	if len(b.Errors) > 0 {
		fmt.Fprintf(&s, "; evictions failed: %s", strings.Join(b.Errors, "; "))
	}
	s.WriteString(". liken never forces a drain: make room for the pods elsewhere, relax the budgets, or delete the pods yourself; the drain continues on its own")
	return s.String()
}

// Options configure a drain.
type Options struct {
	// Client talks to the API server as the machine.
	Client kubernetes.Interface
	// Node is the node to drain.
	Node string
	// Clock measures the timeout and paces the retries; nil is the real clock.
	Clock clock.WithTicker
	// Timeout is how long the drain may take before it reports Blocked.
	Timeout time.Duration
	// Poll is how often the drain lists the node's pods when nothing
	// wakes it earlier: a change of one of the node's pods, seen through a
	// watch, makes it list them at once (default 1s).
	Poll time.Duration
	// RetryMin and RetryMax bound the backoff of a refused eviction
	// (defaults 1s and 30s).
	RetryMin, RetryMax time.Duration
	// OnBlocked is called when the drain passes its timeout, and again
	// whenever what blocks it changes.
	OnBlocked func(Blocked)
	// OnEvict is called after each eviction the API accepted.
	OnEvict func(pod *corev1.Pod, kind eviction.Kind)
}

type podState struct {
	next    time.Time
	backoff time.Duration
	pdbs    []string
	err     string
}

// Run drains the node: it evicts every pod that holds a ResourceClaim and
// waits until they are all gone, then evicts the other pods and waits
// until they are gone. DaemonSet, mirror and DRA driver pods stay. Refused
// evictions (429, a PodDisruptionBudget) are retried with backoff; nothing
// is forced. Run returns nil once the node is drained, or ctx's error.
func Run(ctx context.Context, o Options) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.RetryMin <= 0 {
		o.RetryMin = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 30 * time.Second
	}
	log := klog.FromContext(ctx).WithValues("node", o.Node)
	start := o.Clock.Now()
	states := map[types.UID]*podState{}
	var lastBlocked string
	onNode := fields.OneTermEqualSelector("spec.nodeName", o.Node).String()
	// A watch on the node's pods wakes the drain as soon as one changes
	// (an evicted pod is gone), so it does not wait for the next list;
	// the list stays the only truth, and Poll its fallback.
	var w watch.Interface
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	for {
		pods, err := o.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: onNode})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Error(err, "Listing the node's pods failed; retrying")
		} else {
			if w == nil {
				// Opened before any eviction, from the list's version: no
				// change after the list is missed.
				if w, err = o.Client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{FieldSelector: onNode, ResourceVersion: pods.ResourceVersion}); err != nil {
					w = nil
					log.V(2).Info("Cannot watch the node's pods; listing them every poll", "err", err, "poll", o.Poll)
				}
			}
			var holders, others []*corev1.Pod
			for i := range pods.Items {
				p := &pods.Items[i]
				switch k, _ := eviction.Classify(p); k {
				case eviction.ClaimHolder:
					holders = append(holders, p)
				case eviction.Other:
					others = append(others, p)
				}
			}
			stage, kind := holders, eviction.ClaimHolder
			if len(holders) == 0 {
				stage, kind = others, eviction.Other
			}
			if len(stage) == 0 {
				log.Info("Node drained", "took", o.Clock.Since(start).Round(time.Millisecond))
				return nil
			}
			now := o.Clock.Now()
			for _, p := range stage {
				st := states[p.UID]
				if st == nil {
					st = &podState{}
					states[p.UID] = st
				}
				if p.DeletionTimestamp != nil || now.Before(st.next) {
					continue
				}
				evicted, err := evict(ctx, o.Client, p)
				switch {
				case err == nil && evicted:
					st.pdbs, st.err = nil, ""
					log.Info("Evicted pod", "pod", klog.KObj(p), "kind", kind.String())
					if o.OnEvict != nil {
						o.OnEvict(p, kind)
					}
					// Retry only if the pod is still there after a grace.
					st.backoff = 0
					st.next = now.Add(o.RetryMax)
				case err == nil:
					// Gone already.
				default:
					if ctx.Err() != nil {
						return ctx.Err()
					}
					st.backoff = min(max(2*st.backoff, o.RetryMin), o.RetryMax)
					st.next = now.Add(st.backoff)
					if apierrors.IsTooManyRequests(err) {
						st.pdbs = budgetsOf(ctx, o.Client, p)
						st.err = ""
						log.V(2).Info("Eviction refused; backing off", "pod", klog.KObj(p), "budgets", st.pdbs, "retryIn", st.backoff)
					} else {
						st.err = fmt.Sprintf("%s/%s: %v", p.Namespace, p.Name, err)
						log.Error(err, "Eviction failed; backing off", "pod", klog.KObj(p), "retryIn", st.backoff)
					}
				}
			}
			if o.Timeout > 0 && o.Clock.Since(start) >= o.Timeout && o.OnBlocked != nil {
				b := Blocked{Since: start}
				pdbs := map[string]bool{}
				for _, p := range stage {
					b.Pods = append(b.Pods, p.Namespace+"/"+p.Name)
					if st := states[p.UID]; st != nil {
						for _, x := range st.pdbs {
							pdbs[x] = true
						}
						if st.err != "" {
							b.Errors = append(b.Errors, st.err)
						}
					}
				}
				for x := range pdbs {
					b.PDBs = append(b.PDBs, x)
				}
				sort.Strings(b.Pods)
				sort.Strings(b.PDBs)
				if key := fmt.Sprint(b.Pods, b.PDBs, b.Errors); key != lastBlocked {
					lastBlocked = key
					o.OnBlocked(b)
				}
			}
		}
		var changed <-chan watch.Event
		if w != nil {
			changed = w.ResultChan()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.Clock.After(o.Poll):
		case _, open := <-changed:
			// One list answers every change already queued.
			for open && len(changed) > 0 {
				_, open = <-changed
			}
			if !open {
				w = nil // ended (expired, or the connection dropped): opened again after the next list
			}
		}
	}
}

// evict asks the API to evict pod; false with no error means it is gone.
func evict(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) (bool, error) {
	err := c.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &p.UID},
		},
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if apierrors.IsConflict(err) {
		// The UID precondition failed: a new pod took the name; the one we
		// meant is gone.
		return false, nil
	}
	return err == nil, err
}

// budgetsOf names the PodDisruptionBudgets whose selector matches pod.
func budgetsOf(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) []string {
	list, err := c.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for i := range list.Items {
		b := &list.Items[i]
		if sel, ok := eviction.BudgetSelector(b); ok && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, b.Namespace+"/"+b.Name)
		}
	}
	return out
}
