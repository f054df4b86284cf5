package changes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/internal/srctree"
)

type cmdLog struct{ cmds []string }

func (l *cmdLog) run(_ context.Context, name string, args ...string) error {
	l.cmds = append(l.cmds, strings.Join(append([]string{name}, args...), " "))
	return nil
}

func TestOSApplier(t *testing.T) {
	root := sysRoot(t)
	var log cmdLog
	o := &OS{Root: root, Run: log.run, stat: blockDeviceStat}
	cfg := base()
	ctx := context.Background()

	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldNTPServers}}))
	b, err := os.ReadFile(filepath.Join(root, "proc/sys/vm/max_map_count"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "262144\n")
	b, err = os.ReadFile(filepath.Join(root, TimesyncdDropIn))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "NTP=time.example.com"))

	assert.NilError(t, o.RestartK3s(ctx, cfg, nil))
	b, err = os.ReadFile(filepath.Join(root, AgentArgsFile))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "--max-pods=200\n")
	b, err = os.ReadFile(filepath.Join(root, AgentRegistriesDir, "docker.io", "hosts.toml"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "[host.\"https://mirror.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n"))
	for _, secret := range []string{AgentArgsFile, filepath.Join(AgentRegistriesDir, "docker.io", "hosts.toml")} {
		fi, err := os.Stat(filepath.Join(root, secret))
		assert.NilError(t, err)
		assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600), "%s may hold secrets", secret)
	}

	assert.NilError(t, o.Boot(ctx, cfg))
	b, err = os.ReadFile(filepath.Join(root, NetworkdDir, "50-liken-eth0.network"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "Address=10.0.0.11/24"))
	assert.DeepEqual(t, log.cmds, []string{
		"systemctl try-restart systemd-timesyncd.service",
		"systemctl restart containerd.service kubelet.service",
		"modprobe -- vfio enable_unsafe_noiommu_mode=1",
		"networkctl reload",
		"blkid -p /dev/vdb",
		"mount -t ext4 /dev/vdb /var/lib/data",
		"systemctl try-restart systemd-resolved.service",
		"iptables -w -t nat -S LIKEN-POD-MASQ",
		"iptables -w -t nat -F LIKEN-POD-MASQ",
		"iptables -w -t nat -A LIKEN-POD-MASQ ! -s 10.42.0.0/16 -j RETURN",
		"iptables -w -t nat -A LIKEN-POD-MASQ -d 10.42.0.0/16 -j RETURN",
		"iptables -w -t nat -A LIKEN-POD-MASQ -m addrtype --src-type LOCAL -j RETURN",
		"iptables -w -t nat -A LIKEN-POD-MASQ -j MASQUERADE",
		"iptables -w -t nat -C POSTROUTING -j LIKEN-POD-MASQ",
		"nft " + ServiceRuleset(netip.MustParseAddr("10.43.0.1"), netip.MustParseAddrPort("10.0.0.10:6443")),
		"systemctl try-restart kubelet.service",
	})
}

// TestOSResolverAndTrust: the Cluster's name servers reach the machine's
// resolver, which restarts only when they changed; its registry mirrors
// reach containerd's hosts.toml with no restart, and its CA bundle the
// machine's trusted certificates and its https mirrors; a bad value
// changes nothing.
func TestOSResolverAndTrust(t *testing.T) {
	var log cmdLog
	o := &OS{Root: t.TempDir(), Run: log.run, stat: blockDeviceStat}
	ctx := context.Background()
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(o.Root, rel))
		if errors.Is(err, fs.ErrNotExist) {
			return "<none>"
		}
		assert.NilError(t, err)
		return string(b)
	}
	const restart = "systemctl try-restart systemd-resolved.service"
	cfg := base()
	cfg.Settings.Sysctls = nil
	for _, step := range []struct {
		name    string
		servers []string
		file    string
		cmds    []string
	}{
		{"servers given", []string{"192.0.2.53", "[2001:db8::53]:5353"}, "# Written by liken-node from the Cluster's settings.dnsServers.\n[Resolve]\nDNS=192.0.2.53 [2001:db8::53]:5353\n", []string{restart}},
		{"the same servers", []string{"192.0.2.53", "[2001:db8::53]:5353"}, "# Written by liken-node from the Cluster's settings.dnsServers.\n[Resolve]\nDNS=192.0.2.53 [2001:db8::53]:5353\n", nil},
		{"none: DHCP's", nil, "<none>", []string{restart}},
		{"none again", nil, "<none>", nil},
	} {
		log.cmds = nil
		cfg.Settings.DNSServers = step.servers
		assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldDNSServers}}), step.name)
		assert.Check(t, is.Equal(read(ResolvedDropIn), step.file), step.name)
		assert.Check(t, is.DeepEqual(log.cmds, step.cmds), step.name)
	}
	cfg.Settings.DNSServers = []string{"192.0.2.53", "dns.example.com"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldDNSServers}}), `name server "dns.example.com" in the Cluster's settings.dnsServers is not an IP address`)
	assert.Check(t, is.Equal(read(ResolvedDropIn), "<none>"))

	ca, err := pki.NewCA("a private CA", time.Now(), time.Hour)
	assert.NilError(t, err)
	cfg.Settings.DNSServers = nil
	cfg.Settings.RegistryMirrors = []likenv1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example.com", "http://plain.example.com:5000"}}}
	mirrors := filepath.Join(AgentRegistriesDir, "docker.io", "hosts.toml")
	const https = "\n[host.\"https://mirror.example.com\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	const plain = "\n[host.\"http://plain.example.com:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	// Mirrors are Live: written, and nothing restarted.
	log.cmds = nil
	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldRegistryMirrors}}))
	assert.Check(t, is.Equal(read(mirrors), "# Written by liken-node from the Cluster's settings.registryMirrors.\n"+https+plain))
	assert.Check(t, is.Len(log.cmds, 0), "a new mirror restarted something: %v", log.cmds)
	cfg.Settings.CABundle = string(ca.CertPEM())
	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldCABundle}}))
	assert.Check(t, is.Equal(read(CABundleFile), string(ca.CertPEM())))
	// containerd reads hosts.toml at every pull: the https mirror trusts
	// the bundle at once.
	assert.Check(t, is.Equal(read(mirrors), "# Written by liken-node from the Cluster's settings.registryMirrors.\n"+https+"  ca = \"/etc/ssl/certs/liken-ca-bundle.pem\"\n"+plain))
	cfg.Settings.CABundle = "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"
	assert.ErrorContains(t, o.Boot(ctx, cfg), "settings.caBundle")
	assert.Check(t, is.Equal(read(CABundleFile), string(ca.CertPEM())), "a refused bundle leaves the last one")
	cfg.Settings.CABundle = ""
	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldCABundle}}))
	assert.Check(t, is.Equal(read(CABundleFile), "<none>"))
	assert.Check(t, is.Equal(read(mirrors), "# Written by liken-node from the Cluster's settings.registryMirrors.\n"+https+plain), "no mirror names a bundle that is gone")
	cfg.Settings.RegistryMirrors = nil
	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldRegistryMirrors}}))
	assert.Check(t, is.Equal(read(mirrors), "<none>"), "a mirror taken out of the Cluster is no longer used")
}

