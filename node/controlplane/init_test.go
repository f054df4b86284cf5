package controlplane

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/srctree"
	"liken.sh/liken/manifests"
)

const (
	testTokenID     = "abcdef"
	testTokenSecret = "0123456789abcdef"
)

// writeToken writes a join token file as the identity holds it.
func writeToken(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), TokenFile)
	assert.NilError(t, os.WriteFile(p, []byte("K10"+fmt.Sprintf("%064x", 7)+"::"+testTokenID+"."+testTokenSecret+"\n"), 0o600))
	return p
}

func TestBootstrapToken(t *testing.T) {
	hash := "K10" + fmt.Sprintf("%064x", 1) + "::"
	for _, tc := range []struct {
		name       string
		file       string
		id, secret string
	}{
		{name: "a token file", file: hash + "abcdef.0123456789abcdef\n", id: "abcdef", secret: "0123456789abcdef"},
		{name: "spaces around", file: "  " + hash + "a1b2c3.zzzzzzzzzzzzzzzz  \n", id: "a1b2c3", secret: "zzzzzzzzzzzzzzzz"},
		{name: "no CA hash", file: "abcdef.0123456789abcdef"},
		{name: "no dot", file: hash + "abcdef0123456789abcdef"},
		{name: "short ID", file: hash + "abcde.0123456789abcdef"},
		{name: "long secret", file: hash + "abcdef.0123456789abcdef0"},
		{name: "upper case", file: hash + "ABCDEF.0123456789abcdef"},
		{name: "not a-z0-9", file: hash + "abcdef.0123456789abcde-"},
		{name: "a second separator", file: hash + "abcdef.0123456789abcdef::x"},
		{name: "two lines", file: hash + "abcdef.0123456789abcdef\nsecond\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, secret, err := BootstrapToken([]byte(tc.file))
			if tc.id == "" {
				assert.ErrorContains(t, err, "the join token is not K10<CA hash>::<id>.<secret>")
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, id, tc.id)
			assert.Equal(t, secret, tc.secret)
		})
	}
}

// fakePromoter is the leaders' etcd gateways for Init: one member list;
// the member named learnerName, while a learner, refuses every call at
// its own URL, as etcd does.
type fakePromoter struct {
	mu          sync.Mutex
	up          map[string]bool
	members     []Member
	learnerURL  string // the URL of the member that may be a learner
	learnerName string
	refusals    int      // promotions refused before one is accepted
	calls       []string // promotions, in order
}

func (f *fakePromoter) refuse(u string) error {
	if !f.up[u] {
		return errDown
	}
	if m := named(f.members, f.learnerName); u == f.learnerURL && m != nil && m.IsLearner {
		return errors.New("etcdserver: rpc not supported for learner")
	}
	return nil
}

func (f *fakePromoter) MemberList(_ context.Context, u string) ([]Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refuse(u); err != nil {
		return nil, err
	}
	return slices.Clone(f.members), nil
}

func (f *fakePromoter) MemberPromote(_ context.Context, u string, id uint64) ([]Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("promote %d via %s", id, u))
	if err := f.refuse(u); err != nil {
		return nil, err
	}
	if f.refusals > 0 {
		f.refusals--
		return nil, errors.New("etcdserver: can only promote a learner member which is in sync with leader")
	}
	for i := range f.members {
		if f.members[i].ID == id {
			if !f.members[i].IsLearner {
				return nil, errors.New("etcdserver: can only promote a learner member")
			}
			f.members[i].IsLearner = false
			return slices.Clone(f.members), nil
		}
	}
	return nil, errors.New("etcdserver: member not found")
}

// runInit runs Init and steps the fake clock whenever Init waits, until
// Init returns. It returns how long Init waited on the clock.
func runInit(t *testing.T, o InitOptions, clk *clocktesting.FakeClock) (error, time.Duration) {
	t.Helper()
	o.Clock = clk
	done := make(chan error, 1)
	go func() { done <- Init(context.Background(), o) }()
	var waited time.Duration
	for {
		var err error
		returned := false
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			select {
			case err = <-done:
				returned = true
				return poll.Success()
			default:
			}
			if clk.HasWaiters() {
				return poll.Success()
			}
			return poll.Continue("Init neither returned nor waits")
		}, poll.WithDelay(time.Millisecond), poll.WithTimeout(10*time.Second))
		if returned {
			return err, waited
		}
		clk.Step(RetryInterval)
		waited += RetryInterval
	}
}

