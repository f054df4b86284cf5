// Package reboot holds liken approve-reboot and liken request-reboot: the two ways a person asks a machine to reboot through its turn.
package reboot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/internal/fleet"
	"liken.sh/liken/cli/internal/printable"
	"liken.sh/liken/cli/kube"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/internal/rules"
)

// maxConflictRetries bounds how often a write is retried when the Machine
// changed between the read and the write.
const maxConflictRetries = 5

// NewApproveCommand returns liken approve-reboot.
func NewApproveCommand(flags *kube.Flags) *cobra.Command {
	answer := AnswerWait
	cmd := &cobra.Command{
		Use:   "approve-reboot CLUSTER MACHINE",
		Short: "Approve the reboot a Manual machine is waiting for",
		Long: `Approve exactly the change a machine has staged (a release, configuration
that needs a reboot, or a requested reboot), so it can take its reboot turn.

Only a machine that waits for approval can be approved: its rebootPolicy is
Manual and its RebootPending condition reads AwaitingApproval. The approval
covers the change staged now; if the machine stages something else later,
it asks again. After the approval the machine still waits for its turn
under the cluster's disruption budget, and for one of the cluster's
maintenance windows when it declares any (the command says when the next
opens), then cordons and drains its node before it reboots.

After the approval the command waits for cluster-operator's answer (up to
--wait) and prints it: the turns held, and what cluster-operator says
about the machines that wait, such as workers waiting for a leader that
waits for its own approval.`,
		Example: `  # Approve the staged release on node-4 of mycluster
  liken approve-reboot mycluster node-4

  # Approve without waiting for cluster-operator's answer
  liken approve-reboot mycluster node-5 --wait=0

  # List the machines that wait for approval
  kubectl get machines -o wide`,
		Args:              cmdutil.ExactArgs("CLUSTER", "MACHINE"),
		ValidArgsFunction: flags.CompleteClusters(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			return Approve(cmd.Context(), c, clock.RealClock{}, answer, args[0], args[1], cmd.OutOrStdout())
		},
	}
	cmd.Flags().DurationVar(&answer, "wait", AnswerWait, "How long to wait for cluster-operator to answer the approval before saying where the machine stands; 0 says at once what cluster-operator said last.")
	return cmd
}

// NewRequestCommand returns liken request-reboot.
func NewRequestCommand(flags *kube.Flags) *cobra.Command {
	return &cobra.Command{
		Use:   "request-reboot CLUSTER MACHINE",
		Short: "Ask a machine to reboot once, through its turn, cordon and drain",
		Long: `Ask a machine to reboot once, even though it agrees with every document:
for a driver that bound the wrong device, or a machine you experiment on.

The machine stages the reboot like any other change (phase RebootPending)
and takes a turn under the cluster's disruption budget, inside one of the
cluster's maintenance windows when it declares any (the command says when
the next opens): it cordons and drains its node, reboots, and rejoins. A Manual machine waits for
liken approve-reboot first. A Degraded machine asks for no turn, so the
request waits until what made it Degraded is fixed. Asking again while a
request is pending does nothing.`,
		Example: `  # Reboot node-4 of mycluster through its turn
  liken request-reboot mycluster node-4

  # Then, if node-4's rebootPolicy is Manual, approve it
  liken approve-reboot mycluster node-4`,
		Args:              cmdutil.ExactArgs("CLUSTER", "MACHINE"),
		ValidArgsFunction: flags.CompleteClusters(true),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			return Request(cmd.Context(), c, clock.RealClock{}, args[0], args[1], cmd.OutOrStdout())
		},
	}
}

// getMember reads the machine and its cluster and checks that the machine
// belongs to it.
func getMember(ctx context.Context, c versioned.Interface, command, clusterName, machineName string) (*v1alpha1.Cluster, *v1alpha1.Machine, error) {
	m, err := c.LikenV1alpha1().Machines().Get(ctx, machineName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, kube.Explain(err, "machine "+machineName)
	}
	if m.Spec.Cluster != clusterName {
		return nil, nil, fmt.Errorf("machine %s is not in cluster %s: it belongs to cluster %s (did you mean: liken %s %s %s?)",
			machineName, clusterName, m.Spec.Cluster, command, m.Spec.Cluster, machineName)
	}
	cl, err := c.LikenV1alpha1().Clusters().Get(ctx, clusterName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, kube.Explain(err, "cluster "+clusterName)
	}
	return cl, m, nil
}