// fakeNAT is the nat tables of iptables and ip6tables, as far as the
// pods' masquerade uses them: chains of rules, and each command failing
// where iptables fails, with exit status 1; and the nft scripts run (the
// kubernetes Service route), which succeed. Other commands succeed.
type fakeNAT struct {
	chains  map[string][]string // iptables' nat table
	chains6 map[string][]string // ip6tables' nat table
	cmds    []string            // the iptables, ip6tables and nft commands run
	nft     []string            // the nft scripts run, in order
	fail    string              // a command that fails, by its start
}

func newFakeNAT() *fakeNAT {
	builtin := func() map[string][]string {
		return map[string][]string{"PREROUTING": nil, "OUTPUT": nil, "POSTROUTING": nil}
	}
	return &fakeNAT{chains: builtin(), chains6: builtin()}
}

// only are the commands run that name chain.
func (f *fakeNAT) only(chain string) []string {
	var out []string
	for _, c := range f.cmds {
		if strings.Contains(c, " "+chain) {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeNAT) run(_ context.Context, name string, args ...string) error {
	chains := f.chains
	switch name {
	case "iptables", "nft":
	case "ip6tables":
		chains = f.chains6
	default:
		return nil
	}
	cmd := strings.Join(append([]string{name}, args...), " ")
	f.cmds = append(f.cmds, cmd)
	if f.fail != "" && strings.HasPrefix(cmd, f.fail) {
		return fmt.Errorf("%s: exit status 4: %s: Resource temporarily unavailable.", cmd, name)
	}
	if name == "nft" {
		f.nft = append(f.nft, args...)
		return nil
	}
	if len(args) < 5 || args[0] != "-w" || args[1] != "-t" || args[2] != "nat" {
		return fmt.Errorf("%s: not a command the fake knows", cmd)
	}
	op, chain, rule := args[3], args[4], strings.Join(args[5:], " ")
	rules, exists := chains[chain]
	exit1 := fmt.Errorf("%s: exit status 1", cmd)
	switch op {
	case "-S", "-F", "-A", "-C":
		if !exists {
			return exit1 // No chain/target/match by that name.
		}
	case "-N":
		if exists {
			return exit1 // Chain already exists.
		}
	default:
		return fmt.Errorf("%s: not a command the fake knows", cmd)
	}
	if target, ok := strings.CutPrefix(rule, "-j "); ok && target != "DNAT" && target != "MASQUERADE" && target != "RETURN" {
		if _, ok := chains[target]; !ok {
			return exit1 // Couldn't load target.
		}
	}
	switch op {
	case "-N", "-F":
		chains[chain] = []string{}
	case "-A":
		chains[chain] = append(rules, rule)
	case "-C":
		if !slices.Contains(rules, rule) {
			return exit1 // Bad rule (does a matching rule exist in that chain?).
		}
	}
	return nil
}

// sysRoot is a root folder with the kernel parameter base's sysctl
// sets, as /proc/sys has it.
func sysRoot(t *testing.T) string {
	root := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "proc/sys/vm"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(root, "proc/sys/vm/max_map_count"), []byte("65530\n"), 0o644))
	return root
}

