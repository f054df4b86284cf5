package layer

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// CA is one certificate authority of a cluster identity: where its files
// live inside the identity and what it signs.
type CA struct {
	// Name is the file stem, such as "server-ca" or "etcd/peer-ca".
	Name string
	// CommonName is the subject common name given to a new CA.
	CommonName string
	// Purpose says what the CA signs, for people.
	Purpose string
}

// CertFile is the path of the CA's certificate inside the identity.
func (c CA) CertFile() string { return c.Name + ".crt" }

// KeyFile is the path of the CA's private key inside the identity.
func (c CA) KeyFile() string { return c.Name + ".key" }

// CAs are the certificate authorities a k3s cluster needs, laid out as k3s
// keeps them under server/tls.
var CAs = []CA{
	{Name: "server-ca", CommonName: "liken-server-ca", Purpose: "signs the API server's serving certificates; machines trust it when they join"},
	{Name: "client-ca", CommonName: "liken-client-ca", Purpose: "signs client certificates of kubelets, components and administrators"},
	{Name: "request-header-ca", CommonName: "liken-request-header-ca", Purpose: "signs the front proxy's client certificate (API aggregation)"},
	{Name: "etcd/server-ca", CommonName: "liken-etcd-server-ca", Purpose: "signs the datastore's serving and client certificates"},
	{Name: "etcd/peer-ca", CommonName: "liken-etcd-peer-ca", Purpose: "signs the certificates datastore members use between themselves"},
}

// Identity file names other than the CAs'.
const (
	// ServiceAccountKeyFile holds the key that signs service account tokens.
	ServiceAccountKeyFile = "service.key"
	// TokenFile holds the join token.
	TokenFile = "token"
)

// IdentityFiles lists every file of an identity, in a stable order.
func IdentityFiles() []string {
	var files []string
	for _, ca := range CAs {
		files = append(files, ca.CertFile(), ca.KeyFile())
	}
	return append(files, ServiceAccountKeyFile, TokenFile)
}

// privateKeyFiles lists the identity's private keys: the CAs' and the
// service-account key.
func privateKeyFiles() []string {
	var files []string
	for _, ca := range CAs {
		files = append(files, ca.KeyFile())
	}
	return append(files, ServiceAccountKeyFile)
}

// isSecretFile reports whether an identity file must stay private (mode
// 0600, never printed).
func isSecretFile(name string) bool {
	return strings.HasSuffix(name, ".key") || name == TokenFile
}

// Identity is a cluster identity: the CAs and key pairs a k3s cluster needs
// and its join token, as file contents keyed by their relative path (see
// IdentityFiles).
type Identity struct {
	Files map[string][]byte
}

// GenerateOptions tunes GenerateIdentity.
type GenerateOptions struct {
	// Cluster is put in the CAs' subject, so people can tell identities apart.
	Cluster string
	// Validity is how long the CAs are valid. Default 10 years.
	Validity time.Duration
	// Now is the start of validity. Default time.Now.
	Now time.Time
	// Rand is the source of randomness. Default crypto/rand.
	Rand io.Reader
}

// DefaultCAValidity is how long generated CAs are valid.
const DefaultCAValidity = 10 * 365 * 24 * time.Hour

