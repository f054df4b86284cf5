package userlab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/apimachinery/pkg/api/meta"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/nsnet"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/internal/pki"
	nodecp "liken.sh/liken/node/controlplane"
)

// EtcdClient is the host's client of the leaders' etcd members: a client
// certificate of the identity's etcd/server-ca, which the members verify
// clients with and which signs their serving certificates.
func EtcdClient(t *testing.T, id *layer.Identity) *nodecp.EtcdClient {
	t.Helper()
	ca, err := pki.ParseCA(id.Files["etcd/server-ca.crt"], id.Files["etcd/server-ca.key"])
	assert.NilError(t, err)
	cert, err := ca.Issue(pki.Request{CommonName: "liken-e2e-etcd", Usage: pki.ClientAuth, Now: time.Now(), Validity: 6 * time.Hour})
	assert.NilError(t, err)
	key, err := cert.KeyPEM()
	assert.NilError(t, err)
	pair, err := tls.X509KeyPair(cert.CertPEM(), key)
	assert.NilError(t, err)
	roots := x509.NewCertPool()
	assert.Assert(t, roots.AppendCertsFromPEM(id.Files["etcd/server-ca.crt"]))
	return nodecp.NewEtcdClient(&tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12})
}

// Datastore returns a client of the lab's etcd members and each leader's
// client URL as this computer reaches it, by name: a virtual leader's
// port forwarded on the loopback, or a namespace leader's address on the
// segment, dialled from the lab's network namespace.
func (l *Lab) Datastore(t *testing.T) (*nodecp.EtcdClient, map[string]string) {
	t.Helper()
	// liken lab up keeps the cluster's identity in the lab's folder.
	id, err := layer.LoadIdentity(filepath.Join(l.St.Dir, "identity"))
	assert.NilError(t, err)
	etcd := EtcdClient(t, id)
	urls := map[string]string{}
	for _, m := range l.St.Machines {
		if m.Role != string(likenv1.RoleLeader) {
			continue
		}
		if l.St.Containers {
			urls[m.Name] = l.Machine(m.Name).Annotations[likenv1.AnnotationEtcdClientURL]
			continue
		}
		for host, guest := range m.Forwards {
			if guest == nodecp.EtcdClientPort {
				urls[m.Name] = fmt.Sprintf("https://127.0.0.1:%d", host)
			}
		}
	}
	if l.St.Containers {
		tr := etcd.HTTP.Transport.(*http.Transport)
		tr.DialContext = func(ctx context.Context, network, address string) (c net.Conn, err error) {
			err = nsnet.RunIn(l.St.NetNS, func() error {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		}
	}
	for n, u := range urls {
		assert.Assert(t, u != "", "no etcd client URL for leader %s", n)
	}
	return etcd, urls
}

// CheckDatastore reads the datastore as each leader's member sees it
// (urls: each leader's etcd client URL, by name). Every member that
// answers must list exactly the leaders, each a started voter, with the
// same member IDs; at least healthy of them must answer /health. It
// returns the members' IDs by name.
func CheckDatastore(ctx context.Context, etcd *nodecp.EtcdClient, urls map[string]string, healthy int) (map[string]uint64, error) {
	var ids map[string]uint64
	var down []error
	ok := 0
	for _, n := range slices.Sorted(maps.Keys(urls)) {
		members, err := etcd.MemberList(ctx, urls[n])
		if err != nil {
			down = append(down, fmt.Errorf("%s: %w", n, err))
			continue
		}
		got := map[string]uint64{}
		for _, m := range members {
			if m.Name != "" && len(m.ClientURLs) > 0 && !m.IsLearner {
				got[m.Name] = m.ID
			}
		}
		if len(members) != len(urls) || !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(urls))) {
			return nil, fmt.Errorf("%s lists %d members, the started voters %v; want the voters %v", n, len(members), slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(urls)))
		}
		if ids != nil && !maps.Equal(ids, got) {
			return nil, fmt.Errorf("the members disagree on their IDs: %v, and %s lists %v", ids, n, got)
		}
		ids = got
		if _, err := etcd.Health(ctx, urls[n]); err != nil {
			down = append(down, fmt.Errorf("%s: %w", n, err))
			continue
		}
		ok++
	}
	if ok < healthy {
		return nil, fmt.Errorf("%d of %d members healthy, want %d: %w", ok, len(urls), healthy, errors.Join(down...))
	}
	return ids, nil
}

// WaitDatastore waits until every leader's member is a healthy voter, as
// each member sees them, and returns their IDs by name.
func WaitDatastore(t *testing.T, etcd *nodecp.EtcdClient, urls map[string]string, timeout time.Duration) map[string]uint64 {
	t.Helper()
	var ids map[string]uint64
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var err error
		if ids, err = CheckDatastore(t.Context(), etcd, urls, len(urls)); err != nil {
			return poll.Continue("%v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(3*time.Second))
	return ids
}

// TrialFailedBack tells whether m, which tried a release after the boot
// proven shows, failed the trial and is back: a later boot, on proven's
// slot and release, TrialFailed and its control plane ready.
func TrialFailedBack(m, proven *likenv1.Machine) poll.Result {
	failed := meta.IsStatusConditionTrue(m.Status.Conditions, likenv1.ConditionTrialFailed)
	cpReady := meta.IsStatusConditionTrue(m.Status.Conditions, likenv1.ConditionControlPlaneReady)
	switch {
	case m.Status.Observed.BootID == proven.Status.Observed.BootID:
		return poll.Continue("%s: still the boot before the release", m.Name)
	case !failed || !cpReady || m.Status.Version != proven.Status.Version || m.Status.Slot != proven.Status.Slot:
		return poll.Continue("%s: %s on %q from slot %q, trial failed %v, control plane ready %v", m.Name, m.Status.Phase, m.Status.Version, m.Status.Slot, failed, cpReady)
	}
	return poll.Success()
}

// FailedTrialLogs checks what liken logs reads of machine, back on its
// proven slot after its trial of the release bad failed (a release whose
// init panics, so the trial's boot never started its journal), through
// the API server and the machine's kubelet: this boot's liken-node says
// the trial failed; the boot before, kept on the slot store, took the turn
// for bad; the kernel's messages of this boot are there.
func FailedTrialLogs(t *testing.T, l *Lab, machine, bad string) {
	t.Helper()
	kc := "--kubeconfig=" + l.Kubeconfig
	logs := l.Run("logs", machine, kc, "--grep", "The last trial failed")
	assert.Check(t, is.Contains(logs, bad), "liken logs %s did not say the trial of %s failed:\n%s", machine, bad, logs)
	logs = l.Run("logs", machine, kc, "--boot", "-1", "--grep", "Turn granted")
	assert.Check(t, is.Contains(logs, "release "+bad), "liken logs %s --boot -1 did not show the turn for %s:\n%s", machine, bad, logs)
	logs = l.Run("logs", machine, kc, "--kernel")
	assert.Check(t, is.Contains(logs, "Copying the kernel messages of this boot"), "liken logs %s --kernel:\n%s", machine, logs)
}