// fakeLookup resolves api.example.com to two IPv4 addresses, empty.example.com
// to none, and nothing else.
func fakeLookup(_ context.Context, network, host string) ([]netip.Addr, error) {
	if network != "ip4" {
		return nil, fmt.Errorf("looked up %s, not ip4", network)
	}
	switch host {
	case "api.example.com":
		return []netip.Addr{netip.MustParseAddr("10.0.0.20"), netip.MustParseAddr("10.0.0.21")}, nil
	case "empty.example.com":
		return nil, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestOSBootServiceRoute: Boot sends the first service address's port 443
// to the endpoint with a table of liken's own, replaced whole by one nft
// command at every Boot (every boot, a retry after a failed one, a new
// endpoint), in chains after kube-proxy's.
func TestOSBootServiceRoute(t *testing.T) {
	assert.Equal(t, ServiceRuleset(netip.MustParseAddr("10.96.0.1"), netip.MustParseAddrPort("10.0.0.10:6443")),
		"table ip liken; delete table ip liken; table ip liken { "+
			"chain kubernetes-service-prerouting { type nat hook prerouting priority -90; policy accept; ip daddr 10.96.0.1 tcp dport 443 dnat to 10.0.0.10:6443; }; "+
			"chain kubernetes-service-output { type nat hook output priority -90; policy accept; ip daddr 10.96.0.1 tcp dport 443 dnat to 10.0.0.10:6443; }; }")
	for _, tc := range []struct {
		name, endpoint, serviceCIDR string
		svc, to                     string // the DNAT rule's
	}{
		{"an IP endpoint and the default range", "https://10.0.0.10:6443", "", "10.96.0.1", "10.0.0.10:6443"},
		{"host:port and the Cluster's range", "10.0.2.2:7443", "10.43.0.0/16", "10.43.0.1", "10.0.2.2:7443"},
		{"a URL without a port", "https://10.0.0.10", "10.96.0.0/12", "10.96.0.1", "10.0.0.10:443"},
		{"a name, to its first IPv4 address", "https://api.example.com:6443/", "", "10.96.0.1", "10.0.0.20:6443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nat := newFakeNAT()
			o := &OS{Root: sysRoot(t), Run: nat.run, stat: blockDeviceStat, lookup: fakeLookup}
			cfg := base()
			cfg.Network.Endpoint, cfg.Network.ServiceCIDR = tc.endpoint, tc.serviceCIDR
			want := ServiceRuleset(netip.MustParseAddr(tc.svc), netip.MustParseAddrPort(tc.to))
			assert.NilError(t, o.Boot(context.Background(), cfg))
			assert.NilError(t, o.Boot(context.Background(), cfg))
			assert.DeepEqual(t, nat.nft, []string{want, want})
			// No iptables rule for the Service.
			assert.DeepEqual(t, nat.chains, map[string][]string{
				"PREROUTING": nil, "OUTPUT": nil,
				"LIKEN-POD-MASQ": podMasq("10.42.0.0/16"), "POSTROUTING": {"-j LIKEN-POD-MASQ"},
			})
		})
	}
}

func TestOSBootServiceRouteErrors(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, serviceCIDR string
		fail                        string // the command that fails
		want                        string
		ran                         int // nft commands run
	}{
		{name: "no endpoint", want: "the kubernetes Service route: the Cluster's spec.network.endpoint is empty; set it"},
		{name: "a name with no address", endpoint: "empty.example.com:6443",
			want: `the kubernetes Service route: endpoint host "empty.example.com" resolves to no IPv4 address: no A record; check the machine's DNS servers`},
		{name: "a name that does not resolve", endpoint: "https://nowhere.example.com:6443",
			want: `the kubernetes Service route: endpoint host "nowhere.example.com" resolves to no IPv4 address: lookup nowhere.example.com: no such host`},
		{name: "an IPv6 endpoint", endpoint: "[fd00::1]:6443", want: "endpoint host fd00::1 is an IPv6 address, and liken routes the kubernetes Service over IPv4 only"},
		{name: "an IPv6 service range", endpoint: "10.0.0.10:6443", serviceCIDR: "fd00:10:96::/112",
			want: "the service range fd00:10:96::/112 is IPv6, and liken routes the kubernetes Service over IPv4 only"},
		{name: "a service range too small", endpoint: "10.0.0.10:6443", serviceCIDR: "10.96.0.0/32",
			want: `the kubernetes Service route: spec.network.serviceCIDR "10.96.0.0/32" holds no address for the kubernetes Service`},
		{name: "an endpoint without a port", endpoint: "http://10.0.0.10", want: `endpoint "http://10.0.0.10" has no port`},
		{name: "nft failing", endpoint: "10.0.2.2:6443", fail: "nft", ran: 1,
			want: "installing the kubernetes Service route (10.96.0.1:443 → 10.0.2.2:6443): nft table ip liken; delete table ip liken; table ip liken { chain kubernetes-service-prerouting { type nat hook prerouting priority -90; policy accept; ip daddr 10.96.0.1 tcp dport 443 dnat to 10.0.2.2:6443; }; "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nat := newFakeNAT()
			nat.fail = tc.fail
			o := &OS{Root: sysRoot(t), Run: nat.run, stat: blockDeviceStat, lookup: fakeLookup}
			cfg := base()
			cfg.Network.Endpoint, cfg.Network.ServiceCIDR = tc.endpoint, tc.serviceCIDR
			assert.ErrorContains(t, o.Boot(context.Background(), cfg), tc.want)
			assert.Equal(t, len(nat.only("liken")), tc.ran, "%q", nat.cmds)
		})
	}
}