// notWaiting explains why a machine cannot be approved now.
func notWaiting(clusterName string, m *v1alpha1.Machine) error {
	why := fmt.Sprintf("machine %s is not waiting for approval", m.Name)
	phase := m.Status.Phase
	switch {
	case phase == "":
		return fmt.Errorf("%s: it has not reported a status yet (is its node daemon running?)", why)
	case phase == v1alpha1.MachineReady:
		return fmt.Errorf("%s: it is Ready with nothing staged. To reboot it anyway: liken request-reboot %s %s", why, clusterName, m.Name)
	case phase == v1alpha1.MachineDownloading:
		return fmt.Errorf("%s: it is still downloading %s. It asks for approval once the release is verified and staged (phase UpdatePending); follow it with liken rollout status %s", why, downloading(m), clusterName)
	case phase == v1alpha1.MachineUpdating || phase == v1alpha1.MachineRebooting:
		return fmt.Errorf("%s: it already holds its turn (phase %s)", why, phase)
	case phase == v1alpha1.MachineLost:
		return fmt.Errorf("%s: it is Lost (cluster-operator saw no heartbeat on its Node Lease). Bring it back first; kubectl describe machine %s shows its last report and since when it is silent", why, m.Name)
	case phase == v1alpha1.MachineDegraded:
		return fmt.Errorf("%s: it is Degraded and needs a person; kubectl describe machine %s shows why", why, m.Name)
	case fleet.AwaitingTurn(m) && !rules.IsManual(m):
		return fmt.Errorf("%s: its rebootPolicy is Auto, so it takes its turn without approval (it waits for its turn now)", why)
	case m.Status.Change == "":
		return fmt.Errorf("%s: it reports phase %s but no staged change (status.change is empty); wait for its next report", why, phase)
	}
	cond := fleet.RebootPending(m)
	if cond == nil {
		return fmt.Errorf("%s: it reports phase %s without a RebootPending condition; wait for its next report", why, phase)
	}
	return fmt.Errorf("%s: its RebootPending condition is %s (%s): %s", why, cond.Status, printable.Text(cond.Reason), printable.Text(cond.Message))
}

func downloading(m *v1alpha1.Machine) string {
	d := m.Status.Download
	if d == nil {
		return "a release"
	}
	s := d.Version
	if d.BytesTotal > 0 {
		s += fmt.Sprintf(" (%s of %s)", cmdutil.HumanBytes(d.BytesDone), cmdutil.HumanBytes(d.BytesTotal))
	}
	return s
}

// AnswerWait is how long liken approve-reboot waits for cluster-operator
// to answer an approval before it says where the machine stands:
// cluster-operator answers within a second when it runs.
const AnswerWait = 10 * time.Second

// Approve sets the machine's liken.sh/approved-change annotation to the
// change it has staged, then prints what happens next: the machine's turn
// as cluster-operator answers it (waiting up to within for that answer) and,
// read at clk's now, the maintenance windows. It refuses when the machine
// is not in the cluster or does not wait for approval.
func Approve(ctx context.Context, c versioned.Interface, clk clock.PassiveClock, within time.Duration, clusterName, machineName string, out io.Writer) error {
	for attempt := 0; ; attempt++ {
		cl, m, err := getMember(ctx, c, "approve-reboot", clusterName, machineName)
		if err != nil {
			return err
		}
		if rules.Approved(m, m.Status.Change) {
			fmt.Fprintf(out, "Machine %s was already approved for its staged change (%s).\n", m.Name, fleet.DescribeChange(m))
			writePlace(out, cl, m, clk.Now(), true)
			return nil
		}
		pending := m.Status.Phase == v1alpha1.MachineUpdatePending || m.Status.Phase == v1alpha1.MachineRebootPending
		if !pending || !fleet.AwaitingApproval(m) || m.Status.Change == "" {
			return notWaiting(clusterName, m)
		}
		err = patchAnnotation(ctx, c, m, v1alpha1.AnnotationApprovedChange, m.Status.Change)
		if apierrors.IsConflict(err) && attempt < maxConflictRetries {
			continue // the machine reported something new: look again
		}
		if err != nil {
			return kube.Explain(err, "machine "+machineName)
		}
		fmt.Fprintf(out, "Approved the change staged on %s: %s (change %s).\n", m.Name, fleet.DescribeChange(m), m.Status.Change)
		now, after, answered, err := awaitAnswer(ctx, c, cl, m, within)
		if err != nil {
			return err
		}
		if fleet.HoldsTurn(now, m.Name) == nil && movedOn(after, m.Status.Change) {
			fmt.Fprintf(out, "Next: %s has taken its turn already; it is %s now.\n", m.Name, after.Status.Phase)
			fmt.Fprintf(out, "Follow it with: liken rollout status %s\n", now.Name)
			return nil
		}
		writePlace(out, now, m, clk.Now(), answered)
		return nil
	}
}