// TestInitPromotes: a learner becomes a voter through a member that
// answers, once etcd accepts; a voter is left alone; Init gives up at its
// deadline, saying why.
func TestInitPromotes(t *testing.T) {
	local := LocalEtcd
	urls := []string{local, client(1), client(3)}
	learner := Member{ID: 2, Name: "l2", PeerURLs: []string{peer(2)}, IsLearner: true}
	for _, tc := range []struct {
		name     string
		up       []string
		members  []Member
		refusals int

		wantCalls  []string
		wantVoter  bool
		wantWaited time.Duration
		wantErr    string
	}{
		{name: "a learner is promoted through a voter, tried again while etcd refuses",
			up: urls, members: []Member{voter(1), learner, voter(3)}, refusals: 3,
			wantCalls: slices.Repeat([]string{"promote 2 via " + client(1)}, 4), wantVoter: true, wantWaited: 15 * time.Second},
		{name: "through the next leader when one is down",
			up: []string{local, client(3)}, members: []Member{voter(1), learner, voter(3)},
			wantCalls: []string{"promote 2 via " + client(3)}, wantVoter: true},
		{name: "a voter is not promoted",
			up: urls, members: []Member{voter(1), voter(2), voter(3)}, wantVoter: true},
		{name: "etcd refuses until the deadline",
			up: urls, members: []Member{voter(1), learner}, refusals: 1000,
			wantCalls: slices.Repeat([]string{"promote 2 via " + client(1)}, 13), wantWaited: time.Minute,
			wantErr: "promoting this machine's etcd member: gave up after 1m0s: etcd does not promote learner l2 (2) yet, as it does not while the learner lags: etcdserver: can only promote a learner member which is in sync with leader"},
		{name: "a learner alone answers no one",
			up: []string{local}, members: []Member{voter(1), learner}, wantWaited: time.Minute,
			wantErr: "promoting this machine's etcd member: gave up after 1m0s: no etcd member answers the member list: etcdserver: rpc not supported for learner; connection refused; connection refused"},
		{name: "not a member yet",
			up: urls, members: []Member{voter(1)}, wantWaited: time.Minute,
			wantErr: "gave up after 1m0s: etcd at " + local + " lists no member l2: etcd on this machine has not started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := &fakePromoter{up: map[string]bool{}, members: tc.members, learnerURL: local, learnerName: "l2", refusals: tc.refusals}
			for _, u := range tc.up {
				etcd.up[u] = true
			}
			kube := fake.NewClientset(leaderNode("l2"))
			clk := clocktesting.NewFakeClock(now)
			err, waited := runInit(t, InitOptions{Kube: kube, SharedTokenFile: writeToken(t), Name: "l2", ClientURLs: urls, Etcd: etcd, Timeout: time.Minute}, clk)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Check(t, is.Len(kube.Actions(), 0), "the API is asked nothing before the member votes")
			} else {
				assert.NilError(t, err)
			}
			assert.Check(t, is.DeepEqual(etcd.calls, tc.wantCalls))
			assert.Check(t, is.Equal(waited, tc.wantWaited))
			if m := named(etcd.members, "l2"); m != nil {
				assert.Check(t, is.Equal(!m.IsLearner, tc.wantVoter))
			}
		})
	}
}

// voters answers every member list with this machine, l2, a voter.
func voters() *fakePromoter {
	return &fakePromoter{up: map[string]bool{LocalEtcd: true}, members: []Member{voter(1), voter(2)}}
}

// leaderNode is the Node the leader's kubelet registered.
func leaderNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// TestInitMarksTheLeaderNode: Init labels this leader's Node for
// cluster-operator, once its kubelet has registered it.
func TestInitMarksTheLeaderNode(t *testing.T) {
	kube := fake.NewClientset()
	registered := 2
	kube.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if registered > 0 {
			registered--
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "l2")
		}
		return false, nil, nil
	})
	assert.NilError(t, kube.Tracker().Add(leaderNode("l2")))
	err, waited := runInit(t, initOptions(t, kube), clocktesting.NewFakeClock(now))
	assert.NilError(t, err)
	assert.Equal(t, waited, 10*time.Second, "it waited for the Node twice")
	n, err := kube.CoreV1().Nodes().Get(context.Background(), "l2", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, n.Labels, map[string]string{likenv1.LeaderNodeLabel: "true"})
}

