package controlplane

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/internal/pki"
	nodecp "liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/join"
)

// setUpJoin creates the Secrets of Options.JoinTokens (bootstrap tokens in
// kube-system, each bound to its machine) and the binding that lets a join
// token ask for a machine certificate. Approving a request is
// cluster-operator's (controllers/nodeclients), as on liken's own leaders.
func (cp *ControlPlane) setUpJoin(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return err
	}
	// kube-system appears a moment after the API server is ready.
	if err := retry(ctx, func() error { return nodecp.EnsureJoinTokens(ctx, cs, cp.opts.JoinTokens, time.Now()) }); err != nil {
		return fmt.Errorf("creating the join tokens: %w", err)
	}
	return nodecp.EnsureBindings(ctx, cs, nodecp.JoinBindings)
}

// CreateJoinTokens makes tokens join tokens of the cluster, as a leader's
// control-plane init does with the tokens of its layer.
func (cp *ControlPlane) CreateJoinTokens(ctx context.Context, tokens []nodecp.MachineToken) error {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return err
	}
	return nodecp.EnsureJoinTokens(ctx, cs, tokens, time.Now())
}

func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WriteBootstrapKubeconfig writes, at path, the kubeconfig a machine joins
// with: the API server, its CA, and the machine's join token
// (<id>.<secret>).
func (cp *ControlPlane) WriteBootstrapKubeconfig(path, token string) error {
	return clientcmd.WriteToFile(join.BootstrapKubeconfig(cp.Server, cp.caPEM, token), path)
}

// BootstrapConfig is a rest.Config that authenticates with a join token.
func (cp *ControlPlane) BootstrapConfig(token string) *rest.Config {
	return &rest.Config{Host: cp.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
}

// IssueMachineKubeconfig writes, at path, a kubeconfig with a certificate
// for system:node:<machine> issued by the control plane's CA, as a leader's
// control plane setup issues its own (node/controlplane
// IssueMachineCredentials): no join token, no approval.
func (cp *ControlPlane) IssueMachineKubeconfig(machine, path string) error {
	ca, err := pki.LoadCA(filepath.Join(cp.Dir, "pki", "ca.crt"), filepath.Join(cp.Dir, "pki", "ca.key"))
	if err != nil {
		return err
	}
	leaf, err := ca.Issue(pki.Request{CommonName: join.User(machine), Organizations: []string{join.NodeGroup}, Usage: pki.ClientAuth, Now: time.Now(), Validity: pkiValidity})
	if err != nil {
		return err
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return err
	}
	return join.WriteCredentials(path, &rest.Config{Host: cp.Server, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}, leaf.CertPEM(), key)
}

// issueMachines gives each of machines its MachineKubeconfig.
func (cp *ControlPlane) issueMachines(machines []string) error {
	for _, m := range machines {
		if err := cp.IssueMachineKubeconfig(m, cp.MachineKubeconfig(m)); err != nil {
			return fmt.Errorf("machine %s: %w", m, err)
		}
	}
	if len(machines) > 0 {
		cp.opts.Log("%d machines have certificates of the control plane's CA", len(machines))
	}
	return nil
}