// podMasq are the rules of LIKEN-POD-MASQ for the pod range cidr.
func podMasq(cidr string) []string {
	return []string{"! -s " + cidr + " -j RETURN", "-d " + cidr + " -j RETURN", "-m addrtype --src-type LOCAL -j RETURN", "-j MASQUERADE"}
}

// TestOSBootPodMasquerade: Boot masquerades pods' traffic leaving the
// Cluster's pod range with a chain of liken's own, and a second Boot
// (every boot, a retry, a new range) leaves that chain's rules once.
func TestOSBootPodMasquerade(t *testing.T) {
	for _, tc := range []struct {
		name, podCIDR string
		tables        string // iptables or ip6tables
		masked        string // the range in the rules
	}{
		{"the default range", "", "iptables", "10.244.0.0/16"},
		{"the Cluster's range", "10.42.0.0/16", "iptables", "10.42.0.0/16"},
		{"a range with host bits", "10.42.7.1/16", "iptables", "10.42.0.0/16"},
		{"an IPv6 range", "fd00:10:244::/56", "ip6tables", "fd00:10:244::/56"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nat := newFakeNAT()
			o := &OS{Root: sysRoot(t), Run: nat.run, stat: blockDeviceStat}
			cfg := base()
			cfg.Network.PodCIDR = tc.podCIDR
			cmd := tc.tables + " -w -t nat "
			first := []string{
				cmd + "-S LIKEN-POD-MASQ", cmd + "-N LIKEN-POD-MASQ", cmd + "-F LIKEN-POD-MASQ",
				cmd + "-A LIKEN-POD-MASQ ! -s " + tc.masked + " -j RETURN",
				cmd + "-A LIKEN-POD-MASQ -d " + tc.masked + " -j RETURN",
				cmd + "-A LIKEN-POD-MASQ -m addrtype --src-type LOCAL -j RETURN",
				cmd + "-A LIKEN-POD-MASQ -j MASQUERADE",
				cmd + "-C POSTROUTING -j LIKEN-POD-MASQ", cmd + "-A POSTROUTING -j LIKEN-POD-MASQ",
			}
			chains := nat.chains
			if tc.tables == "ip6tables" {
				chains = nat.chains6
			}

			assert.NilError(t, o.Boot(context.Background(), cfg))
			assert.DeepEqual(t, nat.only("LIKEN-POD-MASQ"), first)
			assert.DeepEqual(t, chains["LIKEN-POD-MASQ"], podMasq(tc.masked))
			assert.DeepEqual(t, chains["POSTROUTING"], []string{"-j LIKEN-POD-MASQ"})

			nat.cmds = nil
			assert.NilError(t, o.Boot(context.Background(), cfg))
			assert.DeepEqual(t, nat.only("LIKEN-POD-MASQ"), append([]string{first[0]}, first[2:8]...))
			assert.DeepEqual(t, chains["LIKEN-POD-MASQ"], podMasq(tc.masked))
			assert.DeepEqual(t, chains["POSTROUTING"], []string{"-j LIKEN-POD-MASQ"})
		})
	}
}

func TestOSBootPodMasqueradeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, podCIDR, fail, want string
	}{
		{name: "a range that is no CIDR", podCIDR: "10.42.0.0",
			want: `the pods' masquerade: spec.network.podCIDR "10.42.0.0" is not a CIDR; correct the Cluster`},
		{name: "iptables failing", podCIDR: "10.42.0.0/16", fail: "iptables -w -t nat -A LIKEN-POD-MASQ -j MASQUERADE",
			want: "installing the pods' masquerade (traffic leaving 10.42.0.0/16): iptables -w -t nat -A LIKEN-POD-MASQ -j MASQUERADE: exit status 4"},
		{name: "the jump refused", podCIDR: "10.42.0.0/16", fail: "iptables -w -t nat -A POSTROUTING",
			want: "installing the pods' masquerade (traffic leaving 10.42.0.0/16): iptables -w -t nat -A POSTROUTING -j LIKEN-POD-MASQ: exit status 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nat := newFakeNAT()
			nat.fail = tc.fail
			o := &OS{Root: sysRoot(t), Run: nat.run, stat: blockDeviceStat}
			cfg := base()
			cfg.Network.PodCIDR = tc.podCIDR
			assert.ErrorContains(t, o.Boot(context.Background(), cfg), tc.want)
			assert.Check(t, is.Len(nat.only("LIKEN-SERVICES"), 0), "the Service route was installed after the masquerade failed")
		})
	}
}

