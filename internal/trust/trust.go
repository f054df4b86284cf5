// Package trust gives HTTP clients that trust the public certificate
// authorities and a Cluster's settings.caBundle.
package trust

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// Pool is the system's trusted certificates (the image's public CA bundle)
// with the PEM certificates of bundle added. A bundle that holds anything
// but certificates, or none, is an error that names the problem.
func Pool(bundle string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	rest := []byte(bundle)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("the Cluster's settings.caBundle holds a PEM block of type %s: it takes certificates only (never a private key)", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d of the Cluster's settings.caBundle does not parse: %w", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, errors.New("the Cluster's settings.caBundle holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
	}
	return pool, nil
}

// Transport is an http.RoundTripper that trusts the system's certificates
// and the last bundle given to Use. Its zero value trusts the system's
// only. Connections made with an earlier bundle are closed when it changes.
type Transport struct {
	// Base is the transport whose settings (timeouts, proxy) each bundle's
	// copy keeps; nil is http.DefaultTransport.
	Base *http.Transport

	mu     sync.Mutex
	bundle string
	rt     *http.Transport
}

// Use makes later requests trust bundle (the system's certificates only
// when it is empty). A bundle Pool refuses leaves the trust as it was.
func (t *Transport) Use(bundle string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rt != nil && bundle == t.bundle {
		return nil
	}
	rt, err := WithBundle(t.Base, bundle)
	if err != nil {
		return err
	}
	if t.rt != nil {
		t.rt.CloseIdleConnections()
	}
	t.bundle, t.rt = bundle, rt
	return nil
}

// RoundTrip sends req with the current trust.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	if t.rt == nil {
		t.rt = t.base()
	}
	rt := t.rt
	t.mu.Unlock()
	return rt.RoundTrip(req)
}

func (t *Transport) base() *http.Transport {
	rt, _ := WithBundle(t.Base, "")
	return rt
}

// WithBundle is a copy of base (http.DefaultTransport when nil) that
// trusts the system's certificates and bundle's (the system's only when
// bundle is empty). A bundle Pool refuses is an error.
func WithBundle(base *http.Transport, bundle string) (*http.Transport, error) {
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	rt := base.Clone()
	if bundle == "" {
		return rt, nil
	}
	pool, err := Pool(bundle)
	if err != nil {
		return nil, err
	}
	if rt.TLSClientConfig == nil {
		rt.TLSClientConfig = &tls.Config{}
	}
	rt.TLSClientConfig.RootCAs = pool
	return rt, nil
}

// CloseIdleConnections closes the current transport's idle connections.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rt != nil {
		t.rt.CloseIdleConnections()
	}
}
