package lab

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"liken.sh/liken/internal/pki"
)

// runEndpoint runs liken lab serve-endpoint with args until ctx ends.
func runEndpoint(ctx context.Context, args ...string) error {
	cmd := newEndpointCommand()
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd.ExecuteContext(ctx)
}

// TestServeEndpointFlagErrors: each bad flag is refused, naming the flag
// and what it wants.
func TestServeEndpointFlagErrors(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("liken test server CA", time.Now(), time.Hour)
	assert.NilError(t, err)
	caFile, notPEM := filepath.Join(dir, "server-ca.crt"), filepath.Join(dir, "server-ca.txt")
	assert.NilError(t, os.WriteFile(caFile, ca.CertPEM(), 0o644))
	assert.NilError(t, os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644))
	portFile := filepath.Join(dir, "endpoint.port")

	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{name: "none", err: `required flag(s) "backends", "ca", "port-file" not set`},
		{name: "no port", args: []string{"--backends", "leader-1", "--ca", caFile, "--port-file", portFile},
			err: `--backends: backend "leader-1" is not host:port`},
		{name: "port 0", args: []string{"--backends", "127.0.0.1:7001,127.0.0.1:0", "--ca", caFile, "--port-file", portFile},
			err: `--backends: backend "127.0.0.1:0" is not host:port: give a host and a port from 1 to 65535`},
		{name: "empty entry", args: []string{"--backends", "127.0.0.1:7001,,127.0.0.1:7002", "--ca", caFile, "--port-file", portFile},
			err: `--backends: backend "" is not host:port`},
		{name: "twice", args: []string{"--backends", "127.0.0.1:7001,127.0.0.1:7001", "--ca", caFile, "--port-file", portFile},
			err: `--backends: backend "127.0.0.1:7001" is listed twice`},
		{name: "no CA file", args: []string{"--backends", "127.0.0.1:7001", "--ca", filepath.Join(dir, "missing.crt"), "--port-file", portFile},
			err: "--ca: open " + filepath.Join(dir, "missing.crt") + ": no such file or directory; give the file of the cluster's server CA certificate"},
		{name: "CA not PEM", args: []string{"--backends", "127.0.0.1:7001", "--ca", notPEM, "--port-file", portFile},
			err: "--ca " + notPEM + ": no PEM certificate in it"},
		{name: "port out of range", args: []string{"--backends", "127.0.0.1:7001", "--ca", caFile, "--port-file", portFile, "--port", "70000"},
			err: "--port 70000: give a TCP port from 1 to 65535"},
		{name: "port not a number", args: []string{"--backends", "127.0.0.1:7001", "--ca", caFile, "--port-file", portFile, "--port", "any"},
			err: `invalid argument "any" for "--port" flag`},
		{name: "argument", args: []string{"127.0.0.1:7001", "--backends", "127.0.0.1:7001", "--ca", caFile, "--port-file", portFile},
			err: `unknown command "127.0.0.1:7001"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, runEndpoint(context.Background(), tc.args...), tc.err)
			_, err := os.Stat(portFile)
			assert.Check(t, os.IsNotExist(err), "the port file was written")
		})
	}
}

// TestServeEndpointWritesPort: the command listens on loopback, writes its
// port, and returns nil when its context ends.
func TestServeEndpointWritesPort(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA("liken test server CA", time.Now(), time.Hour)
	assert.NilError(t, err)
	caFile, portFile := filepath.Join(dir, "server-ca.crt"), filepath.Join(dir, "endpoint.port")
	assert.NilError(t, os.WriteFile(caFile, ca.CertPEM(), 0o644))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runEndpoint(ctx, "--backends", "127.0.0.1:7001,127.0.0.1:7002", "--ca", caFile, "--port-file", portFile)
	}()
	var port int
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		b, err := os.ReadFile(portFile)
		if err != nil {
			return poll.Continue("no port file yet: %v", err)
		}
		if port, err = strconv.Atoi(string(b)); err != nil {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	assert.NilError(t, err, "nothing listens on the port written")
	c.Close()

	cancel()
	select {
	case err := <-done:
		assert.NilError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve-endpoint did not return after its context ended")
	}
}
