package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const goodConfig = `machine: leader-2
endpoint: https://10.0.2.2:7443
serviceCIDR: 10.96.0.0/16
firstLeader: leader-1
leaders:
- name: leader-1
  apiserver: https://10.0.2.2:16443
  etcdClient: https://10.0.2.2:12379
  etcdPeer: https://10.0.2.2:12380
- name: leader-2
  apiserver: https://10.0.2.2:26443
  etcdClient: https://10.0.2.2:22379
  etcdPeer: https://10.0.2.2:22380
`

// testConfig is goodConfig's content.
func testConfig() Config {
	return Config{
		Machine:     "leader-2",
		Endpoint:    "https://10.0.2.2:7443",
		ServiceCIDR: "10.96.0.0/16",
		FirstLeader: "leader-1",
		Leaders: []Leader{
			{Name: "leader-1", APIServer: "https://10.0.2.2:16443", EtcdClient: "https://10.0.2.2:12379", EtcdPeer: "https://10.0.2.2:12380"},
			{Name: "leader-2", APIServer: "https://10.0.2.2:26443", EtcdClient: "https://10.0.2.2:22379", EtcdPeer: "https://10.0.2.2:22380"},
		},
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	assert.NilError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestLoad(t *testing.T) {
	c, err := Load(writeFile(t, goodConfig))
	assert.NilError(t, err)
	assert.DeepEqual(t, c, testConfig())
	self, err := c.Self()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(self, testConfig().Leaders[1]))
	ip, err := c.FirstServiceIP()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(ip.String(), "10.96.0.1"))
}

// TestLoadPodCIDR: liken install writes the Cluster's pod range; a
// configuration from before it has none and means the default.
func TestLoadPodCIDR(t *testing.T) {
	c, err := Load(writeFile(t, goodConfig+"podCIDR: 10.42.0.0/16\n"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(c.PodCIDROrDefault(), "10.42.0.0/16"))
	c, err = Load(writeFile(t, goodConfig))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(c.PodCIDROrDefault(), "10.244.0.0/16"))
}

// TestLoadClusterDNS: a configuration written before liken ran a cluster
// DNS has none, and its address is the service range's tenth.
func TestLoadClusterDNS(t *testing.T) {
	c, err := Load(writeFile(t, goodConfig))
	assert.NilError(t, err)
	dns, err := c.ClusterDNSOrDefault()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(dns, "10.96.0.10"))
	c, err = Load(writeFile(t, goodConfig+"clusterDNS: 10.96.0.53\n"))
	assert.NilError(t, err)
	dns, err = c.ClusterDNSOrDefault()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(dns, "10.96.0.53"))
}

func TestLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, content, want string
	}{
		{"unknown field", goodConfig + "extra: 1\n", `unknown field "extra"`},
		{"misspelt field", strings.Replace(goodConfig, "etcdPeer:", "etcdPeers:", 1), `unknown field "etcdPeers"`},
		{"a field twice", goodConfig + "machine: leader-1\n", `key "machine" already set`},
		{"not YAML", "machine: [\n", "config.yaml"},
		{"invalid", "machine: leader-1\n", "endpoint: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.content)
			_, err := Load(p)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, p)
		})
	}
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorContains(t, err, "missing.yaml: no such file")
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"machine missing", func(c *Config) { c.Machine = "" }, "machine: missing"},
		{"machine not a leader", func(c *Config) { c.Machine = "worker-1" }, `machine: "worker-1" is not among the leaders`},
		{"first leader missing", func(c *Config) { c.FirstLeader = "" }, "firstLeader: missing"},
		{"first leader not a leader", func(c *Config) { c.FirstLeader = "leader-9" }, `firstLeader: "leader-9" is not among the leaders`},
		{"endpoint missing", func(c *Config) { c.Endpoint = "" }, "endpoint: missing"},
		{"endpoint http", func(c *Config) { c.Endpoint = "http://10.0.2.2:7443" }, `endpoint: "http://10.0.2.2:7443" is not https`},
		{"endpoint without port", func(c *Config) { c.Endpoint = "https://api.example.com" }, "endpoint: \"https://api.example.com\" has no port"},
		{"endpoint without host", func(c *Config) { c.Endpoint = "https://:7443" }, "endpoint: \"https://:7443\" has no host"},
		{"endpoint with a path", func(c *Config) { c.Endpoint = "https://a:7443/api" }, "endpoint: \"https://a:7443/api\" has more than a scheme, a host and a port"},
		{"endpoint port out of range", func(c *Config) { c.Endpoint = "https://a:70000" }, "port 70000 is not between 1 and 65535"},
		{"endpoint not a URL", func(c *Config) { c.Endpoint = "https://a b:1" }, "is not a URL"},
		{"service CIDR missing", func(c *Config) { c.ServiceCIDR = "" }, "serviceCIDR: missing"},
		{"service CIDR not a CIDR", func(c *Config) { c.ServiceCIDR = "10.96.0.0" }, `serviceCIDR: "10.96.0.0" is not a CIDR`},
		{"service CIDR too small", func(c *Config) { c.ServiceCIDR = "10.96.0.1/32" }, "serviceCIDR: \"10.96.0.1/32\" holds no address for the kubernetes Service"},
		{"pod CIDR not a CIDR", func(c *Config) { c.PodCIDR = "10.244.0.0" }, `podCIDR: "10.244.0.0" is not a CIDR`},
		{"pod CIDR smaller than a Node's range", func(c *Config) { c.PodCIDR = "10.244.0.0/26" }, "podCIDR: 10.244.0.0/26 is smaller than one machine's pod range"},
		{"cluster DNS outside the service range", func(c *Config) { c.ClusterDNS = "10.97.0.10" }, "clusterDNS: 10.97.0.10 is not inside serviceCIDR 10.96.0.0/16"},
		{"cluster DNS not an address", func(c *Config) { c.ClusterDNS = "dns" }, `clusterDNS: "dns" is not an IP address`},
		{"no tenth address for the cluster DNS", func(c *Config) { c.ServiceCIDR = "10.96.0.0/29" }, "clusterDNS: serviceCIDR 10.96.0.0/29 holds no tenth address"},
		{"no leaders", func(c *Config) { c.Leaders = nil }, "leaders: none"},
		{"leader name missing", func(c *Config) { c.Leaders[0].Name = "" }, "leaders[0].name: missing"},
		{"leader name not a Machine name", func(c *Config) { c.Leaders[0].Name = "Leader_1" }, `leaders[0].name: "Leader_1" is not a Machine name`},
		{"duplicate name", func(c *Config) { c.Leaders[1].Name = "leader-1" }, `leaders[1].name: "leader-1" is also leaders[0]'s name`},
		{"apiserver URL missing", func(c *Config) { c.Leaders[1].APIServer = "" }, "leaders[1].apiserver: missing"},
		{"etcd client URL http", func(c *Config) { c.Leaders[0].EtcdClient = "http://10.0.0.1:2379" }, "leaders[0].etcdClient: \"http://10.0.0.1:2379\" is not https"},
		{"etcd peer URL without port", func(c *Config) { c.Leaders[0].EtcdPeer = "https://10.0.0.1" }, "leaders[0].etcdPeer: \"https://10.0.0.1\" has no port"},
		{"duplicate URL across leaders", func(c *Config) { c.Leaders[1].EtcdPeer = c.Leaders[0].EtcdPeer }, "leaders[1].etcdPeer: 10.0.2.2:12380 is also leaders[0].etcdPeer"},
		{"duplicate URL within a leader", func(c *Config) { c.Leaders[0].EtcdPeer = c.Leaders[0].EtcdClient }, "leaders[0].etcdPeer: 10.0.2.2:12379 is also leaders[0].etcdClient"},
		{"duplicate URL differing in case", func(c *Config) {
			c.Leaders[1].APIServer = "https://LEADER:6443"
			c.Leaders[0].APIServer = "https://leader:6443"
		}, "leaders[1].apiserver: LEADER:6443 is also leaders[0].apiserver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig()
			assert.NilError(t, c.Validate())
			tc.change(&c)
			assert.ErrorContains(t, c.Validate(), tc.want)
		})
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	c := testConfig()
	c.Endpoint, c.ServiceCIDR = "", "x"
	err := c.Validate()
	assert.ErrorContains(t, err, "endpoint: missing")
	assert.ErrorContains(t, err, "serviceCIDR: \"x\" is not a CIDR")
}

func TestSelfNotALeader(t *testing.T) {
	c := testConfig()
	c.Machine = "worker-1"
	_, err := c.Self()
	assert.ErrorContains(t, err, `machine "worker-1" is not among the leaders`)
}
