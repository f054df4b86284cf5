// Package pki makes and stores liken's certificates: certificate authorities, leaf certificates they sign, and kubeconfigs that carry a client certificate.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"liken.sh/liken/internal/atomicfile"
)

// ClockSkew is how far before its Now a certificate's validity starts, so
// that a machine whose clock lags a little already accepts it.
const ClockSkew = time.Hour

// CA is a certificate authority: its certificate and the key that signs.
type CA struct {
	// Cert is the CA's certificate.
	Cert *x509.Certificate
	// Key is the CA's private key (ECDSA or RSA).
	Key crypto.Signer
}

// LoadCA reads a CA from a PEM certificate file and a PEM private key file
// (EC, RSA or PKCS #8) and checks that the certificate is a CA and that the
// key is its own. Errors name the file at fault.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA key: %w", err)
	}
	return parseCA(certPEM, keyPEM, certFile, keyFile)
}

// ParseCA is LoadCA for a certificate and a key already in memory.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	return parseCA(certPEM, keyPEM, "the CA certificate", "the CA key")
}

func parseCA(certPEM, keyPEM []byte, certName, keyName string) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certName, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s: the certificate is not a CA (basic constraints CA:FALSE); give the certificate of a certificate authority", certName)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyName, err)
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s does not belong to %s: the key pair does not match", keyName, certName)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// NewCA makes a CA with an ECDSA P-256 key, valid from ClockSkew before now
// for validity.
func NewCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	if commonName == "" || validity <= 0 || now.IsZero() {
		return nil, errors.New("a CA needs a common name, a time and a positive validity")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-ClockSkew).UTC(),
		NotAfter:              now.Add(validity).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM is the CA's certificate, PEM.
func (ca *CA) CertPEM() []byte { return EncodeCert(ca.Cert) }

// Write writes the CA's certificate (mode 0644) and key (mode 0600), each
// atomically.
func (ca *CA) Write(certFile, keyFile string) error {
	return writePair(certFile, keyFile, ca.Cert, ca.Key)
}

// Usage is what a leaf certificate may be used for: ServerAuth, ClientAuth
// or both (ServerAuth|ClientAuth).
type Usage int

// Usages of a leaf certificate.
const (
	// ServerAuth lets the certificate serve TLS.
	ServerAuth Usage = 1 << iota
	// ClientAuth lets the certificate authenticate a TLS client.
	ClientAuth
)

// ExtKeyUsages are the certificate's extended key usages for u.
func (u Usage) ExtKeyUsages() []x509.ExtKeyUsage {
	var out []x509.ExtKeyUsage
	if u&ServerAuth != 0 {
		out = append(out, x509.ExtKeyUsageServerAuth)
	}
	if u&ClientAuth != 0 {
		out = append(out, x509.ExtKeyUsageClientAuth)
	}
	return out
}

// Request describes a leaf certificate to issue.
type Request struct {
	// CommonName is the subject's common name: the user name for
	// Kubernetes and etcd.
	CommonName string
	// Organizations are the subject's organizations: the groups for
	// Kubernetes.
	Organizations []string
	// DNSNames and IPAddresses are the names a serving certificate is valid
	// for.
	DNSNames    []string
	IPAddresses []net.IP
	// Usage says whether it serves, authenticates a client, or both.
	Usage Usage
	// Now is when it is issued: it is valid from ClockSkew before Now.
	Now time.Time
	// Validity is how long after Now it stays valid.
	Validity time.Duration
}

// Leaf is a certificate a CA issued and its private key.
type Leaf struct {
	// Cert is the certificate.
	Cert *x509.Certificate
	// Key is its ECDSA P-256 private key.
	Key *ecdsa.PrivateKey
}

// Issue makes an ECDSA P-256 key and a certificate for it signed by the CA.
func (ca *CA) Issue(req Request) (*Leaf, error) {
	switch {
	case req.CommonName == "":
		return nil, errors.New("a certificate needs a common name")
	case req.Usage&(ServerAuth|ClientAuth) == 0 || req.Usage&^(ServerAuth|ClientAuth) != 0:
		return nil, fmt.Errorf("certificate %s: its usage must be server auth, client auth or both", req.CommonName)
	case req.Now.IsZero() || req.Validity <= 0:
		return nil, fmt.Errorf("certificate %s: it needs a time of issue and a positive validity", req.CommonName)
	}
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organizations},
		NotBefore:    req.Now.Add(-ClockSkew).UTC(),
		NotAfter:     req.Now.Add(req.Validity).UTC(),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  req.Usage.ExtKeyUsages(),
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %s: %w", req.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, Key: key}, nil
}

