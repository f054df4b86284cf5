package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"sigs.k8s.io/yaml"

	"liken.sh/liken/internal/pki"
	"liken.sh/liken/node/controlplane"
)

// leader is a leader's folders as the control-plane commands find them:
// the layer partition's leader/ and the setup folder in memory.
type leader struct {
	dir, leaderDir, setupDir, dataDir string
	cfg                               controlplane.Config
}

// newLeader writes config.yaml and a cluster identity (the five CAs, the
// service account key, the join token) into a new leader folder. The
// leaders' etcd client URLs are etcdClients.
func newLeader(t *testing.T, etcdClients ...string) *leader {
	t.Helper()
	dir := t.TempDir()
	l := &leader{dir: dir, leaderDir: filepath.Join(dir, "leader"), setupDir: filepath.Join(dir, "run", "control-plane"), dataDir: filepath.Join(dir, "etcd")}
	if len(etcdClients) == 0 {
		etcdClients = []string{"https://10.0.2.2:12379", "https://10.0.2.2:22379"}
	}
	l.cfg = controlplane.Config{Machine: "leader-1", Endpoint: "https://10.0.2.2:7443", ServiceCIDR: "10.96.0.0/16", FirstLeader: "leader-1"}
	for i, u := range etcdClients {
		l.cfg.Leaders = append(l.cfg.Leaders, controlplane.Leader{
			Name: fmt.Sprintf("leader-%d", i+1), EtcdClient: u,
			APIServer: fmt.Sprintf("https://10.0.2.2:%d6443", i+1), EtcdPeer: fmt.Sprintf("https://10.0.2.2:%d2380", i+1),
		})
	}
	b, err := yaml.Marshal(l.cfg)
	assert.NilError(t, err)
	identity := filepath.Join(l.leaderDir, controlplane.IdentityDir)
	assert.NilError(t, os.MkdirAll(filepath.Join(identity, "etcd"), 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(l.leaderDir, controlplane.ConfigFile), b, 0o600))
	for _, p := range controlplane.CAs {
		ca, err := pki.NewCA("test-"+string(p), time.Now(), 24*time.Hour)
		assert.NilError(t, err)
		assert.NilError(t, ca.Write(filepath.Join(identity, p.Cert()), filepath.Join(identity, p.Key())))
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	assert.NilError(t, err)
	assert.NilError(t, pki.WriteKey(filepath.Join(identity, controlplane.ServiceAccountKeyFile), sa))
	token := "K10" + strings.Repeat("0", 64) + "::abcdef.0123456789abcdef\n"
	assert.NilError(t, os.WriteFile(filepath.Join(identity, controlplane.TokenFile), []byte(token), 0o600))
	return l
}

// execCall is what args would exec.
type execCall struct {
	path       string
	argv, env  []string
	calledExec bool
}

// run runs liken-node control-plane with args and this leader's folders;
// exec records what would replace liken-node.
func (l *leader) run(t *testing.T, args ...string) (string, *execCall, error) {
	t.Helper()
	call := &execCall{}
	cmd := controlPlaneCommand(func(path string, argv, env []string) error {
		*call = execCall{path: path, argv: argv, env: env, calledExec: true}
		return nil
	})
	cmd.SilenceUsage = true
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--leader-dir", l.leaderDir, "--setup-dir", l.setupDir))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), call, err
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	return string(b)
}

// TestControlPlaneSetup: setup writes the control plane's files from the
// leader's folder, and a second run (the next boot) issues new
// certificates.
func TestControlPlaneSetup(t *testing.T) {
	l := newLeader(t)
	_, _, err := l.run(t, "setup")
	assert.NilError(t, err)
	for _, name := range []string{
		controlplane.APIServer.Cert(), controlplane.APIServer.Key(), controlplane.EtcdServer.Cert(), controlplane.EtcdPeer.Cert(),
		controlplane.NodeEtcdClient.Cert(), controlplane.InitKubeconfig, controlplane.SchedulerKubeconfig,
		controlplane.ControllerManagerKubeconfig, controlplane.ServiceAccountKeyFile, controlplane.ClientCAKey,
	} {
		_, err := os.Stat(filepath.Join(l.setupDir, filepath.FromSlash(name)))
		assert.Check(t, err, "setup wrote %s", name)
	}
	st, err := os.Stat(l.setupDir)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))

	first, err := pki.ParseCert([]byte(readFile(t, filepath.Join(l.setupDir, controlplane.APIServer.Cert()))))
	assert.NilError(t, err)
	_, _, err = l.run(t, "setup")
	assert.NilError(t, err)
	second, err := pki.ParseCert([]byte(readFile(t, filepath.Join(l.setupDir, controlplane.APIServer.Cert()))))
	assert.NilError(t, err)
	assert.Check(t, first.SerialNumber.Cmp(second.SerialNumber) != 0, "the second run renews the certificates")
	assert.Check(t, !first.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(second.PublicKey), "with new keys")
}

