package layer

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/pki"
)

// Defaults of an administrator's kubeconfig (see AdminKubeconfig).
const (
	// DefaultAdminUser is the user name in the certificate.
	DefaultAdminUser = "liken-admin"
	// AdminGroup is the group the certificate names unless told others:
	// Kubernetes lets its members do anything.
	AdminGroup = "system:masters"
	// DefaultAdminValidity is how long the certificate is valid. It is
	// short because a certificate cannot be revoked short of a new client
	// CA.
	DefaultAdminValidity = 24 * time.Hour
)

// AdminRequest describes an administrator's kubeconfig: the API it
// reaches and whom its client certificate names, for how long.
type AdminRequest struct {
	// Server is the API's host:port or URL, normalised as the Cluster's
	// spec.network.endpoint is (see APIServerURL).
	Server string
	// User is the certificate's common name: the Kubernetes user name.
	User string
	// Groups are the certificate's organizations: the Kubernetes groups.
	Groups []string
	// Now is when the certificate is issued.
	Now time.Time
	// Validity is how long after Now the certificate stays valid.
	Validity time.Duration
}

// errNoClientCAKey says why an identity without the client CA's key
// cannot give a kubeconfig.
const errNoClientCAKey = "has no client-ca.key, the key that signs administrators' certificates: a worker's layer carries the identity's certificates and join token but no key; use the identity folder liken layer generate wrote"

// AdminKubeconfig issues a client certificate of the identity's client CA
// as req asks and returns the kubeconfig that reaches req.Server with it,
// trusting the identity's server CA. The API server of a liken cluster
// trusts every certificate its client CA signs.
func AdminKubeconfig(id *Identity, req AdminRequest) (pki.Kubeconfig, error) {
	server, err := APIServerURL(req.Server)
	if err != nil {
		return pki.Kubeconfig{}, err
	}
	switch {
	case req.User == "":
		return pki.Kubeconfig{}, errors.New("no user name for the certificate: give one, such as " + DefaultAdminUser)
	case slices.Contains(req.Groups, ""):
		return pki.Kubeconfig{}, errors.New("an empty group name: give each group a name, such as " + AdminGroup)
	case req.Validity <= 0:
		return pki.Kubeconfig{}, fmt.Errorf("validity %s is not positive: give a duration such as %s", req.Validity, DefaultAdminValidity)
	case len(id.Files["client-ca.key"]) == 0:
		return pki.Kubeconfig{}, errors.New("the identity " + errNoClientCAKey)
	case len(id.Files["server-ca.crt"]) == 0:
		return pki.Kubeconfig{}, errors.New("the identity has no server-ca.crt, which the kubeconfig trusts; use the identity folder liken layer generate wrote")
	}
	ca, err := pki.ParseCA(id.Files["client-ca.crt"], id.Files["client-ca.key"])
	if err != nil {
		return pki.Kubeconfig{}, fmt.Errorf("the identity's client CA: %w", err)
	}
	if end := req.Now.Add(req.Validity); end.After(ca.Cert.NotAfter) {
		return pki.Kubeconfig{}, fmt.Errorf("the client CA expires at %s, before the certificate would (%s): choose a shorter validity", ca.Cert.NotAfter.Format(time.RFC3339), end.UTC().Format(time.RFC3339))
	}
	cert, err := ca.Issue(pki.Request{CommonName: req.User, Organizations: req.Groups, Usage: pki.ClientAuth, Now: req.Now, Validity: req.Validity})
	if err != nil {
		return pki.Kubeconfig{}, err
	}
	return pki.Kubeconfig{Server: server, CA: id.Files["server-ca.crt"], Client: cert}, nil
}

// APIServerURL normalises an API server's host:port or URL as the
// Cluster's spec.network.endpoint is (v1alpha1.NetworkSpec.EndpointURL)
// and checks it is an https URL with a host and a port.
func APIServerURL(s string) (string, error) {
	example := "such as 10.0.0.10:6443 or https://api.example.com:6443 (the Cluster's spec.network.endpoint)"
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("no API server: give its host:port or URL, %s", example)
	}
	n := v1alpha1.NetworkSpec{Endpoint: s}
	norm := n.EndpointURL()
	u, err := url.Parse(norm)
	switch {
	case err != nil || u.Hostname() == "":
		return "", fmt.Errorf("API server %q is not host:port or a URL: give one %s", s, example)
	case u.Scheme != "https":
		return "", fmt.Errorf("API server %q is not https: the API server serves https only; give %s", s, example)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("API server %q holds a user, a query or a fragment: give only its host:port or URL, %s", s, example)
	}
	if port, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || port == 0 {
		return "", fmt.Errorf("API server %q has no port between 1 and 65535: give one, %s", s, example)
	}
	return norm, nil
}

// loadSigningIdentity loads the identity in dir, saying so plainly when it
// is a copy without the client CA's key.
func loadSigningIdentity(dir string) (*Identity, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("identity folder %s: %w (liken layer generate writes one)", dir, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("identity %s is not a folder: give the folder liken layer generate wrote", dir)
	}
	if _, err := os.Lstat(filepath.Join(dir, "client-ca.key")); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("identity %s %s", dir, errNoClientCAKey)
	}
	return LoadIdentity(dir)
}
