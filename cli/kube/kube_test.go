package kube

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	_ "gotest.tools/v3/golden" // go test ./cli/... -update reaches every package
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestExplain(t *testing.T) {
	gr := schema.GroupResource{Group: "liken.sh", Resource: "machines"}
	tests := []struct {
		err  error
		want string
	}{
		{apierrors.NewNotFound(gr, "node-9"), "machine node-9 not found (kubectl get liken lists Clusters and Machines)"},
		{apierrors.NewNotFound(gr, ""), "the API server does not serve liken.sh/v1alpha1"},
		{apierrors.NewForbidden(gr, "node-9", errors.New("no")), "the API server refused access to machine node-9"},
		{apierrors.NewUnauthorized("who are you"), "the API server refused access to machine node-9"},
		{fmt.Errorf("get: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "cannot reach the API server"},
		{errors.New("boom"), "machine node-9: boom"},
	}
	for _, tc := range tests {
		assert.ErrorContains(t, Explain(tc.err, "machine node-9"), tc.want)
	}
	assert.NilError(t, Explain(nil, "x"))
}

func TestFlags(t *testing.T) {
	f := NewFlags()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	_, err := f.Client()
	assert.ErrorContains(t, err, "no cluster to talk to: set KUBECONFIG or pass --kubeconfig")
	f.overrides.ClusterInfo.Server = "https://127.0.0.1:6443"
	cfg, err := f.RESTConfig()
	assert.NilError(t, err)
	assert.Equal(t, cfg.Host, "https://127.0.0.1:6443")
	assert.Equal(t, cfg.UserAgent, "liken/dev")
}
