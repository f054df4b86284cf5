package layer

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/controlplane"
)

// TestLeaderIdentityFitsControlPlane checks that the identity a leader's
// layer carries is the one its control plane's setup reads: the same file
// names (node/ may not import this package, so it names them itself) and
// key formats it loads.
func TestLeaderIdentityFitsControlPlane(t *testing.T) {
	var names []string
	for _, ca := range CAs {
		names = append(names, ca.Name)
	}
	var cpNames []string
	for _, p := range controlplane.CAs {
		cpNames = append(cpNames, string(p))
	}
	slices.Sort(names)
	slices.Sort(cpNames)
	assert.Check(t, is.DeepEqual(cpNames, names))
	assert.Check(t, is.Equal(controlplane.ServiceAccountKeyFile, ServiceAccountKeyFile))

	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	id, err := GenerateIdentity(GenerateOptions{Cluster: "lab", Now: now})
	assert.NilError(t, err)
	dir := filepath.Join(t.TempDir(), "identity")
	assert.NilError(t, WriteIdentity(dir, id))
	cfg := controlplane.Config{
		Machine: "leader-1", Endpoint: "https://10.0.2.2:7443", ServiceCIDR: "10.96.0.0/16", FirstLeader: "leader-1",
		Leaders: []controlplane.Leader{{Name: "leader-1", APIServer: "https://10.0.2.2:16443", EtcdClient: "https://10.0.2.2:12379", EtcdPeer: "https://10.0.2.2:12380"}},
	}
	assert.NilError(t, controlplane.Setup(cfg, dir, t.TempDir(), now))
}

// leaderDoc is a Machine of mycluster: role, its annotations (name=value)
// and its static addresses, in CIDR form.
func leaderDoc(t *testing.T, name, role string, addresses []string, annotations ...string) *Document {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata:\n  name: %s\n", name)
	if len(annotations) > 0 {
		b.WriteString("  annotations:\n")
		for _, a := range annotations {
			k, v, _ := strings.Cut(a, "=")
			fmt.Fprintf(&b, "    %s: %q\n", k, v)
		}
	}
	fmt.Fprintf(&b, "spec:\n  cluster: mycluster\n  role: %s\n", role)
	if len(addresses) > 0 {
		fmt.Fprintf(&b, "  ports:\n  - name: eth0\n    addresses: [%s]\n", strings.Join(addresses, ", "))
	}
	d, err := ValidateDocument(name+".yaml", []byte(b.String()))
	assert.NilError(t, err)
	return d
}

// clusterDoc is validCluster with its network section replaced.
func clusterDoc(t *testing.T, network string) *Document {
	t.Helper()
	s := strings.Replace(validCluster, "    endpoint: https://10.0.0.10:6443\n    podCIDR: 10.42.0.0/16\n", network, 1)
	d, err := ValidateDocument("cluster.yaml", []byte(s))
	assert.NilError(t, err)
	return d
}

const (
	apiURL    = likenv1.AnnotationAPIServerURL
	clientURL = likenv1.AnnotationEtcdClientURL
	peerURL   = likenv1.AnnotationEtcdPeerURL
)

