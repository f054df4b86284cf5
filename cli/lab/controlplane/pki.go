package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"liken.sh/liken/internal/qemu"
)

// hostFromQEMU is the host's address on QEMU's user network: virtual
// machines reach the host's loopback through it, so the API server's
// certificate names it.
var hostFromQEMU = net.ParseIP(qemu.HostAddress)

// writePKI writes the CA (Options.CA, or a throw-away one), the API
// server's serving certificate (for 127.0.0.1, localhost and
// hostFromQEMU), etcd's certificate (serving its clients and its peer) and
// the API server's client certificate for etcd, and the service-account
// signing key.
func (cp *ControlPlane) writePKI() error {
	dir := filepath.Join(cp.Dir, "pki")
	now := time.Now()
	caCert, caKey, err := cp.ca(now)
	if err != nil {
		return err
	}
	caDER := caCert.Raw
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1"), hostFromQEMU},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	// etcd takes only clients with a certificate of this CA: no local user
	// reaches the datastore around the API server's authorization.
	etcdKey, etcdDER, err := leaf(caCert, caKey, 3, "etcd", now, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	if err != nil {
		return err
	}
	etcdClientKey, etcdClientDER, err := leaf(caCert, caKey, 4, "kube-apiserver-etcd-client", now, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	cp.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{
		"ca.crt":                    cp.caPEM,
		"apiserver.crt":             pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"etcd.crt":                  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: etcdDER}),
		"apiserver-etcd-client.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: etcdClientDER}),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{"ca.key": caKey.(*ecdsa.PrivateKey), "apiserver.key": srvKey, "sa.key": saKey, "etcd.key": etcdKey, "apiserver-etcd-client.key": etcdClientKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// leaf makes a key and a certificate signed by the CA, for 127.0.0.1 and
// localhost.
func leaf(ca *x509.Certificate, caKey crypto.Signer, serial int64, cn string, now time.Time, usages []x509.ExtKeyUsage) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	return key, der, err
}

// ca returns Options.CA, parsed, or a new throw-away CA.
func (cp *ControlPlane) ca(now time.Time) (*x509.Certificate, crypto.Signer, error) {
	if c := cp.opts.CA; c != nil {
		cb, _ := pem.Decode(c.Cert)
		kb, _ := pem.Decode(c.Key)
		if cb == nil || kb == nil {
			return nil, nil, errors.New("the control plane's CA is not a PEM certificate and key")
		}
		cert, err := x509.ParseCertificate(cb.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("the control plane's CA: %w", err)
		}
		var key any
		if key, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
			key, err = x509.ParseECPrivateKey(kb.Bytes)
		}
		ec, ok := key.(*ecdsa.PrivateKey)
		if err != nil || !ok {
			return nil, nil, fmt.Errorf("the control plane's CA key is not an ECDSA key: %v", err)
		}
		return cert, ec, nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "liken-lab-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(caDER)
	return cert, caKey, err
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
