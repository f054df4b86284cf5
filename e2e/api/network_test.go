package api

import (
	"context"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/generated/clientset/versioned"
)

// TestNetworkRules: the real API server takes the Cluster's rules on its
// network ranges (the CRD's CEL, within its cost limits) and refuses, with
// both values in the message, a pod range a Node range does not fit in,
// ranges that overlap (an unset one counting as its default), and a
// cluster DNS address outside the service range.
func TestNetworkRules(t *testing.T) {
	_, cs := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		network v1.NetworkSpec
		want    []string // nil: accepted
	}{
		{name: "the defaults", network: v1.NetworkSpec{}},
		{name: "the example's ranges", network: v1.NetworkSpec{PodCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.10"}},
		{name: "the default service range and its DNS address", network: v1.NetworkSpec{PodCIDR: "10.128.0.0/9", ClusterDNS: "10.96.0.10"}},
		{name: "IPv6", network: v1.NetworkSpec{PodCIDR: "fd00:10:244::/56", ServiceCIDR: "fd00:10:96::/112", ClusterDNS: "fd00:10:96::a"}},
		{name: "a pod range smaller than a Node's", network: v1.NetworkSpec{PodCIDR: "10.42.0.0/25"},
			want: []string{"spec.network.podCIDR", "podCIDR 10.42.0.0/25 is smaller than one machine's pod range, a /24"}},
		{name: "a pod range holding the default service range", network: v1.NetworkSpec{PodCIDR: "10.0.0.0/8"},
			want: []string{"spec.network.podCIDR", "podCIDR 10.0.0.0/8 overlaps serviceCIDR 10.96.0.0/16 (the default)"}},
		{name: "a service range holding the default pod range", network: v1.NetworkSpec{ServiceCIDR: "10.244.0.0/16"},
			want: []string{"spec.network.podCIDR", "podCIDR 10.244.0.0/16 (the default) overlaps serviceCIDR 10.244.0.0/16"}},
		{name: "a cluster DNS address outside the service range", network: v1.NetworkSpec{PodCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.96.0.10"},
			want: []string{"spec.network.clusterDNS", "clusterDNS 10.96.0.10 is not inside serviceCIDR 10.43.0.0/16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster("net")
			endpoint := c.Spec.Network.Endpoint
			c.Spec.Network = tc.network
			c.Spec.Network.Endpoint = endpoint
			createOrRefused(t, cs, c, tc.want)
		})
	}

	// An edit of a stored Cluster is held to the same rules.
	c, err := cs.LikenV1alpha1().Clusters().Create(ctx, cluster("edited-net"), metav1.CreateOptions{})
	assert.NilError(t, err)
	c.Spec.Network.ClusterDNS = "10.97.0.10"
	_, err = cs.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.ErrorContains(t, err, "clusterDNS 10.97.0.10 is not inside serviceCIDR 10.96.0.0/16 (the default)")
}

// TestMachineTrustRules: the real API server takes name servers as
// addresses with an optional port and a CA bundle of PEM certificates, and
// refuses, naming the field, a name server given by name and a bundle that
// holds no certificate.
func TestMachineTrustRules(t *testing.T) {
	_, cs := setup(t)
	for _, tc := range []struct {
		name     string
		settings v1.SharedSettings
		want     []string // nil: accepted
	}{
		{name: "addresses with and without ports", settings: v1.SharedSettings{DNSServers: []string{"192.0.2.53", "192.0.2.54:5353", "2001:db8::53", "[2001:db8::54]:53"}}},
		{name: "a CA bundle", settings: v1.SharedSettings{CABundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}},
		{name: "a name server by name", settings: v1.SharedSettings{DNSServers: []string{"dns.example.com"}},
			want: []string{"spec.settings.dnsServers[0]", "must be an IP address with an optional port"}},
		{name: "a bundle of no certificate", settings: v1.SharedSettings{CABundle: "not a certificate"},
			want: []string{"spec.settings.caBundle", "caBundle must hold PEM certificates"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster("trust")
			c.Spec.Settings = tc.settings
			createOrRefused(t, cs, c, tc.want)
		})
	}
}

// createOrRefused creates c and deletes it when want is nil; otherwise it
// checks that the API server refuses c as Invalid with every string of
// want in its message.
func createOrRefused(t *testing.T, cs versioned.Interface, c *v1.Cluster, want []string) {
	t.Helper()
	ctx := context.Background()
	_, err := cs.LikenV1alpha1().Clusters().Create(ctx, c, metav1.CreateOptions{})
	if want == nil {
		assert.NilError(t, err)
		assert.NilError(t, cs.LikenV1alpha1().Clusters().Delete(ctx, c.Name, metav1.DeleteOptions{}))
		return
	}
	assert.Assert(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
	for _, w := range want {
		assert.Check(t, is.Contains(err.Error(), w))
	}
}