// workerToken is a machine's own join token, as a leader's layer lists it.
var workerToken = MachineToken{Machine: "w1", Token: "ghijkl.fedcba9876543210", Expires: now.Add(7 * 24 * time.Hour)}

func initOptions(t *testing.T, kube *fake.Clientset) InitOptions {
	return InitOptions{Kube: kube, SharedTokenFile: writeToken(t), JoinTokens: []MachineToken{workerToken},
		Name: "l2", ClientURLs: []string{LocalEtcd}, Etcd: voters(), Timeout: time.Minute}
}

// TestInitCreates: Init makes the machines' join tokens (and a fleet's
// shared one, when it opted in) and the control plane's bindings, and
// records the tokens it made; run again it changes nothing.
func TestInitCreates(t *testing.T) {
	kube := fake.NewClientset(leaderNode("l2"))
	clk := clocktesting.NewFakeClock(now)
	err, waited := runInit(t, initOptions(t, kube), clk)
	assert.NilError(t, err)
	assert.Equal(t, waited, time.Duration(0))

	ctx := context.Background()
	s, err := kube.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+testTokenID, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, s.Type, corev1.SecretTypeBootstrapToken)
	assert.DeepEqual(t, s.Data, map[string][]byte{
		"description":                    []byte("liken's shared join token: it gets the certificate of any Machine (the fleet opted in)"),
		"token-id":                       []byte(testTokenID),
		"token-secret":                   []byte(testTokenSecret),
		"usage-bootstrap-authentication": []byte("true"),
		"auth-extra-groups":              []byte("system:bootstrappers:liken:fleet"),
	})
	s, err = kube.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-ghijkl", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, s.Data, map[string][]byte{
		"description":                    []byte("liken's join token of machine w1: it gets only that machine's certificate"),
		"token-id":                       []byte("ghijkl"),
		"token-secret":                   []byte("fedcba9876543210"),
		"expiration":                     []byte("2026-12-09T10:00:00Z"),
		"usage-bootstrap-authentication": []byte("true"),
		"auth-extra-groups":              []byte(likenv1.JoinGroup("w1")),
	})
	assert.DeepEqual(t, s.Annotations, map[string]string{JoinTokenMachineAnnotation: "w1"})
	record, err := kube.CoreV1().ConfigMaps("kube-system").Get(ctx, JoinTokensRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, record.Data, map[string]string{testTokenID: "the fleet", "ghijkl": "machine w1"})

	crbs, err := kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	got := map[string]string{}
	for _, b := range crbs.Items {
		assert.Equal(t, len(b.Subjects), 1, b.Name)
		assert.Equal(t, b.RoleRef.Kind, "ClusterRole", b.Name)
		got[b.Name] = b.RoleRef.Name + " to " + b.Subjects[0].Kind + ":" + b.Subjects[0].Name
	}
	assert.DeepEqual(t, got, map[string]string{
		"liken:join:create-csr":             "system:node-bootstrapper to Group:system:bootstrappers",
		"liken:apiserver:kubelet-api-admin": "system:kubelet-api-admin to User:kube-apiserver-kubelet-client",
	})

	kube.ClearActions()
	err, _ = runInit(t, initOptions(t, kube), clk)
	assert.NilError(t, err)
	for _, a := range kube.Actions() {
		assert.Check(t, a.GetVerb() == "get" || a.GetVerb() == "delete" && a.GetResource().Resource == "clusterrolebindings",
			"a second run changes nothing: %s %s", a.GetVerb(), a.GetResource().Resource)
	}
	crbs2, err := kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Equal(t, len(crbs2.Items), len(crbs.Items))
}

