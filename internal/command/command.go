// Package command holds what liken's server commands (cluster-operator and liken-node) share on their command line: klog's verbosity flags and the kubeconfig loading.
package command

import (
	"errors"
	"flag"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// AddKlogFlags adds klog's verbosity flags (-v, --vmodule) to fs. Of
// klog's flags only these: logs always go to stderr.
func AddKlogFlags(fs *pflag.FlagSet) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(kfs.Lookup(name))
	}
}

// RESTConfig loads the configuration that reaches the API server: the
// kubeconfig file at path; when path is empty, the one $KUBECONFIG names,
// or else the in-cluster service account of a pod. userAgent names the
// client in the API server's logs and audit.
func RESTConfig(path, userAgent string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case err == nil:
	case path == "" && clientcmd.IsEmptyConfig(err):
		return nil, errors.New("no kubeconfig given and not running in a pod: pass --kubeconfig")
	case path != "":
		return nil, fmt.Errorf("loading the kubeconfig %s: %w", path, err)
	default:
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}
