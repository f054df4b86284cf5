// Package kube holds the kubeconfig flags and API helpers shared by the liken commands that talk to a cluster.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/version"
)

// Flags are the standard kubeconfig flags (--kubeconfig, --context,
// --server, --token, ...), as kubectl has them.
type Flags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides

	// newClient builds the clientset; tests may replace it.
	newClient func(*rest.Config) (versioned.Interface, error)
}

// NewFlags returns kubeconfig flags that read KUBECONFIG and
// ~/.kube/config like kubectl.
func NewFlags() *Flags {
	return &Flags{
		rules: clientcmd.NewDefaultClientConfigLoadingRules(),
		newClient: func(c *rest.Config) (versioned.Interface, error) {
			return versioned.NewForConfig(c)
		},
	}
}

// AddFlags adds the kubeconfig flags to fs. Liken's resources are
// cluster-scoped, so there is no --namespace.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.rules.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file to use for CLI requests.")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.ContextOverrideFlags.Namespace = clientcmd.FlagInfo{}
	clientcmd.BindOverrideFlags(&f.overrides, fs, names)
}

// RESTConfig is the client configuration the flags select.
func (f *Flags) RESTConfig() (*rest.Config, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.rules, &f.overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, errors.New("no cluster to talk to: set KUBECONFIG or pass --kubeconfig (for a lab, liken lab up prints the export KUBECONFIG=... line)")
		}
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "liken/" + version.Version
	return cfg, nil
}

// Client is a liken clientset for the flags' cluster.
func (f *Flags) Client() (versioned.Interface, error) {
	cfg, err := f.RESTConfig()
	if err != nil {
		return nil, err
	}
	return f.newClient(cfg)
}

// Explain rewrites an API error into what an operator can act on. what
// names the object, such as "machine node-4".
func Explain(err error, what string) error {
	if err == nil {
		return nil
	}
	switch {
	case apierrors.IsNotFound(err):
		if st, ok := err.(apierrors.APIStatus); ok && (st.Status().Details == nil || st.Status().Details.Name == "") {
			return fmt.Errorf("the API server does not serve liken.sh/v1alpha1 (%v): install liken's CRDs (kubectl apply -f manifests/)", err)
		}
		return fmt.Errorf("%s not found (kubectl get liken lists Clusters and Machines)", what)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("the API server refused access to %s: %v (check which user your kubeconfig context uses)", what, apierrors.ReasonForError(err))
	case errors.Is(err, syscall.ECONNREFUSED), isNetError(err):
		return fmt.Errorf("cannot reach the API server (%v): is the cluster running, and does --kubeconfig or --context point at it?", err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the API server did not answer in time about %s: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func isNetError(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || (errors.As(err, &ne) && ne.Timeout())
}

// CompleteClusters returns a completion function that lists Cluster names
// for the argument at position pos (0-based), and Machine names of the
// chosen cluster for position pos+1 when machines is set.
func (f *Flags) CompleteClusters(machines bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, err := f.Client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		var out []cobra.Completion
		switch {
		case len(args) == 0:
			list, err := c.LikenV1alpha1().Clusters().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			for _, cl := range list.Items {
				if strings.HasPrefix(cl.Name, toComplete) {
					out = append(out, cl.Name)
				}
			}
		case len(args) == 1 && machines:
			list, err := c.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			for _, m := range list.Items {
				if m.Spec.Cluster == args[0] && strings.HasPrefix(m.Name, toComplete) {
					out = append(out, m.Name)
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