// TestOSBootKubeletNetwork: Boot gives the kubelet the Cluster's cluster
// DNS address in a drop-in of its own, and restarts the kubelet only when
// the drop-in changed: a machine's first boot, a new clusterDNS.
func TestOSBootKubeletNetwork(t *testing.T) {
	const restart = "systemctl try-restart kubelet.service"
	dropIn := func(ip string) string {
		return "# Written by liken-node at boot from the Cluster's spec.network.clusterDNS (or its default).\n" +
			"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDNS:\n- " + ip + "\n"
	}
	restarts := func(l *cmdLog) int {
		n := 0
		for _, c := range l.cmds {
			if c == restart {
				n++
			}
		}
		return n
	}
	var log cmdLog
	o := &OS{Root: sysRoot(t), Run: log.run, stat: blockDeviceStat}
	ctx := context.Background()
	// read is the drop-in, or "" when there is none.
	read := func() string {
		b, err := os.ReadFile(filepath.Join(o.Root, KubeletNetworkFile))
		if errors.Is(err, fs.ErrNotExist) {
			return ""
		}
		assert.NilError(t, err)
		return string(b)
	}
	cfg := base() // serviceCIDR 10.43.0.0/16
	for _, step := range []struct {
		name, clusterDNS, file string
		restarts               int
	}{
		{"a first boot without an address: the service range's tenth", "", dropIn("10.43.0.10"), 1},
		{"the same address given", "10.43.0.10", dropIn("10.43.0.10"), 0},
		{"a new address", "10.43.0.53", dropIn("10.43.0.53"), 1},
		{"another boot", "10.43.0.53", dropIn("10.43.0.53"), 0},
		{"an IPv6 address", "fd00:10:96::a", dropIn("fd00:10:96::a"), 1},
		{"no address any more", "", dropIn("10.43.0.10"), 1},
		{"no address again", "", dropIn("10.43.0.10"), 0},
	} {
		log.cmds = nil
		cfg.Network.ClusterDNS = step.clusterDNS
		assert.NilError(t, o.Boot(ctx, cfg), step.name)
		assert.Check(t, is.Equal(read(), step.file), step.name)
		assert.Check(t, is.Equal(restarts(&log), step.restarts), step.name)
	}

	// A failed restart puts the old file back (none when there was none,
	// as on a machine whose liken-node wrote none), so the retry restarts.
	for _, old := range []string{"", "10.43.0.53"} {
		cfg.Network.ClusterDNS = old
		assert.NilError(t, o.Boot(ctx, cfg))
		if old == "" {
			assert.NilError(t, os.Remove(filepath.Join(o.Root, KubeletNetworkFile)))
		}
		o.Run = func(ctx context.Context, name string, args ...string) error {
			if name == "systemctl" && strings.Join(args, " ") == "try-restart kubelet.service" {
				return errors.New("exit status 1")
			}
			return nil
		}
		cfg.Network.ClusterDNS = "10.43.0.99"
		assert.ErrorContains(t, o.Boot(ctx, cfg), "restarting the kubelet for the cluster DNS address: exit status 1")
		want := ""
		if old != "" {
			want = dropIn(old)
		}
		assert.Check(t, is.Equal(read(), want), "after a failed restart from %q", old)
		o.Run = log.run
		log.cmds = nil
		assert.NilError(t, o.Boot(ctx, cfg))
		assert.Check(t, is.Equal(restarts(&log), 1))
		assert.Check(t, is.Equal(read(), dropIn("10.43.0.99")))
	}

	cfg.Network.ServiceCIDR = "10.43.0.0/29"
	cfg.Network.ClusterDNS = ""
	assert.ErrorContains(t, o.Boot(ctx, cfg), "the kubelet's cluster DNS: serviceCIDR 10.43.0.0/29 holds no tenth address")
	cfg.Network.ServiceCIDR = "10.43.0.0/16"
	cfg.Network.ClusterDNS = "10.43.0.10\nclusterDomain: evil"
	assert.ErrorContains(t, o.Boot(ctx, cfg), `the kubelet's cluster DNS: spec.network.clusterDNS "10.43.0.10\nclusterDomain: evil" is not an IP address`)
}

func TestOSApplierRefusesBadValues(t *testing.T) {
	o := &OS{Root: t.TempDir(), Run: (&cmdLog{}).run, stat: blockDeviceStat}
	ctx := context.Background()
	cfg := base()
	cfg.Settings.Sysctls = map[string]string{"../../etc/passwd": "x"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, nil), `sysctl "../../etc/passwd" is not a kernel parameter name`)
	// kernel.panic=0 would leave a trial that panics hanging: it is
	// refused, live and at boot (a trial boot applies its sysctls), and
	// nothing is written, not even the other sysctls.
	for _, apply := range []func(Config) error{
		func(c Config) error { return o.ApplyLive(ctx, c, nil) },
		func(c Config) error { return o.Boot(ctx, c) },
	} {
		assert.NilError(t, os.MkdirAll(filepath.Join(o.Root, "proc/sys/kernel"), 0o755))
		cfg = base()
		cfg.Settings.Sysctls = map[string]string{"kernel.panic": "0", "a.first": "1"}
		assert.ErrorContains(t, apply(cfg), "sysctl kernel.panic is set by liken")
		_, err := os.Stat(filepath.Join(o.Root, "proc/sys/kernel/panic"))
		assert.Assert(t, os.IsNotExist(err), "kernel.panic written")
		_, err = os.Stat(filepath.Join(o.Root, "proc/sys/a/first"))
		assert.Assert(t, os.IsNotExist(err), "a sysctl written before the refusal")
	}
	// A trial's guard may be set to 1 (then on every boot), never off.
	cfg = base()
	cfg.Settings.Sysctls = map[string]string{"kernel.panic_on_oops": "0"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, nil), `sysctl kernel.panic_on_oops="0" would let a trial boot that hangs stay hung`)
	cfg.Settings.Sysctls = map[string]string{"kernel.hung_task_panic": "1"}
	assert.NilError(t, os.WriteFile(filepath.Join(o.Root, "proc/sys/kernel/hung_task_panic"), []byte("0\n"), 0o644))
	assert.NilError(t, o.ApplyLive(ctx, cfg, nil))
	cfg = base()
	cfg.Disks[0].MountPoint = "/etc"
	assert.ErrorContains(t, o.Boot(ctx, cfg), "must be a folder under /var")
	cfg = base()
	cfg.Settings.KernelArgs = []string{`init="/bin/sh"`}
	assert.ErrorContains(t, o.StageBoot(ctx, cfg, nil), "kernel argument")
}

