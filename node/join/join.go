// Package join gives a machine credentials of its own through Kubernetes' TLS bootstrap.
//
// A machine starts with the join token only (a bootstrap token, in a
// bootstrap kubeconfig). It makes a key pair that never leaves it, asks for
// a kubelet client certificate for system:node:<machine> with a
// CertificateSigningRequest, and once the cluster's approver and signer
// answer, writes a kubeconfig holding its key and certificate. From then on
// it authenticates as itself; the join token is needed again only when the
// certificate is missing, damaged, for another machine or about to expire.
package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/klog/v2"

	"liken.sh/liken/internal/atomicfile"
)

// NodeGroup is the group of every machine's identity.
const NodeGroup = "system:nodes"

// User is the user name machine authenticates as.
func User(machine string) string { return "system:node:" + machine }

// BootstrapKubeconfig is the kubeconfig a machine joins with: the API
// server, the CA it serves with, and the bootstrap token (<id>.<secret>).
// kubelet and liken-node read it as their --bootstrap-kubeconfig.
func BootstrapKubeconfig(server string, caPEM []byte, token string) clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["liken"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["join"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: "join"}
	cfg.CurrentContext = "liken"
	return *cfg
}

// Options says who joins, with what, and where its credentials go.
type Options struct {
	// Machine is the machine's name, the name of its Node.
	Machine string
	// Bootstrap is the API client configuration that carries the join
	// token; it may be nil when Kubeconfig already holds a valid
	// certificate.
	Bootstrap *rest.Config
	// Kubeconfig is the file the machine's own kubeconfig goes to, with
	// its key and certificate inside (mode 0600).
	Kubeconfig string
	// RenewBefore is how long before its expiry a certificate is replaced
	// by joining again (default 24 h).
	RenewBefore time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Join makes sure Kubeconfig holds a valid certificate for the machine,
// joining with the bootstrap token when it does not; give ctx a deadline,
// as the cluster may never approve (docs/design/image.md#joining-the-cluster).
func Join(ctx context.Context, o Options) error {
	if o.Machine == "" {
		return errors.New("joining: no machine name")
	}
	if o.RenewBefore == 0 {
		o.RenewBefore = 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := klog.FromContext(ctx).WithValues("machine", o.Machine)
	why := Check(o.Kubeconfig, o.Machine, o.Now().Add(o.RenewBefore))
	if why == nil {
		return nil
	}
	// usable: valid now, though not for RenewBefore. A failed request
	// leaves the file as it is.
	usable := Check(o.Kubeconfig, o.Machine, o.Now()) == nil
	if o.Bootstrap == nil {
		if usable {
			log.Info("The machine's certificate expires soon and there is no join token to replace it", "reason", why.Error())
			return nil
		}
		return fmt.Errorf("the kubeconfig %s cannot be used (%v) and there is no join token to get a new certificate: give liken-node --bootstrap-kubeconfig", o.Kubeconfig, why)
	}
	log.Info("Joining the cluster with the join token", "reason", why.Error())
	err := request(ctx, o)
	if err != nil && usable {
		// Still valid for a while: run on it, and try again next start.
		log.Error(err, "Replacing the machine's certificate failed; it goes on with the one it has", "reason", why.Error())
		return nil
	}
	return err
}

// request asks the cluster for a new certificate with the join token and
// writes the kubeconfig that holds it.
func request(ctx context.Context, o Options) error {
	log := klog.FromContext(ctx).WithValues("machine", o.Machine)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("making the machine's key: %w", err)
	}
	req, err := cert.MakeCSR(key, &pkix.Name{CommonName: User(o.Machine), Organization: []string{NodeGroup}}, nil, nil)
	if err != nil {
		return fmt.Errorf("making the certificate signing request: %w", err)
	}
	cs, err := kubernetes.NewForConfig(o.Bootstrap)
	if err != nil {
		return err
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	name, uid, err := csr.RequestCertificateWithContext(ctx, cs, req, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return fmt.Errorf("asking the cluster at %s for a certificate for %s: %s: %w", o.Bootstrap.Host, User(o.Machine), requestHint(err), err)
	}
	log.Info("Waiting for the cluster to approve and sign the certificate", "request", name)
	certPEM, err := csr.WaitForCertificate(ctx, cs, name, uid)
	if err != nil {
		return fmt.Errorf("waiting for certificate signing request %s to be approved and signed (kubectl describe csr %s): %w", name, name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := write(o.Kubeconfig, o.Bootstrap, certPEM, keyPEM); err != nil {
		return err
	}
	if err := Check(o.Kubeconfig, o.Machine, o.Now()); err != nil {
		return fmt.Errorf("the certificate the cluster issued: %w", err)
	}
	log.Info("Joined: the machine has its own certificate", "request", name, "kubeconfig", o.Kubeconfig)
	return nil
}

// requestHint says what a failed certificate request most likely means:
// a refused join token, or an API that does not answer (yet).
func requestHint(err error) string {
	var status apierrors.APIStatus
	switch {
	case apierrors.IsUnauthorized(err):
		return "the cluster refused the join token (is it the fleet's, and not expired? liken layer pack makes a new layer with a new one)"
	case apierrors.IsForbidden(err):
		return "the join token may not ask for certificates (the binding liken:join:create-csr is missing: docs/guides/install.md, step 5)"
	case errors.As(err, &status):
		return "the API server refused the request"
	}
	return "the API does not answer (a leader's control plane may still be starting; liken-node tries again)"
}

// Check says why the kubeconfig at path cannot serve machine until
// validUntil, or nil when it can: it must hold a client certificate for
// system:node:<machine> in system:nodes, with its key, valid until then.
func Check(path, machine string, validUntil time.Time) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("the machine has not joined yet")
		}
		return fmt.Errorf("reading %s: %w", path, err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		return fmt.Errorf("%s has no current context", path)
	}
	user := cfg.AuthInfos[ctx.AuthInfo]
	if user == nil || len(user.ClientCertificateData) == 0 || len(user.ClientKeyData) == 0 {
		return fmt.Errorf("%s holds no client certificate and key", path)
	}
	certs, err := cert.ParseCertsPEM(user.ClientCertificateData)
	if err != nil {
		return fmt.Errorf("%s: the client certificate: %w", path, err)
	}
	c := certs[0]
	if c.Subject.CommonName != User(machine) {
		return fmt.Errorf("%s holds the certificate of %q, not of %q", path, c.Subject.CommonName, User(machine))
	}
	if len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != NodeGroup {
		return fmt.Errorf("%s: the certificate's groups are %q, not [%s]", path, c.Subject.Organization, NodeGroup)
	}
	if validUntil.After(c.NotAfter) {
		return fmt.Errorf("the certificate in %s expires at %s", path, c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// write writes the machine's kubeconfig atomically: the server and CA of
// the bootstrap configuration, the machine's certificate and key.
func write(path string, boot *rest.Config, certPEM, keyPEM []byte) error {
	caData := boot.CAData
	if len(caData) == 0 && boot.CAFile != "" {
		b, err := os.ReadFile(boot.CAFile)
		if err != nil {
			return fmt.Errorf("reading the cluster's CA %s: %w", boot.CAFile, err)
		}
		caData = b
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["liken"] = &clientcmdapi.Cluster{Server: boot.Host, CertificateAuthorityData: caData, TLSServerName: boot.ServerName}
	cfg.AuthInfos["machine"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: "machine"}
	cfg.CurrentContext = "liken"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("writing the machine's kubeconfig: %w", err)
	}
	return nil
}
