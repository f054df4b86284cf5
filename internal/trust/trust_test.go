package trust

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/internal/pki"
)

// privateServer is an https server on loopback whose certificate a private
// CA signed for the name channel.example; it returns the server and the
// CA's certificate in PEM.
func privateServer(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	now := time.Now()
	ca, err := pki.NewCA("a private CA", now, time.Hour)
	assert.NilError(t, err)
	leaf, err := ca.Issue(pki.Request{CommonName: "channel.example", DNSNames: []string{"channel.example"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.ServerAuth, Now: now, Validity: time.Hour})
	assert.NilError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("index")) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: leaf.Key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, string(ca.CertPEM())
}

// TestTransportTrustsTheBundleItIsGiven: a server signed by a private CA is
// refused until the Cluster's bundle holds that CA, trusted once it does,
// and refused again once the bundle is emptied.
func TestTransportTrustsTheBundleItIsGiven(t *testing.T) {
	srv, caPEM := privateServer(t)
	tr := &Transport{}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func() error {
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	assert.ErrorContains(t, get(), "certificate signed by unknown authority")
	assert.NilError(t, tr.Use(caPEM))
	assert.NilError(t, get())
	assert.NilError(t, tr.Use(""))
	assert.ErrorContains(t, get(), "certificate signed by unknown authority")
}

func TestPoolRefusesWhatIsNotACertificate(t *testing.T) {
	_, caPEM := privateServer(t)
	key, err := pki.NewKey()
	assert.NilError(t, err)
	keyPEM, err := pki.EncodeKey(key)
	assert.NilError(t, err)
	for _, tc := range []struct{ name, bundle, want string }{
		{name: "text", bundle: "not a certificate", want: "holds no PEM certificate"},
		{name: "a private key", bundle: caPEM + string(keyPEM), want: "holds a PEM block of type EC PRIVATE KEY: it takes certificates only"},
		{name: "a damaged certificate", bundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", want: "certificate 1 of the Cluster's settings.caBundle does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Pool(tc.bundle)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	tr := &Transport{}
	assert.NilError(t, tr.Use(caPEM))
	assert.Check(t, tr.Use("not a certificate") != nil)
	assert.Check(t, is.Equal(tr.bundle, caPEM), "a refused bundle leaves the trust as it was")
}