// TestOSSysctlsChangeAllOrNothing: a parameter the kernel does not have
// is refused before any value is written, and a value the kernel refuses
// puts back the values written before it.
func TestOSSysctlsChangeAllOrNothing(t *testing.T) {
	root := sysRoot(t)
	o := &OS{Root: root, Run: (&cmdLog{}).run, stat: blockDeviceStat}
	ctx := context.Background()
	read := func(k string) string {
		b, err := os.ReadFile(filepath.Join(root, "proc/sys", strings.ReplaceAll(k, ".", "/")))
		assert.NilError(t, err)
		return string(b)
	}
	cfg := base()
	cfg.Settings.Sysctls = map[string]string{"vm.max_map_count": "262144", "vm.no_such_parameter": "1"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, nil), "sysctl vm.no_such_parameter: this machine's kernel has no such parameter")
	assert.Equal(t, read("vm.max_map_count"), "65530\n", "a value written before the refusal")

	// vm.refuses stands for a parameter whose write the kernel refuses
	// (here a socket, which cannot be opened): vm.max_map_count, written
	// before it, is put back.
	sock, err := net.Listen("unix", filepath.Join(root, "proc/sys/vm/refuses"))
	assert.NilError(t, err)
	defer sock.Close()
	assert.NilError(t, os.WriteFile(filepath.Join(root, "proc/sys/vm/max_map_count"), []byte("65530\n"), 0o644))
	cfg.Settings.Sysctls = map[string]string{"vm.max_map_count": "262144", "vm.refuses": "1"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, nil), "setting sysctl vm.refuses=1")
	assert.Equal(t, read("vm.max_map_count"), "65530\n", "the value written before the refusal was not put back")
}

// TestOSApplierStaysInItsPlace feeds the applier values that would escape
// the folder it writes, format something that is not a disk, or give
// modprobe an option: each is refused before any command runs or any
// file is written.
func TestOSApplierStaysInItsPlace(t *testing.T) {
	root := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(root, "regular"), nil, 0o644))
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		stat   func(string) (fs.FileInfo, error)
		want   string
	}{
		{"port name that leaves the network folder", func(c *Config) { c.Ports[0].Name = "a/../../../../b" }, blockDeviceStat, "is not an interface name"},
		{"port name ..", func(c *Config) { c.Ports[0].Name = ".." }, blockDeviceStat, "is not an interface name"},
		{"disk device that leaves /dev", func(c *Config) { c.Disks[0].Device = "/dev/../var/lib/x" }, blockDeviceStat, "clean path under /dev"},
		{"disk device that is a regular file", func(c *Config) { c.Disks[0].Device = "/dev/regular" }, func(string) (fs.FileInfo, error) {
			return os.Stat(filepath.Join(root, "regular"))
		}, "is not a block device"},
		{"module parameter read as an option", func(c *Config) {
			c.KernelModules[0].Parameters = []string{"--config=/var/lib/evil.conf"}
		}, blockDeviceStat, "key starts with a letter, a digit or _"},
		{"module name read as an option", func(c *Config) { c.KernelModules[0].Name = "-v" }, blockDeviceStat, "is not a module name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log cmdLog
			dir := t.TempDir()
			o := &OS{Root: dir, Run: log.run, stat: tc.stat}
			cfg := base()
			tc.mutate(&cfg)
			assert.ErrorContains(t, o.Boot(context.Background(), cfg), tc.want)
			for _, c := range log.cmds {
				assert.Assert(t, !strings.HasPrefix(c, "mkfs") && !strings.HasPrefix(c, "mount"), "ran %q", c)
			}
			entries, err := os.ReadDir(filepath.Dir(dir))
			assert.NilError(t, err)
			assert.Assert(t, len(entries) == 1, "wrote outside its root: %v", entries)
		})
	}
}

// blockDeviceStat reads every device as a block device.
func blockDeviceStat(string) (fs.FileInfo, error) { return fakeBlockDevice{}, nil }

type fakeBlockDevice struct{ fs.FileInfo }

func (fakeBlockDevice) Mode() fs.FileMode { return fs.ModeDevice | 0o600 }

func TestRecorderObservesTheAppliedConfig(t *testing.T) {
	r := NewRecorder(filepath.Join(t.TempDir(), "applier.log"))
	cfg := base()
	assert.NilError(t, r.Boot(context.Background(), cfg))
	assert.Equal(t, r.Count(OpBoot), 1)
	o, err := r.Observe(context.Background(), cfg)
	assert.NilError(t, err)
	assert.DeepEqual(t, o.Modules, []string{"vfio"})
	assert.DeepEqual(t, o.Ports, []likenv1.ObservedPort{{Name: "eth0", Addresses: []string{"10.0.0.11/24"}, Up: true}})
	b, err := os.ReadFile(r.Path)
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), `"op":"boot"`))
}