// TestInitLeavesTheTokens: what an administrator did to a join token is
// kept: a Secret with another expiry or secret stays as it is, and a token
// Init made once and someone deleted is not made again. An expired token
// of the layer is never made, and bindings of an earlier liken that let
// the controller manager approve any machine's certificate are deleted.
func TestInitLeavesTheTokens(t *testing.T) {
	ctx := context.Background()
	shortened := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-ghijkl", Namespace: "kube-system"}, Type: corev1.SecretTypeBootstrapToken,
		Data: map[string][]byte{"token-id": []byte("ghijkl"), "token-secret": []byte("fedcba9876543210"), "expiration": []byte("2026-12-01T13:00:00Z")}}
	record := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: JoinTokensRecord, Namespace: "kube-system"}, Data: map[string]string{testTokenID: "the fleet"}}
	retired := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "liken:join:approve-node-client"},
		RoleRef: rbacv1.RoleRef{Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient"}}
	kube := fake.NewClientset(shortened, record, retired, leaderNode("l2"))
	o := initOptions(t, kube)
	expired := MachineToken{Machine: "w2", Token: "mnopqr.fedcba9876543210", Expires: now.Add(-time.Second)}
	o.JoinTokens = append(o.JoinTokens, expired)
	err, _ := runInit(t, o, clocktesting.NewFakeClock(now))
	assert.NilError(t, err)

	s, err := kube.CoreV1().Secrets("kube-system").Get(ctx, shortened.Name, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, s, shortened)
	for _, gone := range []string{"bootstrap-token-" + testTokenID, "bootstrap-token-mnopqr"} {
		_, err = kube.CoreV1().Secrets("kube-system").Get(ctx, gone, metav1.GetOptions{})
		assert.Check(t, apierrors.IsNotFound(err), "%s: %v", gone, err)
	}
	got, err := kube.CoreV1().ConfigMaps("kube-system").Get(ctx, JoinTokensRecord, metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, got.Data, map[string]string{testTokenID: "the fleet", "ghijkl": "machine w1"})
	_, err = kube.RbacV1().ClusterRoleBindings().Get(ctx, retired.Name, metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err), "the retired binding: %v", err)
}

// TestInitWaitsForTheAPI: while the API server does not answer yet, Init
// tries again every 5 s; a binding that appears meanwhile counts as made.
func TestInitWaitsForTheAPI(t *testing.T) {
	kube := fake.NewClientset(leaderNode("l2"))
	down := 3
	kube.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down > 0 {
			down--
			return true, nil, apierrors.NewServiceUnavailable("the API server is starting")
		}
		return false, nil, nil
	})
	// Another leader's init makes a binding between this one's get and create.
	kube.PrependReactor("create", "clusterrolebindings", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if b := a.(k8stesting.CreateAction).GetObject().(*rbacv1.ClusterRoleBinding); b.Name == JoinBindings[0].Name {
			return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: rbacv1.GroupName, Resource: "clusterrolebindings"}, b.Name)
		}
		return false, nil, nil
	})
	err, waited := runInit(t, initOptions(t, kube), clocktesting.NewFakeClock(now))
	assert.NilError(t, err)
	assert.Equal(t, waited, 15*time.Second)
	_, err = kube.CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-"+testTokenID, metav1.GetOptions{})
	assert.NilError(t, err)
}

func TestInitRefusesABadToken(t *testing.T) {
	p := filepath.Join(t.TempDir(), TokenFile)
	assert.NilError(t, os.WriteFile(p, []byte("abcdef.0123456789abcdef\n"), 0o600))
	o := initOptions(t, fake.NewClientset(leaderNode("l2")))
	o.SharedTokenFile = p
	err := Init(context.Background(), o)
	assert.ErrorContains(t, err, p+": the join token is not K10<CA hash>::<id>.<secret>")
	assert.Assert(t, !errors.Is(err, os.ErrNotExist))

	o.SharedTokenFile = filepath.Join(t.TempDir(), "missing")
	assert.ErrorIs(t, Init(context.Background(), o), os.ErrNotExist)
}

