package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/internal/srctree"
)

const dir = "/run/liken/control-plane"

// parseArgs maps each --flag to its value ("" for a bare flag), failing on
// a flag given twice.
func parseArgs(t *testing.T, args []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range args {
		assert.Assert(t, strings.HasPrefix(a, "--"), "argument %q is not a --flag", a)
		name, value, _ := strings.Cut(a, "=")
		_, dup := m[name]
		assert.Assert(t, !dup, "%s given twice", name)
		m[name] = value
	}
	return m
}

func allArgs(t *testing.T, cfg Config, dir string) map[string][]string {
	t.Helper()
	etcd, err := EtcdArgs(cfg, dir)
	assert.NilError(t, err)
	apiserver, err := APIServerArgs(cfg, dir)
	assert.NilError(t, err)
	controllerManager, err := ControllerManagerArgs(cfg, dir)
	assert.NilError(t, err)
	return map[string][]string{
		"etcd":                    etcd,
		"kube-apiserver":          apiserver,
		"kube-controller-manager": controllerManager,
		"kube-scheduler":          SchedulerArgs(dir),
	}
}

func TestFlags(t *testing.T) {
	type want struct{ flag, value string }
	for _, tc := range []struct {
		component string
		have      []want
		absent    []string
	}{
		{
			component: "etcd",
			have: []want{
				{"--name", "leader-2"},
				{"--data-dir", "/var/lib/etcd"},
				{"--listen-client-urls", "https://0.0.0.0:2379"},
				{"--advertise-client-urls", "https://192.168.1.12:2379"},
				{"--listen-peer-urls", "https://0.0.0.0:2380"},
				{"--initial-advertise-peer-urls", "https://leader-2.fleet.example:2380"},
				{"--cert-file", dir + "/etcd/server.crt"},
				{"--key-file", dir + "/etcd/server.key"},
				{"--trusted-ca-file", dir + "/etcd/server-ca.crt"},
				{"--client-cert-auth", ""},
				{"--peer-cert-file", dir + "/etcd/peer.crt"},
				{"--peer-key-file", dir + "/etcd/peer.key"},
				{"--peer-trusted-ca-file", dir + "/etcd/peer-ca.crt"},
				{"--peer-client-cert-auth", ""},
				{"--heartbeat-interval", "500"},
				{"--election-timeout", "5000"},
				{"--quota-backend-bytes", "1073741824"},
			},
			// fsync stays on; the initial cluster comes from etcd.env, which
			// a flag would shadow.
			absent: []string{"--unsafe-no-fsync", "--initial-cluster", "--initial-cluster-state", "--auto-tls", "--peer-auto-tls"},
		},
		{
			component: "kube-apiserver",
			have: []want{
				{"--etcd-servers", "https://127.0.0.1:2379"},
				{"--etcd-cafile", dir + "/etcd/server-ca.crt"},
				{"--etcd-certfile", dir + "/apiserver-etcd-client.crt"},
				{"--etcd-keyfile", dir + "/apiserver-etcd-client.key"},
				{"--bind-address", "0.0.0.0"},
				{"--secure-port", "6443"},
				{"--tls-cert-file", dir + "/apiserver.crt"},
				{"--tls-private-key-file", dir + "/apiserver.key"},
				{"--client-ca-file", dir + "/client-ca.crt"},
				{"--enable-bootstrap-token-auth", ""},
				{"--authorization-mode", "Node,RBAC"},
				{"--enable-admission-plugins", "NodeRestriction"},
				{"--service-account-key-file", dir + "/service.key"},
				{"--service-account-signing-key-file", dir + "/service.key"},
				{"--service-cluster-ip-range", "10.43.0.0/16"},
				{"--endpoint-reconciler-type", "lease"},
				{"--kubelet-client-certificate", dir + "/apiserver-kubelet-client.crt"},
				{"--kubelet-client-key", dir + "/apiserver-kubelet-client.key"},
				{"--kubelet-preferred-address-types", "InternalIP,ExternalIP,Hostname"},
				{"--requestheader-client-ca-file", dir + "/request-header-ca.crt"},
				{"--requestheader-allowed-names", "front-proxy-client"},
				{"--proxy-client-cert-file", dir + "/front-proxy-client.crt"},
				{"--proxy-client-key-file", dir + "/front-proxy-client.key"},
				{"--shutdown-delay-duration", "5s"},
				{"--shutdown-watch-termination-grace-period", "5s"},
			},
			absent: []string{"--token-auth-file", "--insecure-port", "--anonymous-auth", "--authorization-webhook-config-file"},
		},
		{
			component: "kube-controller-manager",
			have: []want{
				{"--kubeconfig", dir + "/controller-manager.kubeconfig"},
				{"--authentication-kubeconfig", dir + "/controller-manager.kubeconfig"},
				{"--authorization-kubeconfig", dir + "/controller-manager.kubeconfig"},
				{"--leader-elect", "true"},
				{"--leader-elect-renew-deadline", "40s"},
				{"--leader-elect-lease-duration", "60s"},
				{"--root-ca-file", dir + "/server-ca.crt"},
				{"--cluster-signing-cert-file", dir + "/client-ca.crt"},
				{"--cluster-signing-key-file", dir + "/client-ca.key"},
				{"--controllers", "*,-serviceaccount-token"},
				{"--flex-volume-plugin-dir", "/var/lib/kubelet/volume-plugins"},
				{"--use-service-account-credentials", "true"},
				{"--allocate-node-cidrs", "true"},
				{"--cluster-cidr", "10.42.0.0/16"},
				{"--node-cidr-mask-size", "24"},
				{"--service-cluster-ip-range", "10.43.0.0/16"},
			},
		},
		{
			component: "kube-scheduler",
			have: []want{
				{"--kubeconfig", dir + "/scheduler.kubeconfig"},
				{"--authentication-kubeconfig", dir + "/scheduler.kubeconfig"},
				{"--authorization-kubeconfig", dir + "/scheduler.kubeconfig"},
				{"--leader-elect", "true"},
				{"--leader-elect-renew-deadline", "40s"},
				{"--leader-elect-lease-duration", "60s"},
			},
		},
	} {
		t.Run(tc.component, func(t *testing.T) {
			args := parseArgs(t, allArgs(t, certsConfig(), dir)[tc.component])
			for _, w := range tc.have {
				got, ok := args[w.flag]
				if assert.Check(t, ok, "%s is missing", w.flag) {
					assert.Check(t, is.Equal(got, w.value), w.flag)
				}
			}
			for _, f := range tc.absent {
				_, ok := args[f]
				assert.Check(t, !ok, "%s is given", f)
			}
		})
	}
}

