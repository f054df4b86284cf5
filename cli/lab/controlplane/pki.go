package controlplane

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"liken.sh/liken/internal/pki"
	"liken.sh/liken/internal/qemu"
)

// hostFromQEMU is the host's address on QEMU's user network: virtual
// machines reach the host's loopback through it, so the API server's
// certificate names it.
var hostFromQEMU = net.ParseIP(qemu.HostAddress)

// pkiValidity is how long the lab's certificates stay valid.
const pkiValidity = 10 * 365 * 24 * time.Hour

// writePKI writes the CA (Options.CA, or a throw-away one), the API
// server's serving certificate (for 127.0.0.1, localhost and
// hostFromQEMU), etcd's certificate (serving its clients and its peer) and
// the API server's client certificate for etcd, and the service-account
// signing key.
func (cp *ControlPlane) writePKI() error {
	dir := filepath.Join(cp.Dir, "pki")
	file := func(name string) string { return filepath.Join(dir, name) }
	now := time.Now()
	ca, err := cp.ca(now)
	if err != nil {
		return err
	}
	loopback := pki.Request{
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		Now:         now,
		Validity:    pkiValidity,
	}
	apiserver := loopback
	apiserver.CommonName = "kube-apiserver"
	apiserver.Usage = pki.ServerAuth
	apiserver.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	apiserver.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1"), hostFromQEMU}
	// etcd takes only clients with a certificate of this CA: no local user
	// reaches the datastore around the API server's authorization.
	etcd := loopback
	etcd.CommonName = "etcd"
	etcd.Usage = pki.ServerAuth | pki.ClientAuth
	etcdClient := loopback
	etcdClient.CommonName = "kube-apiserver-etcd-client"
	etcdClient.Usage = pki.ClientAuth
	for name, req := range map[string]pki.Request{"apiserver": apiserver, "etcd": etcd, "apiserver-etcd-client": etcdClient} {
		leaf, err := ca.Issue(req)
		if err != nil {
			return err
		}
		if err := leaf.Write(file(name+".crt"), file(name+".key")); err != nil {
			return err
		}
	}
	saKey, err := pki.NewKey()
	if err != nil {
		return err
	}
	if err := pki.WriteKey(file("sa.key"), saKey); err != nil {
		return err
	}
	cp.caPEM = ca.CertPEM()
	return ca.Write(file("ca.crt"), file("ca.key"))
}

// ca returns Options.CA, parsed, or a new throw-away CA.
func (cp *ControlPlane) ca(now time.Time) (*pki.CA, error) {
	if c := cp.opts.CA; c != nil {
		ca, err := pki.ParseCA(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("the control plane's CA: %w", err)
		}
		return ca, nil
	}
	return pki.NewCA("liken-lab-ca", now, pkiValidity)
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
