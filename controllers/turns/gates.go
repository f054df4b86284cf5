package turns

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/promgate"
	"liken.sh/liken/internal/clip"
)

// Gated is a machine that would have had a turn but that a gate passed
// over: the next machine in order takes the turn.
type Gated struct {
	Machine string
	Leader  bool
	Blocked
}

// Message says why the machine waits, and what to do.
func (g Gated) Message() string {
	return fmt.Sprintf("%s waits: it runs %s, which spec.disruption.gates[%d] (blockingPods) matches; the next machine in order takes the turn. "+
		"It gets its turn by itself once no such pod runs on it.", g.Machine, podList(g.Pods), g.Gate)
}

// key tells apart what blocks the machine, for the events: one per
// machine, and again when it changes.
func (g Gated) key() string { return fmt.Sprint(g.Gate, g.Pods) }

// podList names pods, at most maxListed of them: "pods shop/batch-1,shop/batch-2".
func podList(pods []string) string {
	if len(pods) == 1 {
		return "pod " + pods[0]
	}
	return "pods " + listed(pods)
}

// gatedMessage says which machines a gate passed over; empty when none.
func gatedMessage(gated []Gated) string {
	return passedOverMessage(" Passed over by a gate:", len(gated),
		func(i int) string {
			g := gated[i]
			return fmt.Sprintf(" %s runs %s (spec.disruption.gates[%d], blockingPods).", g.Machine, clip.To(podList(g.Pods), maxMachineMessage), g.Gate)
		},
		" Each gets its turn by itself once no such pod runs on it.",
		slices.ContainsFunc(gated, func(g Gated) bool { return g.Leader }))
}

// hold says who set the annotation liken.sh/hold on c and when, as its
// managed fields record it: the field manager (kubectl annotate records
// "kubectl-annotate", liken rollout hold the person's name) and the time
// of that write. Empty when they do not say.
func hold(c *likenv1.Cluster) (by string, at time.Time) {
	key := []byte(`"f:` + likenv1.AnnotationHold + `"`)
	for _, mf := range c.ManagedFields {
		if mf.FieldsV1 == nil || !bytes.Contains(mf.FieldsV1.Raw, key) {
			continue
		}
		by = mf.Manager
		if mf.Time != nil {
			at = mf.Time.Time
		}
	}
	return by, at
}

// heldMessage says that the annotation liken.sh/hold holds the rollout,
// why, who set it and when, and how to lift it.
func heldMessage(c *likenv1.Cluster, turns []likenv1.RebootTurn) string {
	var b strings.Builder
	fmt.Fprintf(&b, "No turn is granted: the rollout is held (annotation %s): %q", likenv1.AnnotationHold, clip.To(c.Annotations[likenv1.AnnotationHold], maxMachineMessage))
	if by, at := hold(c); by != "" {
		fmt.Fprintf(&b, ", set by %s", by)
		if !at.IsZero() {
			fmt.Fprintf(&b, " at %s", at.UTC().Format(time.RFC3339))
		}
	}
	b.WriteString(".")
	if len(turns) > 0 {
		fmt.Fprintf(&b, " Turns granted before go on to their end: %s.", holders(turns))
	}
	fmt.Fprintf(&b, " Machines go on downloading and staging. To let turns start again, remove it: `liken rollout unhold %s` or `kubectl annotate cluster %s %s-`.",
		c.Name, c.Name, likenv1.AnnotationHold)
	return b.String()
}

// gateSelector is a blockingPods gate read for matching.
type gateSelector struct {
	index      int
	sel        labels.Selector
	namespaces []string
}

// blockingSelectors reads the blockingPods gates of c. A gate whose
// selector cannot be read (the API server checks its form) blocks every
// machine rather than none: its error says which.
func blockingSelectors(c *likenv1.Cluster) ([]gateSelector, error) {
	var out []gateSelector
	for i, g := range c.Spec.Disruption.Gates {
		if g.BlockingPods == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&g.BlockingPods.Selector)
		if err != nil {
			return nil, fmt.Errorf("spec.disruption.gates[%d].blockingPods.selector: %w", i, err)
		}
		out = append(out, gateSelector{index: i, sel: sel, namespaces: g.BlockingPods.Namespaces})
	}
	return out, nil
}

// blockedOn is what the first gate that matches a pod on node finds there;
// false when no gate does. Finished pods do not block.
func (r *budgetsReader) blockedOn(node string, gates []gateSelector) (Blocked, bool, error) {
	objs, err := r.pods.ByIndex(ByNode, node)
	if err != nil {
		return Blocked{}, false, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	for _, g := range gates {
		var pods []string
		for _, o := range objs {
			p, ok := o.(*Pod)
			if !ok || p.Finished || len(g.namespaces) > 0 && !slices.Contains(g.namespaces, p.Namespace()) || !g.sel.Matches(p.Labels) {
				continue
			}
			pods = append(pods, p.key())
		}
		if len(pods) > 0 {
			slices.Sort(pods)
			return Blocked{Gate: g.index, Pods: pods}, true, nil
		}
	}
	return Blocked{}, false, nil
}

// shutMessage says which prometheus gates hold every turn, and why.
func shutMessage(shut []promgate.Closed, turns []likenv1.RebootTurn) string {
	var b strings.Builder
	b.WriteString("No turn is granted:")
	for i, g := range shut {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more gates.", len(shut)-maxListed)
			break
		}
		fmt.Fprintf(&b, " spec.disruption.gates[%d] (prometheus) is shut: %s.", g.Gate, clip.To(g.Why, maxMachineMessage))
	}
	if len(turns) > 0 {
		fmt.Fprintf(&b, " Turns granted before go on to their end: %s.", holders(turns))
	}
	b.WriteString(" Granting resumes by itself once every gate opens (cluster-operator reads each server every 15 s); to go on anyway, remove the gate from spec.disruption.gates.")
	return b.String()
}