// TestLeaderConfig: what liken install writes in a Leader's
// leader/config.yaml, from the Cluster and its Machines.
func TestLeaderConfig(t *testing.T) {
	lab := []string{apiURL + "=https://10.0.2.2:16443", clientURL + "=https://10.0.2.2:12379", peerURL + "=https://10.0.2.2:12380"}
	for _, tc := range []struct {
		name     string
		network  string
		machines []*Document
		machine  string
		want     controlplane.Config
	}{
		{
			name:    "three leaders on their static addresses",
			network: "    endpoint: https://10.0.0.10:6443\n    serviceCIDR: 10.43.0.0/16\n    podCIDR: 10.42.0.0/16\n",
			machines: []*Document{
				leaderDoc(t, "node-3", "Leader", []string{"10.0.0.13/24"}),
				leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24", "10.0.1.11/24"}),
				leaderDoc(t, "node-4", "Worker", nil),
				leaderDoc(t, "node-2", "Leader", []string{"10.0.0.12/24"}),
			},
			machine: "node-2",
			want: controlplane.Config{
				Machine: "node-2", Endpoint: "https://10.0.0.10:6443", ServiceCIDR: "10.43.0.0/16", PodCIDR: "10.42.0.0/16", ClusterDNS: "10.43.0.10", FirstLeader: "node-1",
				Leaders: []controlplane.Leader{
					{Name: "node-1", APIServer: "https://10.0.0.11:6443", EtcdClient: "https://10.0.0.11:2379", EtcdPeer: "https://10.0.0.11:2380"},
					{Name: "node-2", APIServer: "https://10.0.0.12:6443", EtcdClient: "https://10.0.0.12:2379", EtcdPeer: "https://10.0.0.12:2380"},
					{Name: "node-3", APIServer: "https://10.0.0.13:6443", EtcdClient: "https://10.0.0.13:2379", EtcdPeer: "https://10.0.0.13:2380"},
				},
			},
		},
		{
			name:    "annotations override the address; host:port endpoint; default service and pod ranges",
			network: "    endpoint: 10.0.2.2:7443\n",
			machines: []*Document{
				leaderDoc(t, "a", "Leader", nil, lab...),
				leaderDoc(t, "b", "Leader", []string{"10.0.0.12/24"}, apiURL+"=https://lb.example.com:16444"),
			},
			machine: "a",
			want: controlplane.Config{
				Machine: "a", Endpoint: "https://10.0.2.2:7443", ServiceCIDR: likenv1.DefaultServiceCIDR, PodCIDR: likenv1.DefaultPodCIDR, ClusterDNS: "10.96.0.10", FirstLeader: "a",
				Leaders: []controlplane.Leader{
					{Name: "a", APIServer: "https://10.0.2.2:16443", EtcdClient: "https://10.0.2.2:12379", EtcdPeer: "https://10.0.2.2:12380"},
					{Name: "b", APIServer: "https://lb.example.com:16444", EtcdClient: "https://10.0.0.12:2379", EtcdPeer: "https://10.0.0.12:2380"},
				},
			},
		},
		{
			name:     "a sole leader without an address talks to itself on 127.0.0.1; a URL endpoint gets port 443",
			network:  "    endpoint: https://api.example.com/\n",
			machines: []*Document{leaderDoc(t, "solo", "Leader", nil), leaderDoc(t, "w", "Worker", nil)},
			machine:  "solo",
			want: controlplane.Config{
				Machine: "solo", Endpoint: "https://api.example.com:443", ServiceCIDR: "10.96.0.0/16", PodCIDR: likenv1.DefaultPodCIDR, ClusterDNS: "10.96.0.10", FirstLeader: "solo",
				Leaders: []controlplane.Leader{{Name: "solo", APIServer: "https://127.0.0.1:6443", EtcdClient: "https://127.0.0.1:2379", EtcdPeer: "https://127.0.0.1:2380"}},
			},
		},
		{
			name:     "an IPv6 address",
			network:  "    endpoint: \"[fd00::10]:6443\"\n",
			machines: []*Document{leaderDoc(t, "v6", "Leader", []string{"fd00::11/64"})},
			machine:  "v6",
			want: controlplane.Config{
				Machine: "v6", Endpoint: "https://[fd00::10]:6443", ServiceCIDR: "10.96.0.0/16", PodCIDR: likenv1.DefaultPodCIDR, ClusterDNS: "10.96.0.10", FirstLeader: "v6",
				Leaders: []controlplane.Leader{{Name: "v6", APIServer: "https://[fd00::11]:6443", EtcdClient: "https://[fd00::11]:2379", EtcdPeer: "https://[fd00::11]:2380"}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster, machines, errs := CheckFleet(append([]*Document{clusterDoc(t, tc.network)}, tc.machines...))
			assert.Assert(t, is.Len(errs, 0), "%v", errs)
			l := &Layer{Cluster: cluster, Machines: machines}
			got, err := l.ControlPlaneConfig(tc.machine)
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(got, tc.want))
			assert.Check(t, got.Validate())
		})
	}

	cluster, machines, errs := CheckFleet([]*Document{clusterDoc(t, "    endpoint: https://10.0.0.10:6443\n"), leaderDoc(t, "l", "Leader", nil), leaderDoc(t, "w", "Worker", nil)})
	assert.Assert(t, is.Len(errs, 0), "%v", errs)
	l := &Layer{Cluster: cluster, Machines: machines}
	_, err := l.ControlPlaneConfig("w")
	assert.Check(t, is.ErrorContains(err, `Machine "w" is a Worker: only a Leader runs the control plane`))
	_, err = l.ControlPlaneConfig("x")
	assert.Check(t, is.ErrorContains(err, `the layer has no Machine "x"`))
}