// TestAPIServerFlagsAlways checks, for leaders of any fleet, the flags
// that keep the API server safe and tied to its own member.
func TestAPIServerFlagsAlways(t *testing.T) {
	one := testConfig()
	one.Machine, one.FirstLeader, one.Leaders = "leader-1", "leader-1", one.Leaders[:1]
	one.ServiceCIDR = "10.96.0.0/12"
	for name, cfg := range map[string]Config{"two leaders": testConfig(), "one leader": one, "another fleet": certsConfig()} {
		t.Run(name, func(t *testing.T) {
			args, err := APIServerArgs(cfg, dir)
			assert.NilError(t, err)
			m := parseArgs(t, args)
			assert.Check(t, is.Equal(m["--enable-admission-plugins"], "NodeRestriction"))
			assert.Check(t, is.Equal(m["--authorization-mode"], "Node,RBAC"))
			assert.Check(t, is.Equal(m["--etcd-servers"], "https://127.0.0.1:2379"), "the API server reaches only its own member")
			assert.Check(t, is.Equal(m["--endpoint-reconciler-type"], "lease"), "the kubernetes Service's endpoints are the running API servers")
			assert.Check(t, is.Equal(m["--service-cluster-ip-range"], cfg.ServiceCIDR))
			_, ok := m["--token-auth-file"]
			assert.Check(t, !ok, "a static token file")
		})
	}
}