// CertPEM is the leaf's certificate, PEM.
func (l *Leaf) CertPEM() []byte { return EncodeCert(l.Cert) }

// KeyPEM is the leaf's private key, PEM.
func (l *Leaf) KeyPEM() ([]byte, error) { return EncodeKey(l.Key) }

// Write writes the leaf's certificate (mode 0644) and key (mode 0600), each
// atomically.
func (l *Leaf) Write(certFile, keyFile string) error {
	return writePair(certFile, keyFile, l.Cert, l.Key)
}

// NewKey makes an ECDSA P-256 private key.
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// EncodeCert encodes a certificate as PEM.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeKey encodes a private key as PEM: an ECDSA key as "EC PRIVATE
// KEY", an RSA key as "RSA PRIVATE KEY", any other as PKCS #8.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	var blk pem.Block
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		blk = pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	case *rsa.PrivateKey:
		blk = pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}
	default:
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		blk = pem.Block{Type: "PRIVATE KEY", Bytes: der}
	}
	return pem.EncodeToMemory(&blk), nil
}

// ParseCert parses the first PEM block, which must be a certificate.
func ParseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate (no CERTIFICATE block)")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not a valid certificate: %w", err)
	}
	return c, nil
}

// ParseKey parses the first PEM block, which must be a private key: "EC
// PRIVATE KEY", "RSA PRIVATE KEY" or PKCS #8 "PRIVATE KEY". Its errors
// never quote key material.
func ParseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("not a PEM private key (no PEM block)")
	}
	var (
		k   any
		err error
	)
	switch blk.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", blk.Type)
	}
	if err != nil {
		return nil, errors.New("not a valid private key")
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", k)
	}
	switch s.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey:
		return s, nil
	}
	return nil, fmt.Errorf("unsupported private key type %T: use an ECDSA or RSA key", s)
}

// WriteCert writes a certificate as PEM, atomically, with mode 0644.
func WriteCert(path string, cert *x509.Certificate) error {
	if err := atomicfile.Write(path, EncodeCert(cert), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteKey writes a private key as PEM (see EncodeKey), atomically, with
// mode 0600.
func WriteKey(path string, key crypto.Signer) error {
	b, err := EncodeKey(key)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func writePair(certFile, keyFile string, cert *x509.Certificate, key crypto.Signer) error {
	if err := WriteKey(keyFile, key); err != nil {
		return err
	}
	return WriteCert(certFile, cert)
}

// Kubeconfig is a kubeconfig file for a client certificate.
type Kubeconfig struct {
	// Server is the API server's URL.
	Server string
	// CA is the PEM certificate (or bundle) that signs the server's
	// certificate.
	CA []byte
	// Client is the client certificate and key it authenticates with.
	Client *Leaf
}

// WriteKubeconfig writes a kubeconfig holding the server, its CA and the
// client's certificate and key (mode 0600, atomically), as
// EncodeKubeconfig encodes it.
func WriteKubeconfig(path string, k Kubeconfig) error {
	if k.Server == "" || len(k.CA) == 0 || k.Client == nil {
		return fmt.Errorf("kubeconfig %s needs a server, a CA and a client certificate", path)
	}
	b, err := EncodeKubeconfig(k)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// EncodeKubeconfig is the kubeconfig holding the server, its CA and the
// client's certificate and key. Its cluster and context are "liken", its
// user the certificate's common name.
func EncodeKubeconfig(k Kubeconfig) ([]byte, error) {
	if k.Server == "" || len(k.CA) == 0 || k.Client == nil {
		return nil, errors.New("a kubeconfig needs a server, a CA and a client certificate")
	}
	keyPEM, err := k.Client.KeyPEM()
	if err != nil {
		return nil, err
	}
	user := k.Client.Cert.Subject.CommonName
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["liken"] = &clientcmdapi.Cluster{Server: k.Server, CertificateAuthorityData: k.CA}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: k.Client.CertPEM(), ClientKeyData: keyPEM}
	cfg.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: user}
	cfg.CurrentContext = "liken"
	return clientcmd.Write(*cfg)
}

// newSerial is a random 127-bit serial number.
func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