// TestOSStageBootKernelArgs: staging checks the kernel arguments, naming
// a refused one, and writes nothing to the boot partition: the turn writes
// them right before its reboot, so a reboot that is not a turn boots with
// the arguments in effect.
func TestOSStageBootKernelArgs(t *testing.T) {
	root := t.TempDir()
	o := &OS{Root: root, Run: (&cmdLog{}).run}
	ctx := context.Background()
	cfg := base()
	cfg.Settings.KernelArgs = []string{"mitigations=off", "memmap=4G$16G", "isolcpus=1-3"}
	assert.NilError(t, o.StageBoot(ctx, cfg, nil))
	_, err := os.Stat(filepath.Join(root, KernelArgsFile))
	assert.Assert(t, os.IsNotExist(err), "staging wrote %s: %v", KernelArgsFile, err)

	for _, tc := range []struct{ arg, err string }{
		{`init="/bin/sh"`, `kernel argument "init=\"/bin/sh\"" holds the character '"'`},
		{"a=x; reboot", `kernel argument "a=x; reboot" holds white space`},
		{"liken.slot=B", `kernel argument "liken.slot=B": parameters named liken.* belong to liken's boot script`},
		{"panic=0", `kernel argument "panic=0": liken's boot script sets panic=`},
	} {
		bad := base()
		bad.Settings.KernelArgs = []string{"quiet", tc.arg}
		assert.ErrorContains(t, o.StageBoot(ctx, bad, nil), tc.err)
	}
}

// TestOSWriteReplaces: the applier's files are replaced whole and leave no
// temporary file behind.
func TestOSWriteReplaces(t *testing.T) {
	root := t.TempDir()
	o := &OS{Root: root}
	assert.NilError(t, o.write("etc/issue", []byte("a long first banner\n"), 0o644))
	assert.NilError(t, o.write("etc/issue", []byte("short\n"), 0o600))
	b, err := os.ReadFile(filepath.Join(root, "etc/issue"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "short\n")
	fi, err := os.Stat(filepath.Join(root, "etc/issue"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600))
	ents, err := os.ReadDir(filepath.Join(root, "etc"))
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 1)
}

// TestAgentRegistries: containerd's hosts folder holds exactly the declared
// mirrors, "*" is containerd's _default, and a bad entry is refused before
// anything is written.
func TestAgentRegistries(t *testing.T) {
	root := t.TempDir()
	var log cmdLog
	o := &OS{Root: root, Run: log.run, stat: blockDeviceStat}
	ctx := context.Background()
	folders := func() []string {
		es, err := os.ReadDir(filepath.Join(root, AgentRegistriesDir))
		assert.NilError(t, err)
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	cfg := base()
	cfg.Settings.RegistryMirrors = []likenv1.RegistryMirror{
		{Registry: "docker.io", Endpoints: []string{"https://a.example"}},
		{Registry: "*", Endpoints: []string{"http://10.0.0.5:5000", "https://b.example/v2"}},
	}
	assert.NilError(t, o.RestartK3s(ctx, cfg, nil))
	assert.DeepEqual(t, folders(), []string{"_default", "docker.io"})
	b, err := os.ReadFile(filepath.Join(root, AgentRegistriesDir, "_default", "hosts.toml"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "[host.\"http://10.0.0.5:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"https://b.example/v2\"]"))

	cfg.Settings.RegistryMirrors = cfg.Settings.RegistryMirrors[:1]
	assert.NilError(t, o.RestartK3s(ctx, cfg, nil))
	assert.DeepEqual(t, folders(), []string{"docker.io"})

	for _, tc := range []struct {
		name   string
		mirror likenv1.RegistryMirror
		args   []string
		want   string
	}{
		{name: "a path for a registry", mirror: likenv1.RegistryMirror{Registry: "../etc", Endpoints: []string{"https://a.example"}}, want: `"../etc" is not a registry host`},
		{name: "a registry with a slash", mirror: likenv1.RegistryMirror{Registry: "docker.io/library", Endpoints: []string{"https://a.example"}}, want: `"docker.io/library" is not a registry host`},
		{name: "an endpoint that is no URL", mirror: likenv1.RegistryMirror{Registry: "quay.io", Endpoints: []string{"mirror.example"}}, want: `quay.io: endpoint "mirror.example" is not an http or https URL`},
		{name: "an endpoint with a quote", mirror: likenv1.RegistryMirror{Registry: "quay.io", Endpoints: []string{`https://a.example/"x`}}, want: `is not an http or https URL`},
		{name: "an argument with a line break", mirror: likenv1.RegistryMirror{Registry: "quay.io", Endpoints: []string{"https://a.example"}}, args: []string{"--v=2\n--x"}, want: `settings.k3sArgs: "--v=2\n--x" holds a line break`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log.cmds = nil
			bad := base()
			bad.Settings.K3sArgs = append(bad.Settings.K3sArgs, tc.args...)
			bad.Settings.RegistryMirrors = []likenv1.RegistryMirror{tc.mirror}
			assert.ErrorContains(t, o.RestartK3s(ctx, bad, nil), tc.want)
			assert.DeepEqual(t, folders(), []string{"docker.io"})
			b, err := os.ReadFile(filepath.Join(root, AgentArgsFile))
			assert.NilError(t, err)
			assert.Equal(t, string(b), "--max-pods=200\n")
			assert.Assert(t, len(log.cmds) == 0, "the agent was restarted: %v", log.cmds)
		})
	}
}

// TestRestartK3sOnALeader: on a leader a RestartK3s change restarts its
// control plane with the node agent, in one systemctl call, and every unit
// it names is one liken's image has; a worker restarts only the agent.
func TestRestartK3sOnALeader(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		leader bool
		want   string
	}{
		{false, "systemctl restart containerd.service kubelet.service"},
		{true, "systemctl restart etcd.service kube-apiserver.service kube-controller-manager.service kube-scheduler.service containerd.service kubelet.service"},
	} {
		var log cmdLog
		o := &OS{Root: t.TempDir(), Run: log.run, stat: blockDeviceStat, Leader: tc.leader}
		assert.NilError(t, o.RestartK3s(ctx, base(), nil))
		assert.DeepEqual(t, log.cmds, []string{tc.want})
	}
	repo, err := srctree.Find()
	assert.NilError(t, err)
	for _, u := range (&OS{Leader: true}).RestartUnits() {
		_, err := os.Stat(filepath.Join(repo, "image", "build", "rootfs", "etc", "systemd", "system", u))
		assert.NilError(t, err, "liken's image has no unit %s", u)
	}
}

// TestStopUnit: a split leader's fence stops its API server's unit, one
// liken's image has, and a failure names the unit.
func TestStopUnit(t *testing.T) {
	ctx := context.Background()
	var log cmdLog
	o := &OS{Root: t.TempDir(), Run: log.run}
	assert.NilError(t, o.StopUnit(ctx, APIServerUnit))
	assert.DeepEqual(t, log.cmds, []string{"systemctl stop kube-apiserver.service"})
	repo, err := srctree.Find()
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(repo, "image", "build", "rootfs", "etc", "systemd", "system", APIServerUnit))
	assert.NilError(t, err, "liken's image has no unit %s", APIServerUnit)

	o.Run = func(context.Context, string, ...string) error { return errors.New("exit status 5") }
	assert.Error(t, o.StopUnit(ctx, APIServerUnit), "stopping kube-apiserver.service: exit status 5")
}