// patchAnnotation sets one annotation with a merge patch that carries the
// resourceVersion read, so a machine that changed in between is re-read.
func patchAnnotation(ctx context.Context, c versioned.Interface, m *v1alpha1.Machine, key, value string) error {
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": m.ResourceVersion,
		"annotations":     map[string]string{key: value},
	}}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = c.LikenV1alpha1().Machines().Patch(ctx, m.Name, types.MergePatchType, b, metav1.PatchOptions{FieldManager: "liken"})
	return err
}

// awaitAnswer waits up to within for cluster-operator to answer an approval
// of m's staged change (docs/design/protocol.md#one-definition-of-each-rule-and-one-voice);
// it returns the Cluster and Machine last read, and whether they hold the answer.
func awaitAnswer(ctx context.Context, c versioned.Interface, before *v1alpha1.Cluster, m *v1alpha1.Machine, within time.Duration) (*v1alpha1.Cluster, *v1alpha1.Machine, bool, error) {
	said := func(cl *v1alpha1.Cluster) string {
		if p := fleet.Progressing(cl); p != nil {
			return p.Reason + "\n" + p.Message
		}
		return ""
	}
	if p := fleet.Progressing(before); within <= 0 || p != nil && fleet.ClusterWide(p.Reason) {
		return before, m, true, nil
	}
	lastCl, lastM := before, m
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, within, true, func(pctx context.Context) (bool, error) {
		cl, err := c.LikenV1alpha1().Clusters().Get(pctx, before.Name, metav1.GetOptions{})
		if err == nil {
			lastCl = cl
			var mm *v1alpha1.Machine
			if mm, err = c.LikenV1alpha1().Machines().Get(pctx, m.Name, metav1.GetOptions{}); err == nil {
				lastM = mm
			}
		}
		switch {
		case err != nil && pctx.Err() != nil && ctx.Err() == nil:
			return false, nil // the wait is over, not the API server
		case err != nil:
			return false, kube.Explain(err, "cluster "+before.Name)
		}
		return fleet.HoldsTurn(lastCl, m.Name) != nil || movedOn(lastM, m.Status.Change) || said(lastCl) != said(before), nil
	})
	switch {
	case err == nil:
		return lastCl, lastM, true, nil
	case wait.Interrupted(err) && ctx.Err() == nil:
		return lastCl, lastM, false, nil
	}
	return nil, nil, false, err
}

// movedOn reports whether machine m no longer waits for a turn for change:
// it took the turn (and may have ended it already).
func movedOn(m *v1alpha1.Machine, change string) bool {
	pending := m.Status.Phase == v1alpha1.MachineUpdatePending || m.Status.Phase == v1alpha1.MachineRebootPending
	return !pending || m.Status.Change != change
}

