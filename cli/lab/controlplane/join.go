package controlplane

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	nodecp "liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/join"
)

// setUpJoin creates the join token (a bootstrap token Secret in
// kube-system) and the bindings that let it ask for a machine certificate.
func (cp *ControlPlane) setUpJoin(ctx context.Context) error {
	// Bootstrap tokens are [a-z0-9]{6}.[a-z0-9]{16}; rand.Text is base32
	// (A-Z, 2-7).
	id, secret := strings.ToLower(rand.Text()[:6]), strings.ToLower(rand.Text()[:16])
	if t := cp.opts.JoinToken; t != "" {
		var ok bool
		if id, secret, ok = strings.Cut(t, "."); !ok {
			return fmt.Errorf("the join token is not a bootstrap token <id>.<secret>")
		}
	}
	cp.joinToken = id + "." + secret
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return err
	}
	// kube-system appears a moment after the API server is ready.
	if err := retry(ctx, func() error { return nodecp.EnsureBootstrapToken(ctx, cs, id, secret) }); err != nil {
		return fmt.Errorf("creating the bootstrap token: %w", err)
	}
	if err := nodecp.EnsureBindings(ctx, cs, nodecp.JoinBindings); err != nil {
		return err
	}
	return clientcmd.WriteToFile(cp.bootstrapKubeconfig(), cp.BootstrapKubeconfig())
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

func (cp *ControlPlane) bootstrapKubeconfig() clientcmdapi.Config {
	return join.BootstrapKubeconfig(cp.Server, cp.caPEM, cp.joinToken)
}

// BootstrapKubeconfig is the path of the kubeconfig that carries the join
// token: what liken-node --bootstrap-kubeconfig reads on a machine that has
// not joined yet.
func (cp *ControlPlane) BootstrapKubeconfig() string {
	return filepath.Join(cp.Dir, "kubeconfigs", "bootstrap.kubeconfig")
}

// BootstrapConfig is a rest.Config that authenticates with the join token.
func (cp *ControlPlane) BootstrapConfig() *rest.Config {
	return &rest.Config{Host: cp.Server, BearerToken: cp.joinToken, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM}}
}

// joinMachines joins machines, a few at a time, each into its
// MachineKubeconfig.
func (cp *ControlPlane) joinMachines(ctx context.Context, machines []string) error {
	if len(machines) == 0 {
		return nil
	}
	start := time.Now()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, 8)
	for _, m := range machines {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := join.Join(ctx, join.Options{Machine: m, Bootstrap: cp.BootstrapConfig(), Kubeconfig: cp.MachineKubeconfig(m)})
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("machine %s joining: %w", m, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		cp.opts.Log("%d machines joined through TLS bootstrap in %s", len(machines), time.Since(start).Round(time.Millisecond))
	}
	return first
}