// TestImageKubeletReadsTheAgentFiles: the image's kubelet wrapper passes
// the drop-in folder and the argument file liken-node writes.
func TestImageKubeletReadsTheAgentFiles(t *testing.T) {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	b, err := os.ReadFile(filepath.Join(repo, "image", "build", "rootfs", "usr", "lib", "liken", "kubelet"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "dropins=/"+KubeletConfigDir+"\n"))
	assert.Check(t, is.Contains(string(b), `"--config-dir=$dropins"`))
	assert.Check(t, is.Contains(string(b), "args=/"+AgentArgsFile+"\n"))
	assert.Check(t, strings.HasPrefix(KubeletNetworkFile, KubeletConfigDir+"/") && strings.HasSuffix(KubeletNetworkFile, ".conf"),
		"the kubelet reads only .conf files of its drop-in folder: %s", KubeletNetworkFile)
}

// TestBootReplacesTheLayersPorts: the ports liken install put on the layer
// partition hold until liken-node applies the Machine's: a port the
// Machine still lists keeps its name (the Machine's file takes precedence),
// and a port it no longer lists loses its copy, so that no address of an
// old install stays on the machine.
func TestBootReplacesTheLayersPorts(t *testing.T) {
	root := t.TempDir()
	var log cmdLog
	o := &OS{Root: root, Run: log.run, stat: blockDeviceStat}
	cfg := base()
	cfg.Disks, cfg.KernelModules, cfg.Settings.Sysctls = nil, nil, nil
	for _, p := range []likenv1.Port{cfg.Ports[0], {Name: "old", Addresses: []string{"192.0.2.7/24"}}} {
		name, b, err := PortNetwork(p)
		assert.NilError(t, err)
		assert.NilError(t, os.MkdirAll(filepath.Join(root, LayerNetworkDir), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, LayerNetworkDir, name), b, 0o644))
	}

	assert.NilError(t, o.Boot(context.Background(), cfg))
	left, err := filepath.Glob(filepath.Join(root, LayerNetworkDir, "*"))
	assert.NilError(t, err)
	assert.DeepEqual(t, left, []string{filepath.Join(root, LayerNetworkDir, "50-liken-eth0.network")})
	assert.Assert(t, is.Contains(log.cmds, "networkctl reload"))
}

// A power cut while a restart of k3s with new arguments is on trial: the
// kubelet starts with the file it finds, and Boot puts back the arguments
// in effect and restarts the node agent; a boot whose file holds them
// already restarts nothing.
func TestBootRestartsTheAgentWithTheArgumentsInEffect(t *testing.T) {
	root := t.TempDir()
	var log cmdLog
	o := &OS{Root: root, Run: log.run, stat: blockDeviceStat}
	cfg := base()
	cfg.Disks, cfg.KernelModules, cfg.Settings.Sysctls, cfg.Ports = nil, nil, nil, nil
	ctx := context.Background()
	trial := cfg
	trial.Settings.K3sArgs = []string{"--kubelet-refuses-this"}
	assert.NilError(t, o.RestartK3s(ctx, trial, nil))

	log.cmds = nil
	assert.NilError(t, o.Boot(ctx, cfg))
	b, err := os.ReadFile(filepath.Join(root, AgentArgsFile))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "--max-pods=200\n")
	assert.Check(t, is.Contains(log.cmds, "systemctl restart containerd.service kubelet.service"))

	log.cmds = nil
	assert.NilError(t, o.Boot(ctx, cfg))
	assert.Check(t, !slices.Contains(log.cmds, "systemctl restart containerd.service kubelet.service"), "%v", log.cmds)
}