// GenerateIdentity creates a new cluster identity: an ECDSA P-256 CA for
// each entry of CAs, an RSA service-account signing key, and a join token
// in the full format k3s accepts (K10<sha256 of server-ca.crt>::<id>.<secret>),
// whose bootstrap token machines join with.
func GenerateIdentity(opts GenerateOptions) (*Identity, error) {
	if opts.Validity <= 0 {
		opts.Validity = DefaultCAValidity
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.Rand == nil {
		opts.Rand = rand.Reader
	}
	id := &Identity{Files: map[string][]byte{}}
	for _, ca := range CAs {
		cn := ca.CommonName
		if opts.Cluster != "" {
			cn += "@" + opts.Cluster
		}
		certPEM, keyPEM, err := newCA(opts.Rand, cn, opts.Now, opts.Validity)
		if err != nil {
			return nil, fmt.Errorf("generating %s: %w", ca.Name, err)
		}
		id.Files[ca.CertFile()] = certPEM
		id.Files[ca.KeyFile()] = keyPEM
	}
	saKey, err := rsa.GenerateKey(opts.Rand, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating the service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	id.Files[ServiceAccountKeyFile] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	// A Kubernetes bootstrap token: 6 and 16 characters of [a-z0-9].
	raw := make([]byte, 22)
	if _, err := io.ReadFull(opts.Rand, raw); err != nil {
		return nil, fmt.Errorf("generating the join token: %w", err)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for i, b := range raw {
		raw[i] = alphabet[int(b)%len(alphabet)]
	}
	id.Files[TokenFile] = []byte(JoinToken(id.Files["server-ca.crt"], string(raw[:6])+"."+string(raw[6:])) + "\n")
	return id, nil
}

// JoinToken formats a full join token as k3s accepts it for an agent: K10,
// the SHA-256 of the server CA bundle, then :: and a Kubernetes bootstrap
// token (<id>.<secret>), with which a machine joins through TLS bootstrap.
func JoinToken(serverCA []byte, bootstrapToken string) string {
	sum := sha256.Sum256(serverCA)
	return "K10" + hex.EncodeToString(sum[:]) + "::" + bootstrapToken
}

// bootstrapTokenFormat is a Kubernetes bootstrap token.
var bootstrapTokenFormat = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

// BootstrapToken returns the bootstrap token (<id>.<secret>) of a join
// token file, which a machine presents to the API server to join.
func BootstrapToken(tokenFile []byte) (id, secret string, err error) {
	_, rest, ok := strings.Cut(strings.TrimSpace(string(tokenFile)), "::")
	m := bootstrapTokenFormat.FindStringSubmatch(rest)
	if !ok || m == nil {
		return "", "", errors.New("the join token is not in the full format K10<CA hash>::<id>.<secret> (a bootstrap token: 6 and 16 characters of a-z, 0-9)")
	}
	return m[1], m[2], nil
}

func newCA(rnd io.Reader, cn string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rnd, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"liken"}},
		NotBefore:             now.Add(-time.Hour).UTC(),
		NotAfter:              now.Add(validity).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// maxIdentityFile bounds every identity file read from disk or an archive.
const maxIdentityFile = 64 << 10

// LoadIdentity reads an identity directory written by WriteIdentity (or by
// hand, with the same file names) and checks it with Verify.
func LoadIdentity(dir string) (*Identity, error) {
	id := &Identity{Files: map[string][]byte{}}
	for _, name := range IdentityFiles() {
		p := filepath.Join(dir, filepath.FromSlash(name))
		b, err := readRegularFile(p, maxIdentityFile)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("identity %s is incomplete: %s is missing (liken layer generate %s writes a complete one)", dir, name, dir)
			}
			return nil, fmt.Errorf("identity %s: %w", dir, err)
		}
		id.Files[name] = b
	}
	if err := id.Verify(); err != nil {
		return nil, fmt.Errorf("identity %s: %w", dir, err)
	}
	return id, nil
}

// readRegularFile reads a regular file of at most limit bytes, refusing
// anything else (a device, a FIFO, a directory).
func readRegularFile(p string, limit int64) ([]byte, error) {
	// Stat before opening: opening a FIFO would block.
	if st, err := os.Stat(p); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", p, st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is more than the %d bytes allowed", p, limit)
	}
	return b, nil
}

// WriteIdentity writes the identity into dir (created 0700 if missing).
// Private keys and the token are written 0600, certificates 0644. It refuses
// to overwrite any existing identity file.
func WriteIdentity(dir string, id *Identity) error {
	for _, name := range IdentityFiles() {
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(name))); err == nil {
			return fmt.Errorf("%s already holds an identity (%s exists): a cluster keeps its identity for life; choose an empty directory", dir, name)
		}
	}
	for _, name := range IdentityFiles() {
		b, ok := id.Files[name]
		if !ok {
			return fmt.Errorf("identity has no %s", name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if isSecretFile(name) {
			mode = 0o600
		}
		if err := writeFileExclusive(p, b, mode); err != nil {
			return err
		}
	}
	return nil
}

// writeFileExclusive creates p with mode (never following an existing file
// or link) and writes b.
func writeFileExclusive(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil { // umask may have narrowed it
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// HasPrivateKeys reports whether the identity holds any private key. A
// leader's identity holds them all; a worker's holds none (see
// WithoutPrivateKeys).
func (id *Identity) HasPrivateKeys() bool {
	for _, name := range privateKeyFiles() {
		if _, ok := id.Files[name]; ok {
			return true
		}
	}
	return false
}

// WithoutPrivateKeys returns the identity without its private keys: the CA
// certificates and the join token. A worker's disk carries it (without the
// token, unless the fleet shares one): it trusts the certificates and
// never signs anything.
func (id *Identity) WithoutPrivateKeys() *Identity {
	out := &Identity{Files: map[string][]byte{}}
	for name, b := range id.Files {
		if !slices.Contains(privateKeyFiles(), name) {
			out.Files[name] = b
		}
	}
	return out
}

// Verify checks that every file is present and well formed: each CA
// certificate is a CA and its key matches it, the service-account key is a
// private key, and the join token names the server CA. An identity without
// any private key (a worker's) is complete with its certificates, and its
// join token if it has one; one with only some of its keys is not.
func (id *Identity) Verify() error {
	var errs []error
	withKeys := id.HasPrivateKeys()
	for _, name := range IdentityFiles() {
		// A worker's identity has no private key, and its join token only
		// when its fleet shares one.
		optional := !withKeys && (name == TokenFile || slices.Contains(privateKeyFiles(), name))
		if _, ok := id.Files[name]; !ok && !optional {
			errs = append(errs, fmt.Errorf("%s is missing", name))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, ca := range CAs {
		cert, err := parseCert(id.Files[ca.CertFile()])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ca.CertFile(), err))
			continue
		}
		if !cert.IsCA {
			errs = append(errs, fmt.Errorf("%s: the certificate is not a CA (basic constraints CA:FALSE)", ca.CertFile()))
		}
		if !withKeys {
			continue
		}
		key, err := parseKey(id.Files[ca.KeyFile()])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ca.KeyFile(), err))
			continue
		}
		if !publicKeysEqual(key.Public(), cert.PublicKey) {
			errs = append(errs, fmt.Errorf("%s does not belong to %s: the key pair does not match", ca.KeyFile(), ca.CertFile()))
		}
	}
	if withKeys {
		if _, err := parseKey(id.Files[ServiceAccountKeyFile]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ServiceAccountKeyFile, err))
		}
	}
	if tok, ok := id.Files[TokenFile]; ok {
		if err := checkToken(tok, id.Files["server-ca.crt"]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", TokenFile, err))
		}
	}
	return errors.Join(errs...)
}