// writePlace prints what happens next for m: its turn, the ledger, what
// cluster-operator says about the cluster's turns (answered: it has seen
// the approval), and the maintenance windows at now.
func writePlace(out io.Writer, cl *v1alpha1.Cluster, m *v1alpha1.Machine, now time.Time, answered bool) {
	if fleet.HoldsTurn(cl, m.Name) != nil {
		fmt.Fprintf(out, "Next: %s holds its turn now: it cordons and drains its node, then reboots.\n", m.Name)
		fmt.Fprintf(out, "Follow it with: liken rollout status %s\n", cl.Name)
		return
	}
	fmt.Fprintf(out, "Next: %s waits for a reboot turn under the disruption budget of cluster %s.\n", m.Name, cl.Name)
	var held []string
	for _, t := range cl.Status.RebootTurns {
		held = append(held, t.Machine)
	}
	budget := "maxUnavailable 1"
	if mu := cl.Spec.Disruption.MaxUnavailable; mu != nil {
		budget = "maxUnavailable " + mu.String()
	}
	if len(held) == 0 {
		fmt.Fprintf(out, "  Turns held:      none (%s)\n", budget)
	} else {
		fmt.Fprintf(out, "  Turns held:      %d (%s): %s\n", len(held), budget, strings.Join(held, ", "))
	}
	says := fleet.OperatorSays(cl)
	switch {
	case says == "":
		fmt.Fprintf(out, "  Operator says:   nothing yet about cluster %s: is cluster-operator running? (kubectl -n liken-system get pods)\n", cl.Name)
	case !answered:
		fmt.Fprintf(out, "  Operator says:   (no answer to this approval yet; is cluster-operator running? kubectl -n liken-system get pods) Its last word: %s\n", says)
	default:
		fmt.Fprintf(out, "  Operator says:   %s\n", says)
	}
	if rules.IsLeader(m) {
		fmt.Fprintf(out, "  %s is a leader: it waits until no other leader holds a turn or is down.\n", m.Name)
	}
	if note := fleet.WindowOf(cl, now).Note(); note != "" {
		fmt.Fprintf(out, "  Window:          %s\n", note)
	}
	fmt.Fprintf(out, "When its turn comes, %s cordons and drains its node, then reboots", m.Name)
	if fleet.StagedRelease(m) && m.Status.Staged != "" {
		fmt.Fprintf(out, " into %s as a trial and proves it", m.Status.Staged)
	}
	fmt.Fprintln(out, ".")
	fmt.Fprintf(out, "Follow it with: liken rollout status %s\n", cl.Name)
}

// Request sets the machine's liken.sh/request-reboot annotation to a new
// value (the current time), unless a request is already pending, and prints
// what happens next.
func Request(ctx context.Context, c versioned.Interface, clk clock.PassiveClock, clusterName, machineName string, out io.Writer) error {
	for attempt := 0; ; attempt++ {
		cl, m, err := getMember(ctx, c, "request-reboot", clusterName, machineName)
		if err != nil {
			return err
		}
		if prev := m.Annotations[v1alpha1.AnnotationRequestReboot]; prev != "" && prev != m.Status.ObservedRebootRequest {
			fmt.Fprintf(out, "Machine %s already has a reboot request pending (made %s); it was not asked again.\n", m.Name, prev)
			return nextAfterRequest(out, cl, m, clk.Now())
		}
		value := clk.Now().UTC().Format(time.RFC3339Nano)
		err = patchAnnotation(ctx, c, m, v1alpha1.AnnotationRequestReboot, value)
		if apierrors.IsConflict(err) && attempt < maxConflictRetries {
			continue
		}
		if err != nil {
			return kube.Explain(err, "machine "+machineName)
		}
		fmt.Fprintf(out, "Requested a reboot of %s (request %s).\n", m.Name, value)
		return nextAfterRequest(out, cl, m, clk.Now())
	}
}

// nextAfterRequest prints what happens after a reboot request: staging,
// approval, the turn and, read at now, the maintenance windows.
func nextAfterRequest(out io.Writer, cl *v1alpha1.Cluster, m *v1alpha1.Machine, now time.Time) error {
	next := "Next"
	if m.Status.Phase == v1alpha1.MachineDegraded {
		// A Degraded machine asks for no turn: the request waits.
		fmt.Fprintf(out, "Warning: %s is Degraded: it asks for no turn and will not reboot until the problem is fixed.\n", m.Name)
		fmt.Fprintf(out, "  kubectl describe machine %s shows why (its conditions and events); docs/guides/troubleshoot.md says what to do.\n", m.Name)
		next = "Once it is no longer Degraded"
	}
	fmt.Fprintf(out, "%s: %s stages the reboot (phase RebootPending), ", next, m.Name)
	if !rules.IsManual(m) {
		fmt.Fprintf(out, "then waits for a turn under the disruption budget of cluster %s.\n", cl.Name)
	} else {
		fmt.Fprintf(out, "then waits for your approval, because its rebootPolicy is Manual:\n  liken approve-reboot %s %s\n", cl.Name, m.Name)
	}
	fmt.Fprintf(out, "Its turn cordons and drains the node like any other reboot.\n")
	if note := fleet.WindowOf(cl, now).Note(); note != "" {
		fmt.Fprintf(out, "Turns come only inside the maintenance windows of cluster %s, which are %s.\n", cl.Name, note)
	}
	if m.Status.Phase == v1alpha1.MachineLost {
		fmt.Fprintf(out, "Note: %s is Lost now; it sees the request when it is back.\n", m.Name)
	}
	fmt.Fprintf(out, "Follow it with: liken rollout status %s\n", cl.Name)
	return nil
}
