// Package join gives a machine credentials of its own through Kubernetes' TLS bootstrap.
//
// A machine starts with its join token only (a bootstrap token, in a
// bootstrap kubeconfig). It makes a key pair that never leaves it, asks for
// a kubelet client certificate for system:node:<machine> with a
// CertificateSigningRequest, and once the cluster's approver and signer
// answer, writes its key and certificate and a kubeconfig that names them.
// From then on it authenticates as itself, and renews its certificate with
// the certificate itself once two thirds of its lifetime have passed; the
// join token is needed again only when the certificate is missing, damaged,
// for another machine or expired.
package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	// token; it may be nil when Kubeconfig holds a valid certificate.
	Bootstrap *rest.Config
	// Kubeconfig is the file the machine's own kubeconfig goes to; its key
	// and certificate go to KeyFile(Kubeconfig), which it names (mode 0600),
	// so that a client that reads the kubeconfig picks a renewed
	// certificate up without a restart.
	Kubeconfig string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// KeyFile is where the key and certificate of the kubeconfig at path go:
// one file, so that a power cut never leaves a key beside another key's
// certificate.
func KeyFile(kubeconfig string) string {
	return strings.TrimSuffix(kubeconfig, filepath.Ext(kubeconfig)) + "-client.pem"
}

// Join makes sure Kubeconfig holds a certificate for the machine that is
// valid now, joining with the bootstrap token when it holds none it can
// use. Give ctx a deadline, as the cluster may never approve
// (docs/design/image.md#joining-the-cluster). It never waits for a renewal:
// Renew does that, while the machine runs.
func Join(ctx context.Context, o Options) error {
	if o.Machine == "" {
		return errors.New("joining: no machine name")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	usable := Check(o.Kubeconfig, o.Machine, o.Now())
	if usable == nil {
		return nil
	}
	if o.Bootstrap == nil {
		return fmt.Errorf("the kubeconfig %s cannot be used (%v) and there is no join token to get a new certificate: give liken-node --bootstrap-kubeconfig, the kubeconfig with the machine's own join token that its layer holds", o.Kubeconfig, usable)
	}
	klog.FromContext(ctx).Info("Joining the cluster with the join token", "machine", o.Machine, "reason", usable.Error())
	return request(ctx, o, o.Bootstrap)
}

// Renew renews the certificate of Kubeconfig with the certificate itself
// once it is due (RenewalDue), and joins with the bootstrap token (Join)
// when there is none it can use. A renewal that fails while the old
// certificate still serves is an error, which the caller logs before it
// tries again.
func Renew(ctx context.Context, o Options) error {
	if o.Now == nil {
		o.Now = time.Now
	}
	if Check(o.Kubeconfig, o.Machine, o.Now()) != nil {
		return Join(ctx, o)
	}
	due, expires := RenewalDue(o.Kubeconfig, o.Now())
	if !due {
		return nil
	}
	self, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", o.Kubeconfig, err)
	}
	klog.FromContext(ctx).Info("Renewing the machine's certificate with the certificate itself", "machine", o.Machine, "expires", expires.UTC().Format(time.RFC3339))
	if err := request(ctx, o, self); err != nil {
		return fmt.Errorf("renewing the machine's certificate, which expires at %s (it serves until then): %w", expires.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// RenewalDue reports whether the certificate of the kubeconfig at path has
// passed two thirds of its lifetime at now (as the kubelet renews its own,
// between 70 and 90 %), and when it expires.
func RenewalDue(path string, now time.Time) (bool, time.Time) {
	c, err := certificate(path)
	if err != nil {
		return true, time.Time{}
	}
	life := c.NotAfter.Sub(c.NotBefore)
	return !now.Before(c.NotBefore.Add(life * 2 / 3)), c.NotAfter
}

// request asks the cluster for a new certificate as client (the join token,
// or the machine itself) and writes it with its key and the kubeconfig
// that names them.
func request(ctx context.Context, o Options, client *rest.Config) error {
	log := klog.FromContext(ctx).WithValues("machine", o.Machine)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("making the machine's key: %w", err)
	}
	req, err := cert.MakeCSR(key, &pkix.Name{CommonName: User(o.Machine), Organization: []string{NodeGroup}}, nil, nil)
	if err != nil {
		return fmt.Errorf("making the certificate signing request: %w", err)
	}
	cs, err := kubernetes.NewForConfig(client)
	if err != nil {
		return err
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	name, uid, err := csr.RequestCertificateWithContext(ctx, cs, req, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return fmt.Errorf("asking the cluster at %s for a certificate for %s: %s: %w", client.Host, User(o.Machine), requestHint(err), err)
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
	if err := WriteCredentials(o.Kubeconfig, client, certPEM, keyPEM); err != nil {
		return err
	}
	if err := Check(o.Kubeconfig, o.Machine, o.Now()); err != nil {
		return fmt.Errorf("the certificate the cluster issued: %w", err)
	}
	log.Info("The machine has a new certificate of its own", "request", name, "kubeconfig", o.Kubeconfig)
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
// validUntil, or nil when it can: it must hold, or name, a client
// certificate for system:node:<machine> in system:nodes, with its key,
// valid until then.
func Check(path, machine string, validUntil time.Time) error {
	c, err := certificate(path)
	if err != nil {
		return err
	}
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

// certificate reads the client certificate of the kubeconfig at path,
// held in it or in the file it names, and checks that its key is there.
func certificate(path string) (*x509.Certificate, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errors.New("the machine has not joined yet")
		}
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		return nil, fmt.Errorf("%s has no current context", path)
	}
	user := cfg.AuthInfos[ctx.AuthInfo]
	if user == nil {
		return nil, fmt.Errorf("%s holds no client certificate and key", path)
	}
	certPEM, keyPEM := user.ClientCertificateData, user.ClientKeyData
	if len(certPEM) == 0 && user.ClientCertificate != "" {
		if certPEM, err = os.ReadFile(user.ClientCertificate); err != nil {
			return nil, fmt.Errorf("%s: the client certificate: %w", path, err)
		}
	}
	if len(keyPEM) == 0 && user.ClientKey != "" {
		if keyPEM, err = os.ReadFile(user.ClientKey); err != nil {
			return nil, fmt.Errorf("%s: the client key: %w", path, err)
		}
	}
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, fmt.Errorf("%s holds no client certificate and key", path)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: the client certificate and key: %w", path, err)
	}
	return x509.ParseCertificate(pair.Certificate[0])
}

// WriteCredentials writes the machine's key and certificate to
// KeyFile(path), then the kubeconfig that names them (the server and CA of
// client), each whole or not at all: a power cut leaves the old pair or the
// new one, and the kubeconfig names the same file either way.
func WriteCredentials(path string, client *rest.Config, certPEM, keyPEM []byte) error {
	caData := client.CAData
	if len(caData) == 0 && client.CAFile != "" {
		b, err := os.ReadFile(client.CAFile)
		if err != nil {
			return fmt.Errorf("reading the cluster's CA %s: %w", client.CAFile, err)
		}
		caData = b
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	keyFile := KeyFile(path)
	if err := atomicfile.Write(keyFile, append(append([]byte{}, certPEM...), keyPEM...), 0o600); err != nil {
		return fmt.Errorf("writing the machine's key and certificate: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["liken"] = &clientcmdapi.Cluster{Server: client.Host, CertificateAuthorityData: caData, TLSServerName: client.ServerName}
	cfg.AuthInfos["machine"] = &clientcmdapi.AuthInfo{ClientCertificate: keyFile, ClientKey: keyFile}
	cfg.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: "machine"}
	cfg.CurrentContext = "liken"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("writing the machine's kubeconfig: %w", err)
	}
	return nil
}