// TestPackRefusesUnreachableLeaders: a layer whose leaders could not reach
// each other's control plane is refused when packed and when read, naming
// the Machine and what to add, or with Validate's message.
func TestPackRefusesUnreachableLeaders(t *testing.T) {
	const endpoint = "    endpoint: https://10.0.0.10:6443\n"
	for _, tc := range []struct {
		name     string
		network  string
		machines []*Document
		want     []string
	}{
		{
			name:     "a second leader without an address",
			network:  endpoint,
			machines: []*Document{leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24"}), leaderDoc(t, "node-2", "Leader", nil)},
			want: []string{"node-2.yaml: Machine node-2: is one of 2 Leaders but has no static address (spec.ports[].addresses) and lacks the annotations " +
				"liken.sh/apiserver-url, liken.sh/etcd-client-url, liken.sh/etcd-peer-url: the other leaders could not reach its control plane"},
		},
		{
			name:    "leaders with some of the annotations",
			network: endpoint,
			machines: []*Document{
				leaderDoc(t, "node-1", "Leader", nil, apiURL+"=https://10.0.2.2:16443"),
				leaderDoc(t, "node-2", "Leader", nil, apiURL+"=https://10.0.2.2:26443", peerURL+"=https://10.0.2.2:22380"),
			},
			want: []string{
				"Machine node-1: is one of 2 Leaders but has no static address (spec.ports[].addresses) and lacks the annotations liken.sh/etcd-client-url, liken.sh/etcd-peer-url",
				"Machine node-2: is one of 2 Leaders but has no static address (spec.ports[].addresses) and lacks the annotations liken.sh/etcd-client-url: ",
			},
		},
		{
			name:    "two leaders on one reach URL",
			network: endpoint,
			machines: []*Document{
				leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24"}),
				leaderDoc(t, "node-2", "Leader", []string{"10.0.0.12/24"}, peerURL+"=https://10.0.0.11:2380"),
			},
			want: []string{
				"cluster.yaml: the control plane's configuration derived from Cluster mycluster and its Leaders is invalid (leaders[0] is node-1, leaders[1] is node-2; ",
				"leaders[1].etcdPeer: 10.0.0.11:2380 is also leaders[0].etcdPeer; every reach URL needs a host and port of its own",
			},
		},
		{
			name:     "an annotation that is not https",
			network:  endpoint,
			machines: []*Document{leaderDoc(t, "node-1", "Leader", nil, apiURL+"=http://10.0.0.11:6443")},
			want:     []string{`leaders[0].apiserver: "http://10.0.0.11:6443" is not https; the control plane speaks only TLS`},
		},
		{
			name:     "an endpoint with a path",
			network:  "    endpoint: https://lb.example.com:6443/k8s\n",
			machines: []*Document{leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24"})},
			want:     []string{`endpoint: "https://lb.example.com:6443/k8s" has more than a scheme, a host and a port`},
		},
		{
			name:     "a service range with no address for the kubernetes Service",
			network:  endpoint + "    serviceCIDR: 10.96.0.0/32\n",
			machines: []*Document{leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24"})},
			want:     []string{`serviceCIDR: "10.96.0.0/32" holds no address for the kubernetes Service`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs := append([]*Document{clusterDoc(t, tc.network)}, tc.machines...)
			_, _, errs := CheckFleet(docs)
			got := errors.Join(errs...)
			for _, w := range tc.want {
				assert.Check(t, is.ErrorContains(got, w))
			}

			// Whatever reads a layer refuses it too.
			id, err := LoadIdentity(fixtureIdentity(t))
			assert.NilError(t, err)
			var machines []*Document
			for _, d := range docs[1:] {
				machines = append(machines, d)
			}
			slices.SortFunc(machines, func(a, b *Document) int { return strings.Compare(a.Name, b.Name) })
			var buf bytes.Buffer
			assert.NilError(t, (&Layer{Cluster: docs[0], Machines: machines, Identity: id}).Write(&buf))
			_, err = Read(&buf, DefaultLimits)
			for _, w := range tc.want {
				assert.Check(t, is.ErrorContains(err, strings.TrimPrefix(w, "node-2.yaml: ")))
			}
		})
	}
}

// TestPackAcceptsReachableLeaders: leaders with static addresses, with
// the three annotations, a sole leader with neither, and workers with
// neither pack.
func TestPackAcceptsReachableLeaders(t *testing.T) {
	lab := func(n int) []string {
		return []string{
			fmt.Sprintf("%s=https://10.0.2.2:%d6443", apiURL, n),
			fmt.Sprintf("%s=https://10.0.2.2:%d2379", clientURL, n),
			fmt.Sprintf("%s=https://10.0.2.2:%d2380", peerURL, n),
		}
	}
	for _, tc := range []struct {
		name     string
		machines []*Document
	}{
		{"static addresses", []*Document{leaderDoc(t, "node-1", "Leader", []string{"10.0.0.11/24"}), leaderDoc(t, "node-2", "Leader", []string{"10.0.0.12/24"}), leaderDoc(t, "node-3", "Worker", nil)}},
		{"annotations only", []*Document{leaderDoc(t, "node-1", "Leader", nil, lab(1)...), leaderDoc(t, "node-2", "Leader", nil, lab(2)...)}},
		{"a sole leader with neither", []*Document{leaderDoc(t, "node-1", "Leader", nil), leaderDoc(t, "node-2", "Worker", nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, errs := CheckFleet(append([]*Document{clusterDoc(t, "    endpoint: https://10.0.0.10:6443\n")}, tc.machines...))
			assert.Check(t, is.Len(errs, 0), "%v", errs)
		})
	}
}
