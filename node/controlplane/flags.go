package controlplane

import (
	"fmt"
	"io/fs"
	"path/filepath"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Datastore tuning: emulated leaders on a loaded host miss etcd's 100 ms
// heartbeat, and the quota bounds what a leader's disk must hold.
const (
	// EtcdHeartbeatMillis is etcd's heartbeat interval, in milliseconds.
	EtcdHeartbeatMillis = 500
	// EtcdElectionTimeoutMillis is etcd's election timeout, in milliseconds.
	EtcdElectionTimeoutMillis = 5000
	// EtcdQuotaBytes is the most data etcd keeps: 1 GiB.
	EtcdQuotaBytes = 1 << 30
)

// KubeletVolumePluginDir is the kubelet's flex volume folder, volumePluginDir
// in the image's kubelet.yaml; the controller manager probes the same one.
const KubeletVolumePluginDir = "/var/lib/kubelet/volume-plugins"

// EtcdArgs are etcd's arguments on this leader, with the certificates of
// Setup in dir. The initial cluster and its state are not among them: the
// datastore's start decides them before every start and passes them in
// etcd's environment.
func EtcdArgs(cfg Config, dir string) ([]string, error) {
	self, err := cfg.Self()
	if err != nil {
		return nil, err
	}
	f := files(dir)
	return []string{
		"--name=" + cfg.Machine,
		"--data-dir=" + EtcdDataDir,
		fmt.Sprintf("--listen-client-urls=https://0.0.0.0:%d", EtcdClientPort),
		"--advertise-client-urls=" + self.EtcdClient,
		fmt.Sprintf("--listen-peer-urls=https://0.0.0.0:%d", EtcdPeerPort),
		"--initial-advertise-peer-urls=" + self.EtcdPeer,
		"--cert-file=" + f(EtcdServer.Cert()),
		"--key-file=" + f(EtcdServer.Key()),
		"--trusted-ca-file=" + f(EtcdServerCA.Cert()),
		"--client-cert-auth",
		"--peer-cert-file=" + f(EtcdPeer.Cert()),
		"--peer-key-file=" + f(EtcdPeer.Key()),
		"--peer-trusted-ca-file=" + f(EtcdPeerCA.Cert()),
		"--peer-client-cert-auth",
		fmt.Sprintf("--heartbeat-interval=%d", EtcdHeartbeatMillis),
		fmt.Sprintf("--election-timeout=%d", EtcdElectionTimeoutMillis),
		fmt.Sprintf("--quota-backend-bytes=%d", EtcdQuotaBytes),
	}, nil
}

// APIServerArgs are kube-apiserver's arguments on this leader, with the
// certificates of Setup in dir. It reaches only its own etcd member, so cut
// off from quorum its /readyz fails and the endpoint skips it; it accepts
// no static token.
func APIServerArgs(cfg Config, dir string) ([]string, error) {
	if _, err := cfg.FirstServiceIP(); err != nil {
		return nil, fmt.Errorf("serviceCIDR: %w", err)
	}
	f := files(dir)
	return []string{
		fmt.Sprintf("--etcd-servers=https://127.0.0.1:%d", EtcdClientPort),
		"--etcd-cafile=" + f(EtcdServerCA.Cert()),
		"--etcd-certfile=" + f(APIServerEtcdClient.Cert()),
		"--etcd-keyfile=" + f(APIServerEtcdClient.Key()),
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--tls-cert-file=" + f(APIServer.Cert()),
		"--tls-private-key-file=" + f(APIServer.Key()),
		"--client-ca-file=" + f(ClientCA.Cert()),
		"--enable-bootstrap-token-auth",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + f(ServiceAccountKeyFile),
		"--service-account-signing-key-file=" + f(ServiceAccountKeyFile),
		"--service-cluster-ip-range=" + cfg.ServiceCIDR,
		// Every leader's API server lists its own address (that of the
		// port with the default route, as the kubelet's Node address) in
		// the kubernetes Service's endpoints while it runs, and drops it
		// when it stops or its lease lapses: kube-proxy routes the Service
		// to them.
		"--endpoint-reconciler-type=lease",
		"--kubelet-client-certificate=" + f(APIServerKubeletClient.Cert()),
		"--kubelet-client-key=" + f(APIServerKubeletClient.Key()),
		// Machines' names need not resolve: reach kubelets (logs, exec)
		// at the Node's address first.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--requestheader-client-ca-file=" + f(RequestHeaderCA.Cert()),
		"--requestheader-allowed-names=" + FrontProxyUser,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + f(FrontProxyClient.Cert()),
		"--proxy-client-key-file=" + f(FrontProxyClient.Key()),
		"--shutdown-delay-duration=5s",
		// Stopping, it waits at most 5 s for its watches to drain, not
		// its 60 s request timeout: a leader's restart or reboot holds
		// its API server down seconds, not a minute.
		"--shutdown-watch-termination-grace-period=5s",
		"--allow-privileged=true",
	}, nil
}

// ControllerManagerArgs are kube-controller-manager's arguments on this
// leader, with the files of Setup in dir. It signs kubelets' client
// certificates with the client CA, so they pass the API server's
// --client-ca-file, and gives each Node its pod range
// (ControllerManagerNetworkArgs).
func ControllerManagerArgs(cfg Config, dir string) ([]string, error) {
	network, err := ControllerManagerNetworkArgs(cfg.PodCIDROrDefault(), cfg.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	f := files(dir)
	kubeconfig := f(ControllerManagerKubeconfig)
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--root-ca-file=" + f(ServerCA.Cert()),
		"--cluster-signing-cert-file=" + f(ClientCA.Cert()),
		"--cluster-signing-key-file=" + f(ClientCAKey),
		"--controllers=*,-serviceaccount-token",
		"--use-service-account-credentials=true",
		// The image's root is read-only: the flex volume folder is the
		// kubelet's, on /var.
		"--flex-volume-plugin-dir=" + KubeletVolumePluginDir,
	}, network...)
	return append(args, leaderElection...), nil
}