// TestControllerManagerNetworkArgs: the controller manager gives each
// Node a range of the Cluster's pod range, a /24 of an IPv4 one and a /64
// of an IPv6 one, and keeps clear of the service range the API server
// hands out.
func TestControllerManagerNetworkArgs(t *testing.T) {
	for _, tc := range []struct {
		name, podCIDR, serviceCIDR string
		want                       []string
		wantErr                    string
	}{
		{name: "the defaults", podCIDR: "10.244.0.0/16", serviceCIDR: "10.96.0.0/16",
			want: []string{"--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16", "--node-cidr-mask-size=24", "--service-cluster-ip-range=10.96.0.0/16"}},
		{name: "a large IPv4 range", podCIDR: "10.128.0.0/9", serviceCIDR: "10.96.0.0/12",
			want: []string{"--allocate-node-cidrs=true", "--cluster-cidr=10.128.0.0/9", "--node-cidr-mask-size=24", "--service-cluster-ip-range=10.96.0.0/12"}},
		{name: "a range for one machine", podCIDR: "192.168.50.0/24", serviceCIDR: "10.96.0.0/16",
			want: []string{"--allocate-node-cidrs=true", "--cluster-cidr=192.168.50.0/24", "--node-cidr-mask-size=24", "--service-cluster-ip-range=10.96.0.0/16"}},
		{name: "IPv6", podCIDR: "fd00:10:244::/56", serviceCIDR: "fd00:10:96::/112",
			want: []string{"--allocate-node-cidrs=true", "--cluster-cidr=fd00:10:244::/56", "--node-cidr-mask-size=64", "--service-cluster-ip-range=fd00:10:96::/112"}},
		{name: "a pod range smaller than a Node's", podCIDR: "10.244.0.0/25", serviceCIDR: "10.96.0.0/16",
			wantErr: "podCIDR: 10.244.0.0/25 is smaller than one machine's pod range, a /24"},
		{name: "a pod range that is no CIDR", podCIDR: "10.244.0.0", serviceCIDR: "10.96.0.0/16",
			wantErr: `podCIDR: "10.244.0.0" is not a CIDR`},
		{name: "a service range that is no CIDR", podCIDR: "10.244.0.0/16", serviceCIDR: "",
			wantErr: `serviceCIDR: "" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ControllerManagerNetworkArgs(tc.podCIDR, tc.serviceCIDR)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// TestControllerManagerTakesTheDefaultPodRange: a configuration written
// before liken gave Nodes ranges has no podCIDR; its leader hands out the
// default range, which machines installed then masquerade as theirs.
func TestControllerManagerTakesTheDefaultPodRange(t *testing.T) {
	cfg := certsConfig()
	cfg.PodCIDR = ""
	args, err := ControllerManagerArgs(cfg, dir)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(parseArgs(t, args)["--cluster-cidr"], "10.244.0.0/16"))
}

func TestFlagsRefuse(t *testing.T) {
	cfg := certsConfig()
	cfg.Machine = "worker-1"
	_, err := EtcdArgs(cfg, dir)
	assert.ErrorContains(t, err, `machine "worker-1" is not among the leaders`)
	cfg = certsConfig()
	cfg.ServiceCIDR = "10.43.0.0"
	_, err = APIServerArgs(cfg, dir)
	assert.ErrorContains(t, err, "serviceCIDR")
	_, err = ControllerManagerArgs(cfg, dir)
	assert.ErrorContains(t, err, "serviceCIDR")
	cfg = certsConfig()
	cfg.PodCIDR = "10.42.0.0/28"
	_, err = ControllerManagerArgs(cfg, dir)
	assert.ErrorContains(t, err, "podCIDR: 10.42.0.0/28 is smaller than one machine's pod range")
}

// TestFlexVolumeFolderIsTheKubelets: the controller manager probes the
// flex volume folder the image's kubelet.yaml names, on /var, since the
// root is read-only.
func TestFlexVolumeFolderIsTheKubelets(t *testing.T) {
	repo, err := srctree.Find()
	assert.NilError(t, err)
	b, err := os.ReadFile(filepath.Join(repo, "image", "build", "rootfs", "etc", "kubernetes", "kubelet.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "\nvolumePluginDir: "+KubeletVolumePluginDir+"\n"))
}

// TestFlagsNameSetupFiles checks that every file a component is given is
// one Setup writes, and that no flag names a file elsewhere but etcd's data.
func TestFlagsNameSetupFiles(t *testing.T) {
	identity, _ := testIdentity(t)
	out := t.TempDir()
	assert.NilError(t, Setup(certsConfig(), identity, out, now))
	named := 0
	for component, args := range allArgs(t, certsConfig(), out) {
		for flag, value := range parseArgs(t, args) {
			if !filepath.IsAbs(value) {
				continue
			}
			if !strings.HasPrefix(value, out+"/") {
				assert.Check(t, value == EtcdDataDir || value == KubeletVolumePluginDir, "%s %s names a file outside the setup folder: %s", component, flag, value)
				continue
			}
			named++
			st, err := os.Stat(value)
			if assert.Check(t, err, "%s %s", component, flag) {
				assert.Check(t, st.Mode().IsRegular(), "%s %s: %s is not a file", component, flag, value)
			}
		}
	}
	assert.Check(t, is.Equal(named, 28), "flags naming files")
}