// checkToken checks a join token's format and that its CA hash names the
// server CA. Its messages never quote the token.
func checkToken(tokenFile, serverCA []byte) error {
	tok := strings.TrimSpace(string(tokenFile))
	if strings.ContainsAny(tok, "\n\r\t ") {
		return errors.New("the join token must be one line without spaces")
	}
	hash, _, ok := strings.Cut(strings.TrimPrefix(tok, "K10"), "::")
	if !strings.HasPrefix(tok, "K10") || !ok {
		return errors.New("the join token is not in the full format K10<CA hash>::<id>.<secret>")
	}
	if _, _, err := BootstrapToken(tokenFile); err != nil {
		return err
	}
	sum := sha256.Sum256(serverCA)
	if hash != hex.EncodeToString(sum[:]) {
		return errors.New("the join token's CA hash is not the SHA-256 of server-ca.crt: the token belongs to another identity")
	}
	return nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not a valid certificate: %w", err)
	}
	return c, nil
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("not a PEM private key")
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
		return nil, errors.New("not a valid private key") // never echo key material
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("unsupported private key type")
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// Fingerprint describes one identity file without revealing a secret.
type Fingerprint struct {
	// File is the identity file.
	File string
	// Kind is "certificate", "private key" or "join token".
	Kind string
	// Detail is a short description: subject and expiry, key type, or what
	// the token is bound to.
	Detail string
	// SHA256 is the certificate's SHA-256 fingerprint (of its DER bytes, as
	// openssl x509 -fingerprint -sha256 prints it) or, for a key, the SHA-256
	// of its public key (PKIX DER). Empty for the token.
	SHA256 string
}

// Fingerprints describes every identity file: certificates by their
// fingerprint, private keys by their public key's, the token only by what it
// is bound to. Nothing secret is included.
func (id *Identity) Fingerprints() []Fingerprint {
	var out []Fingerprint
	certs := map[string]*x509.Certificate{}
	for _, name := range IdentityFiles() {
		b, ok := id.Files[name]
		if !ok {
			continue
		}
		fp := Fingerprint{File: name}
		switch {
		case name == TokenFile:
			fp.Kind = "join token"
			if err := checkToken(b, id.Files["server-ca.crt"]); err != nil {
				fp.Detail = "INVALID: " + err.Error()
			} else {
				fp.Detail = "full k3s format, bound to server-ca.crt (secret withheld)"
			}
		case strings.HasSuffix(name, ".crt"):
			fp.Kind = "certificate"
			c, err := parseCert(b)
			if err != nil {
				fp.Detail = "INVALID: " + err.Error()
				break
			}
			certs[strings.TrimSuffix(name, ".crt")] = c
			sum := sha256.Sum256(c.Raw)
			fp.SHA256 = colonHex(sum[:])
			fp.Detail = fmt.Sprintf("CN=%s, valid until %s", c.Subject.CommonName, c.NotAfter.UTC().Format("2006-01-02"))
		default:
			fp.Kind = "private key"
			k, err := parseKey(b)
			if err != nil {
				fp.Detail = "INVALID: " + err.Error()
				break
			}
			pub, err := x509.MarshalPKIXPublicKey(k.Public())
			if err != nil {
				fp.Detail = "INVALID: " + err.Error()
				break
			}
			sum := sha256.Sum256(pub)
			fp.SHA256 = colonHex(sum[:])
			fp.Detail = keyType(k)
			if c, ok := certs[strings.TrimSuffix(name, ".key")]; ok {
				if publicKeysEqual(k.Public(), c.PublicKey) {
					fp.Detail += ", matches " + strings.TrimSuffix(name, ".key") + ".crt"
				} else {
					fp.Detail += ", DOES NOT MATCH " + strings.TrimSuffix(name, ".key") + ".crt"
				}
			}
		}
		out = append(out, fp)
	}
	return out
}

func keyType(k crypto.Signer) string {
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PrivateKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	default:
		return fmt.Sprintf("%T", k)
	}
}

func colonHex(b []byte) string {
	var buf bytes.Buffer
	for i, c := range b {
		if i > 0 {
			buf.WriteByte(':')
		}
		fmt.Fprintf(&buf, "%02X", c)
	}
	return buf.String()
}
