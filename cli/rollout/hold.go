package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/kube"
	"liken.sh/liken/generated/clientset/versioned"
)

func newHoldCommand(flags *kube.Flags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "hold CLUSTER --reason TEXT",
		Short: "Stop new reboot turns until you lift the hold",
		Long: `Stop cluster-operator from granting new reboot turns in a cluster, for as
long as you need: a change freeze, an incident, a migration. Turns already
granted go on to their end, and machines go on downloading and staging
releases. The Cluster's Progressing condition, liken rollout status and an
event on the Cluster say that the rollout is held, why, by whom and since
when.

The hold is the annotation liken.sh/hold, whose value is the reason; kubectl
annotate sets it too. liken records who held it, as the API server knows
you, in the annotation's field manager.`,
		Example: `  # Hold the rollout of mycluster during a freeze
  liken rollout hold mycluster --reason "change freeze until Monday"

  # Lift it
  liken rollout unhold mycluster`,
		Args:              cmdutil.ExactArgs("CLUSTER"),
		ValidArgsFunction: flags.CompleteClusters(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			return Hold(cmd.Context(), c, whoAmI(cmd.Context(), flags), args[0], reason, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "Why the rollout is held, for the people who find it held (required).")
	return cmd
}

func newUnholdCommand(flags *kube.Flags) *cobra.Command {
	return &cobra.Command{
		Use:   "unhold CLUSTER",
		Short: "Lift a hold: turns are granted again",
		Long: `Lift the hold that liken rollout hold (or the annotation liken.sh/hold) put on
a cluster's turns: cluster-operator grants turns again at its next decision.`,
		Example: `  # Let turns start again in mycluster
  liken rollout unhold mycluster`,
		Args:              cmdutil.ExactArgs("CLUSTER"),
		ValidArgsFunction: flags.CompleteClusters(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			return Unhold(cmd.Context(), c, args[0], cmd.OutOrStdout())
		},
	}
}

// whoAmI is the user the API server knows the flags' credentials as
// (a SelfSubjectReview), or "" when it does not say.
func whoAmI(ctx context.Context, flags *kube.Flags) string {
	cfg, err := flags.RESTConfig()
	if err != nil {
		return ""
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return ""
	}
	r, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}
	return r.Status.UserInfo.Username
}

// holdManager is the field manager a hold by user is written with: the
// Cluster's managed fields then say who held it.
func holdManager(user string) string {
	if user == "" {
		return "liken rollout hold"
	}
	m := "liken rollout hold by " + user
	if len(m) > 128 { // the API server's limit for a field manager
		m = m[:128]
	}
	return m
}

// Hold sets the annotation liken.sh/hold on cluster name to reason,
// written by user.
func Hold(ctx context.Context, c versioned.Interface, user, name, reason string, out io.Writer) error {
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return errors.New("--reason is required: say why the rollout is held, for the people who will find it held")
	}
	cl, err := c.LikenV1alpha1().Clusters().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	if was := cl.Annotations[v1alpha1.AnnotationHold]; was != "" {
		fmt.Fprintf(out, "Cluster %s was already held (%q); the reason is now %q.\n", name, was, reason)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationHold: reason}}})
	if err != nil {
		return err
	}
	if _, err := c.LikenV1alpha1().Clusters().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: holdManager(user)}); err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	fmt.Fprintf(out, "Held the rollout of cluster %s: no new turn is granted until you run `liken rollout unhold %s`. Turns already granted go on to their end.\n", name, name)
	return nil
}

// Unhold removes the annotation liken.sh/hold from cluster name.
func Unhold(ctx context.Context, c versioned.Interface, name string, out io.Writer) error {
	cl, err := c.LikenV1alpha1().Clusters().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	was := cl.Annotations[v1alpha1.AnnotationHold]
	if was == "" {
		return fmt.Errorf("the rollout of cluster %s is not held: there is nothing to lift", name)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationHold)
	if _, err := c.LikenV1alpha1().Clusters().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "liken"}); err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	fmt.Fprintf(out, "Lifted the hold on cluster %s (it was %q): cluster-operator grants turns again.\nFollow the rollout with: liken rollout status %s\n", name, was, name)
	return nil
}