// TestControlPlaneArgs: args replaces liken-node with the kube binary
// running the component with this leader's flags, keeping the environment
// (etcd's initial cluster); --print prints that command line instead.
func TestControlPlaneArgs(t *testing.T) {
	t.Setenv("ETCD_INITIAL_CLUSTER", "leader-1=https://10.0.2.2:12380")
	l := newLeader(t)
	kube := filepath.Join(l.dir, "bin", "kube")
	for _, tc := range []struct {
		component string
		flags     func() ([]string, error)
	}{
		{"etcd", func() ([]string, error) { return controlplane.EtcdArgs(l.cfg, l.setupDir) }},
		{"kube-apiserver", func() ([]string, error) { return controlplane.APIServerArgs(l.cfg, l.setupDir) }},
		{"kube-controller-manager", func() ([]string, error) { return controlplane.ControllerManagerArgs(l.cfg, l.setupDir) }},
		{"kube-scheduler", func() ([]string, error) { return controlplane.SchedulerArgs(l.setupDir), nil }},
	} {
		t.Run(tc.component, func(t *testing.T) {
			flags, err := tc.flags()
			assert.NilError(t, err)
			want := append([]string{kube, tc.component}, flags...)
			assert.Assert(t, slices.ContainsFunc(flags, func(f string) bool { return strings.Contains(f, l.setupDir) }), "the flags name the setup folder: %v", flags)

			out, call, err := l.run(t, "args", tc.component, "--kube", kube)
			assert.NilError(t, err)
			assert.Equal(t, out, "")
			assert.Equal(t, call.path, kube)
			assert.DeepEqual(t, call.argv, want)
			assert.Check(t, is.Contains(call.env, "ETCD_INITIAL_CLUSTER=leader-1=https://10.0.2.2:12380"))

			out, call, err = l.run(t, "args", tc.component, "--kube", kube, "--print")
			assert.NilError(t, err)
			assert.Check(t, !call.calledExec)
			assert.Equal(t, out, strings.Join(want, " ")+"\n")
		})
	}

	_, call, err := l.run(t, "args", "kwok")
	assert.ErrorContains(t, err, `unknown component "kwok": choose one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler`)
	assert.Check(t, !call.calledExec)
}

// TestControlPlaneArgsExecFails: when the kube binary is missing, args
// says where it looked and what to do.
func TestControlPlaneArgsExecFails(t *testing.T) {
	l := newLeader(t)
	cmd := controlPlaneCommand(syscall.Exec)
	cmd.SilenceUsage = true
	missing := filepath.Join(l.dir, "no", "kube")
	cmd.SetArgs([]string{"args", "kube-scheduler", "--kube", missing, "--leader-dir", l.leaderDir, "--setup-dir", l.setupDir})
	err := cmd.Execute()
	assert.ErrorContains(t, err, "running "+missing+": no such file or directory; the image carries the kube binary at /usr/bin/kube, or pass --kube")
}

// TestControlPlaneNoLeader: on a machine without config.yaml every command
// says it is no leader, naming the file.
func TestControlPlaneNoLeader(t *testing.T) {
	l := newLeader(t)
	cfg := filepath.Join(l.leaderDir, controlplane.ConfigFile)
	assert.NilError(t, os.Remove(cfg))
	for _, args := range [][]string{{"setup"}, {"etcd-start"}, {"init"}, {"split-check"}, {"args", "etcd"}, {"args", "kube-scheduler"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, call, err := l.run(t, args...)
			assert.Error(t, err, "this machine is no leader: "+cfg+" is missing (liken install writes it on a Leader's disk)")
			assert.Check(t, !call.calledExec)
		})
	}
}

// TestControlPlaneBeforeSetup: etcd-start and init need setup's
// certificates and say so.
func TestControlPlaneBeforeSetup(t *testing.T) {
	l := newLeader(t)
	for _, args := range [][]string{{"etcd-start"}, {"init"}} {
		t.Run(args[0], func(t *testing.T) {
			_, _, err := l.run(t, args...)
			assert.ErrorContains(t, err, ": run liken-node control-plane setup first")
			assert.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

// countingListener counts the connections to it and closes each at once.
func countingListener(t *testing.T) (url string, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	t.Cleanup(func() { ln.Close() })
	conns = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	return "https://" + ln.Addr().String(), conns
}

// TestControlPlaneEtcdStartWithData: etcd's first start in a boot, its
// data present, writes etcd.env asking no one; a later start in the same
// boot (the marker file) is a restart, which asks the leaders whether
// this member was removed, and starts with the data when none answers.
func TestControlPlaneEtcdStartWithData(t *testing.T) {
	url1, conns1 := countingListener(t)
	url2, conns2 := countingListener(t)
	l := newLeader(t, url1, url2)
	_, _, err := l.run(t, "setup")
	assert.NilError(t, err)
	assert.NilError(t, os.MkdirAll(filepath.Join(l.dataDir, "member", "wal"), 0o700))
	env := filepath.Join(l.setupDir, controlplane.EtcdEnvFile)
	marker := filepath.Join(l.setupDir, controlplane.EtcdStartedFile)
	_, err = os.Stat(marker)
	assert.Assert(t, errors.Is(err, os.ErrNotExist))

	_, _, err = l.run(t, "etcd-start", "--data-dir", l.dataDir)
	assert.NilError(t, err)
	want := "# Written by liken-node before etcd starts: StartWithData\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=leader-1=https://10.0.2.2:12380\n"
	assert.Equal(t, readFile(t, env), want)
	assert.Equal(t, conns1.Load()+conns2.Load(), int32(0), "the first start asks no one")
	_, err = os.Stat(marker)
	assert.NilError(t, err, "etcd-start marks etcd started in this boot")

	assert.NilError(t, os.Remove(env))
	_, _, err = l.run(t, "etcd-start", "--data-dir", l.dataDir)
	assert.NilError(t, err)
	assert.Equal(t, readFile(t, env), want)
	assert.Check(t, conns1.Load() > 0 && conns2.Load() > 0, "a restart asks every leader for the member list: %d, %d", conns1.Load(), conns2.Load())
}
