package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/certificate"

	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/node/join"
)

// MachineCredentials says where a leader's own credentials as a machine
// (system:node:<machine>) go.
type MachineCredentials struct {
	// KubeletKubeconfig is the kubelet's --kubeconfig; it names the
	// certificate in KubeletCertDir, as the kubelet's own TLS bootstrap
	// writes it.
	KubeletKubeconfig string
	// KubeletCertDir is the kubelet's --cert-dir, where it keeps and
	// rotates kubelet-client-current.pem.
	KubeletCertDir string
	// NodeKubeconfig is liken-node's --kubeconfig.
	NodeKubeconfig string
}

// DefaultMachineCredentials are the paths of liken's image (kubelet.service
// and liken-node.service).
var DefaultMachineCredentials = MachineCredentials{
	KubeletKubeconfig: "/var/lib/kubelet/kubeconfig",
	KubeletCertDir:    "/var/lib/kubelet/pki",
	NodeKubeconfig:    "/var/lib/liken/machine/liken-node.kubeconfig",
}

// IssueMachineCredentials gives a leader's kubelet and liken-node their
// client certificates as system:node:<machine>, issued by the identity's
// client CA, where either has none it can use or its renewal is due
// (join.RenewalDue). A leader holds that CA: it needs no join token and no
// approval, so its kubelet registers before any cluster-operator runs to
// approve the workers'. Each renews its certificate afterwards with a
// certificate request of its own, as a worker's do.
func IssueMachineCredentials(cfg Config, identityDir string, where MachineCredentials, now time.Time) error {
	ca, err := pki.LoadCA(filepath.Join(identityDir, filepath.FromSlash(ClientCA.Cert())), filepath.Join(identityDir, filepath.FromSlash(ClientCA.Key())))
	if err != nil {
		return fmt.Errorf("the cluster identity's %s: %w", ClientCA, err)
	}
	serverCA, err := os.ReadFile(filepath.Join(identityDir, filepath.FromSlash(ServerCA.Cert())))
	if err != nil {
		return fmt.Errorf("the cluster identity's %s: %w", ServerCA, err)
	}
	server := &rest.Config{Host: cfg.Endpoint, TLSClientConfig: rest.TLSClientConfig{CAData: serverCA}}
	issue := func() (certPEM, keyPEM []byte, err error) {
		leaf, err := ca.Issue(pki.Request{CommonName: join.User(cfg.Machine), Organizations: []string{join.NodeGroup}, Usage: pki.ClientAuth, Now: now, Validity: CertValidity})
		if err != nil {
			return nil, nil, fmt.Errorf("issuing the certificate of %s: %w", join.User(cfg.Machine), err)
		}
		keyPEM, err = leaf.KeyPEM()
		return leaf.CertPEM(), keyPEM, err
	}
	usable := func(kubeconfig string) bool {
		due, _ := join.RenewalDue(kubeconfig, now)
		return join.Check(kubeconfig, cfg.Machine, now) == nil && !due
	}
	if !usable(where.NodeKubeconfig) {
		c, k, err := issue()
		if err != nil {
			return err
		}
		if err := join.WriteCredentials(where.NodeKubeconfig, server, c, k); err != nil {
			return err
		}
	}
	if usable(where.KubeletKubeconfig) {
		return nil
	}
	c, k, err := issue()
	if err != nil {
		return err
	}
	// The kubelet's own store: a dated file and the kubelet-client-current.pem
	// link to it, which the kubelet moves when it rotates the certificate.
	if err := os.MkdirAll(where.KubeletCertDir, 0o700); err != nil {
		return err
	}
	store, err := certificate.NewFileStore("kubelet-client", where.KubeletCertDir, where.KubeletCertDir, "", "")
	if err != nil {
		return fmt.Errorf("the kubelet's certificates in %s: %w", where.KubeletCertDir, err)
	}
	if _, err := store.Update(c, k); err != nil {
		return fmt.Errorf("writing the kubelet's certificate in %s: %w", where.KubeletCertDir, err)
	}
	current := store.CurrentPath()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["default-cluster"] = &clientcmdapi.Cluster{Server: cfg.Endpoint, CertificateAuthorityData: serverCA}
	kc.AuthInfos["default-auth"] = &clientcmdapi.AuthInfo{ClientCertificate: current, ClientKey: current}
	kc.Contexts["default-context"] = &clientcmdapi.Context{Cluster: "default-cluster", AuthInfo: "default-auth"}
	kc.CurrentContext = "default-context"
	if err := os.MkdirAll(filepath.Dir(where.KubeletKubeconfig), 0o700); err != nil {
		return err
	}
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	return atomicfile.Write(where.KubeletKubeconfig, b, 0o600)
}
