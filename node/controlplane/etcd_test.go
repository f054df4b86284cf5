package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"liken.sh/liken/internal/srctree"
)

// writeCert makes a key and a certificate for 127.0.0.1 signed by ca (self
// signed when ca is nil) and writes name.crt and name.key into dir.
func writeCert(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usages ...x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	assert.NilError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	signer, signerKey := ca, caKey
	if ca == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.IPAddresses = nil
		signer, signerKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	assert.NilError(t, err)
	cert, err := x509.ParseCertificate(der)
	assert.NilError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return cert, key
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd runs a one-member etcd named name from the kube binary, with
// TLS and client certificates required on its client and peer URLs, and
// returns its client URL, its peer URL and a client with a certificate
// of its CA. etcd stops when the test ends.
func startEtcd(t *testing.T, name string) (clientURL, peerURL string, c *EtcdClient) {
	t.Helper()
	bin, err := srctree.Binary("kube")
	assert.NilError(t, err)
	dir := t.TempDir()
	ca, caKey := writeCert(t, dir, "ca", nil, nil)
	writeCert(t, dir, "etcd", ca, caKey, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	writeCert(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	clientURL = fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	peerURL = fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	f := func(n string) string { return filepath.Join(dir, n) }
	logFile, err := os.Create(f("etcd.log"))
	assert.NilError(t, err)
	defer logFile.Close()
	cmd := exec.Command(bin, "etcd",
		"--name", name,
		"--data-dir", f("data"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", name+"="+peerURL,
		"--cert-file", f("etcd.crt"), "--key-file", f("etcd.key"),
		"--trusted-ca-file", f("ca.crt"), "--client-cert-auth",
		"--peer-cert-file", f("etcd.crt"), "--peer-key-file", f("etcd.key"),
		"--peer-trusted-ca-file", f("ca.crt"), "--peer-client-cert-auth",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	assert.NilError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(f("etcd.log"))
			t.Logf("etcd's log:\n%s", b)
		}
	})

	c, err = NewEtcdClientFromFiles(f("client.crt"), f("client.key"), f("ca.crt"))
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-exited:
			exited <- err
			return poll.Error(fmt.Errorf("etcd exited: %v", err))
		default:
		}
		if ok, err := c.Health(context.Background(), clientURL); !ok {
			return poll.Continue("etcd is not healthy yet: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(200*time.Millisecond))
	return clientURL, peerURL, c
}

// TestEtcdClient runs the client against a real etcd's gateway: the JSON
// it reads (IDs as strings, fields left out when empty) and etcd's errors.
func TestEtcdClient(t *testing.T) {
	clientURL, peerURL, c := startEtcd(t, "leader-a")
	ctx := context.Background()

	members, err := c.MemberList(ctx, clientURL)
	assert.NilError(t, err)
	assert.Equal(t, len(members), 1)
	self := members[0]
	assert.Check(t, self.ID != 0)
	assert.DeepEqual(t, self, Member{ID: self.ID, Name: "leader-a", PeerURLs: []string{peerURL}, ClientURLs: []string{clientURL}})

	// The datastore's ID comes with the list; another datastore has another.
	cluster, listed, err := c.ClusterMembers(ctx, clientURL)
	assert.NilError(t, err)
	assert.Check(t, cluster != 0, "no cluster ID")
	assert.DeepEqual(t, listed, members)
	otherURL, _, otherClient := startEtcd(t, "leader-z")
	other, _, err := otherClient.ClusterMembers(ctx, otherURL)
	assert.NilError(t, err)
	assert.Check(t, other != 0 && other != cluster, "two datastores with cluster IDs %x and %x", cluster, other)

	// A learner for a machine that has not started etcd yet.
	learnerPeer := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	added, after, err := c.MemberAdd(ctx, clientURL, learnerPeer, true)
	assert.NilError(t, err)
	assert.Check(t, added.ID != 0 && added.ID != self.ID, "added %x", added.ID)
	assert.DeepEqual(t, added, Member{ID: added.ID, PeerURLs: []string{learnerPeer}, IsLearner: true})
	assert.DeepEqual(t, byID(after), map[uint64]Member{self.ID: self, added.ID: added})

	members, err = c.MemberList(ctx, clientURL)
	assert.NilError(t, err)
	assert.DeepEqual(t, byID(members), map[uint64]Member{self.ID: self, added.ID: added})
	// What etcd-start reads from this list: this machine's learner, added
	// and not started, is started as it and not added again.
	d := DecideStart(StartInput{Name: "leader-b", PeerURL: learnerPeer, Listed: true, Members: members})
	assert.Equal(t, d.Action, StartAdded, d.Reason)
	d = DecideStart(StartInput{Name: "leader-c", PeerURL: "https://127.0.0.1:1", Listed: true, Members: members})
	assert.Equal(t, d.Action, Wait, d.Reason)

	// etcd's refusals come back with the URL and etcd's message.
	_, _, err = c.MemberAdd(ctx, clientURL, fmt.Sprintf("https://127.0.0.1:%d", freePort(t)), true)
	assert.ErrorContains(t, err, "etcd at "+clientURL+"/v3/cluster/member/add answered HTTP 400: etcdserver: too many learner members in cluster")
	_, err = c.MemberPromote(ctx, clientURL, added.ID)
	assert.ErrorContains(t, err, "etcd at "+clientURL+"/v3/cluster/member/promote answered HTTP 400: etcdserver: can only promote a learner member which is in sync with leader")

	left, err := c.MemberRemove(ctx, clientURL, added.ID)
	assert.NilError(t, err)
	assert.DeepEqual(t, left, []Member{self})
	members, err = c.MemberList(ctx, clientURL)
	assert.NilError(t, err)
	assert.DeepEqual(t, members, []Member{self})
	_, err = c.MemberRemove(ctx, clientURL, added.ID)
	assert.ErrorContains(t, err, "etcd at "+clientURL+"/v3/cluster/member/remove answered HTTP 404: etcdserver: member not found")

	ok, err := c.Health(ctx, clientURL)
	assert.NilError(t, err)
	assert.Check(t, ok)

	// etcd takes no client without a certificate of its CA.
	tlsConfig := c.HTTP.Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConfig.Certificates = nil
	_, err = NewEtcdClient(tlsConfig).MemberList(ctx, clientURL)
	assert.ErrorContains(t, err, "etcd at "+clientURL+"/v3/cluster/member/list: ")
}

// TestEtcdClientDeadline: a member that takes the connection and never
// answers costs one Timeout, or less when the caller's context ends first.
func TestEtcdClientDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // held open, never answered
		}
	}()
	u := "https://" + l.Addr().String()
	for _, tc := range []struct {
		name        string
		timeout     time.Duration
		ctxDeadline time.Duration
	}{
		{name: "the client's timeout", timeout: 300 * time.Millisecond},
		{name: "the caller's deadline", timeout: time.Hour, ctxDeadline: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewEtcdClient(&tls.Config{})
			c.Timeout = tc.timeout
			ctx := context.Background()
			if tc.ctxDeadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxDeadline)
				defer cancel()
			}
			start := time.Now()
			_, err := c.MemberList(ctx, u)
			assert.ErrorContains(t, err, "etcd at "+u+"/v3/cluster/member/list: ")
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			_, err = c.Health(ctx, u)
			assert.ErrorContains(t, err, "etcd health at "+u+"/health: ")
			assert.Check(t, time.Since(start) < 10*time.Second, "the calls took %s", time.Since(start))
		})
	}
}

func byID(members []Member) map[uint64]Member {
	m := map[uint64]Member{}
	for _, x := range members {
		m[x.ID] = x
	}
	return m
}