// ControllerManagerNetworkArgs are the controller manager's flags that
// give every Node a pod range of its own out of podCIDR (the Cluster's
// spec.network.podCIDR), of the size v1alpha1.NodePodCIDRPrefix says,
// kept clear of serviceCIDR. Each machine's containerd writes its CNI
// configuration from its Node's range. A leader and the lab's control
// plane take the same flags.
func ControllerManagerNetworkArgs(podCIDR, serviceCIDR string) ([]string, error) {
	prefix, err := likenv1.NodePodCIDRPrefix(podCIDR)
	if err != nil {
		return nil, fmt.Errorf("podCIDR: %w", err)
	}
	if _, err := likenv1.FirstServiceIP(serviceCIDR); err != nil {
		return nil, fmt.Errorf("serviceCIDR: %w", err)
	}
	return []string{
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + podCIDR,
		fmt.Sprintf("--node-cidr-mask-size=%d", prefix),
		"--service-cluster-ip-range=" + serviceCIDR,
	}, nil
}

// SchedulerArgs are kube-scheduler's arguments on this leader, with the
// files of Setup in dir.
func SchedulerArgs(dir string) []string {
	kubeconfig := files(dir)(SchedulerKubeconfig)
	return append([]string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
	}, leaderElection...)
}

// leaderElection are the controller manager's and the scheduler's lease
// timings. The defaults (a 10 s renew deadline of 5 s requests) lost the
// lease again and again on a leader of one emulated CPU, where the API
// server answered /readyz in up to 5 s (docs/design/controlplane.md,
// "Measured"); 40 s keeps the lease through such answers, and a leader
// that is gone is replaced after the 60 s lease.
var leaderElection = []string{
	"--leader-elect=true",
	"--leader-elect-lease-duration=60s",
	"--leader-elect-renew-deadline=40s",
	"--leader-elect-retry-period=5s",
}

func files(dir string) func(string) string {
	return func(name string) string { return filepath.Join(dir, filepath.FromSlash(name)) }
}

// DatastoreRoom is how much more etcd may write to the slot store: its
// quota less what its data folder holds now (0 once it holds more).
func DatastoreRoom() int64 {
	var used int64
	_ = filepath.WalkDir(EtcdDataDir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				used += fi.Size()
			}
		}
		return nil
	})
	return max(EtcdQuotaBytes-used, 0)
}