// TestInitPromotesARealLearner runs Init's promotion against two real
// etcd members, this machine's a learner: etcd refuses a learner every
// call at its own URL, the member list too, so the promotion goes through
// the other member.
func TestInitPromotesARealLearner(t *testing.T) {
	bin, err := srctree.Binary("kube")
	assert.NilError(t, err)
	dir := t.TempDir()
	ca, caKey := writeCert(t, dir, "ca", nil, nil)
	writeCert(t, dir, "etcd", ca, caKey, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	writeCert(t, dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth)
	f := func(n string) string { return filepath.Join(dir, n) }
	c, err := NewEtcdClientFromFiles(f("client.crt"), f("client.key"), f("ca.crt"))
	assert.NilError(t, err)
	url := func() string { return fmt.Sprintf("https://127.0.0.1:%d", freePort(t)) }
	start := func(name, clientURL, peerURL, initialCluster, state string) {
		logFile, err := os.Create(f(name + ".log"))
		assert.NilError(t, err)
		defer logFile.Close()
		cmd := exec.Command(bin, "etcd", "--name", name, "--data-dir", f(name),
			"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", initialCluster, "--initial-cluster-state", state,
			"--cert-file", f("etcd.crt"), "--key-file", f("etcd.key"),
			"--trusted-ca-file", f("ca.crt"), "--client-cert-auth",
			"--peer-cert-file", f("etcd.crt"), "--peer-key-file", f("etcd.key"),
			"--peer-trusted-ca-file", f("ca.crt"), "--peer-client-cert-auth",
			"--unsafe-no-fsync", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logFile, logFile
		assert.NilError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				b, _ := os.ReadFile(f(name + ".log"))
				t.Logf("%s's log:\n%s", name, b)
			}
		})
	}
	ctx := context.Background()
	aClient, aPeer, bClient, bPeer := url(), url(), url(), url()
	start("a", aClient, aPeer, "a="+aPeer, "new")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if ok, err := c.Health(ctx, aClient); !ok {
			return poll.Continue("etcd a is not healthy yet: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(200*time.Millisecond))
	added, _, err := c.MemberAdd(ctx, aClient, bPeer, true)
	assert.NilError(t, err)
	start("b", bClient, bPeer, "a="+aPeer+",b="+bPeer, "existing")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		_, err := c.MemberList(ctx, bClient)
		if err == nil {
			return poll.Error(errors.New("the learner answered the member list"))
		}
		if !strings.Contains(err.Error(), "rpc not supported for learner") {
			return poll.Continue("the learner does not run yet: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(90*time.Second), poll.WithDelay(200*time.Millisecond))

	err = Init(ctx, InitOptions{Kube: fake.NewClientset(leaderNode("b")), SharedTokenFile: writeToken(t), Name: "b",
		ClientURLs: []string{bClient, aClient}, Etcd: c, Interval: 200 * time.Millisecond, Timeout: time.Minute})
	assert.NilError(t, err)
	members, err := c.MemberList(ctx, bClient)
	assert.NilError(t, err, "the voter answers at its own URL")
	assert.DeepEqual(t, byID(members)[added.ID], Member{ID: added.ID, Name: "b", PeerURLs: []string{bPeer}, ClientURLs: []string{bClient}})
}

// TestInitCreatesTheAddonsOnce: Init creates the cluster DNS add-on's
// objects with the Service at the Cluster's address; run again after a
// person changed the Corefile and the replicas, it leaves their changes,
// and a Service at another address, as they are.
func TestInitCreatesTheAddonsOnce(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(leaderNode("l2"))
	clk := clocktesting.NewFakeClock(now)
	o := initOptions(t, kube)
	addons, err := manifests.DNSObjects("10.43.0.10")
	assert.NilError(t, err)
	o.Addons = addons
	err, _ = runInit(t, o, clk)
	assert.NilError(t, err)
	svc, err := kube.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(svc.Spec.ClusterIP, "10.43.0.10"))
	for _, get := range []func() error{
		func() error {
			_, err := kube.CoreV1().ServiceAccounts("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().ClusterRoles().Get(ctx, "liken:coredns", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, "liken:coredns", metav1.GetOptions{})
			return err
		},
	} {
		assert.Check(t, get())
	}

	cm, err := kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	cm.Data["Corefile"] = ".:1053 { whoami }"
	_, err = kube.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{})
	assert.NilError(t, err)
	d, err := kube.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	d.Spec.Replicas = ptr.To[int32](5)
	_, err = kube.AppsV1().Deployments("kube-system").Update(ctx, d, metav1.UpdateOptions{})
	assert.NilError(t, err)

	o.Addons, err = manifests.DNSObjects("10.43.0.53")
	assert.NilError(t, err)
	err, _ = runInit(t, o, clk)
	assert.NilError(t, err)
	cm, err = kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cm.Data["Corefile"], ".:1053 { whoami }"))
	d, err = kube.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(*d.Spec.Replicas, int32(5)))
	svc, err = kube.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(svc.Spec.ClusterIP, "10.43.0.10"))
}
