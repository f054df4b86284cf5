package controlplane

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/internal/pki"
)

// Where a leader keeps its control plane's files.
const (
	// LeaderDir is the folder liken install writes on a Leader's layer
	// partition: ConfigFile and IdentityDir inside it.
	LeaderDir = "/var/lib/liken-layer/leader"
	// ConfigFile is Config's file inside LeaderDir.
	ConfigFile = "config.yaml"
	// IdentityDir is the cluster identity, unpacked, inside LeaderDir.
	IdentityDir = "identity"
	// SetupDir is where Setup writes the certificates and kubeconfigs at
	// every boot: memory, so every reboot renews them.
	SetupDir = "/run/liken/control-plane"
	// EtcdDataDir is etcd's data, on the slot store partition.
	EtcdDataDir = "/var/lib/etcd"
)

// Ports the components listen on, on every address of the machine.
const (
	// APIServerPort is kube-apiserver's port.
	APIServerPort = 6443
	// EtcdClientPort is etcd's port for its clients.
	EtcdClientPort = 2379
	// EtcdPeerPort is etcd's port for the other members.
	EtcdPeerPort = 2380
)

// LocalAPIServer is the API server of this leader, as the controller
// manager, the scheduler and init reach it.
var LocalAPIServer = fmt.Sprintf("https://127.0.0.1:%d", APIServerPort)

// CertValidity is how long Setup's certificates stay valid; a leader
// renews them at every boot.
const CertValidity = 365 * 24 * time.Hour

// Pair names a certificate and its key: Pair+".crt" and Pair+".key",
// relative to the identity or the setup folder.
type Pair string

// Cert is the certificate's file.
func (p Pair) Cert() string { return string(p) + ".crt" }

// Key is the private key's file.
func (p Pair) Key() string { return string(p) + ".key" }

// The cluster identity's CAs, as liken layer lays them out in a leader's
// IdentityDir; Setup copies their certificates to the same names.
const (
	// ServerCA signs the API server's serving certificates.
	ServerCA Pair = "server-ca"
	// ClientCA signs client certificates of kubelets, components and
	// administrators, and the controller manager signs kubelets' with it.
	ClientCA Pair = "client-ca"
	// RequestHeaderCA signs the front proxy's client certificate.
	RequestHeaderCA Pair = "request-header-ca"
	// EtcdServerCA signs etcd's serving certificate and its clients'.
	EtcdServerCA Pair = "etcd/server-ca"
	// EtcdPeerCA signs the certificates etcd members use between
	// themselves.
	EtcdPeerCA Pair = "etcd/peer-ca"
)

// CAs are every CA of the identity.
var CAs = []Pair{ServerCA, ClientCA, RequestHeaderCA, EtcdServerCA, EtcdPeerCA}

// ServiceAccountKeyFile is the identity's key that signs and checks
// service account tokens; Setup copies it to the same name.
const ServiceAccountKeyFile = "service.key"

// What Setup writes in the setup folder besides the CA certificates and
// ServiceAccountKeyFile.
const (
	// EtcdServer is etcd's serving certificate (EtcdServerCA), also a
	// client of itself for its JSON gateway.
	EtcdServer Pair = "etcd/server"
	// EtcdPeer is etcd's certificate towards the other members
	// (EtcdPeerCA), serving and client.
	EtcdPeer Pair = "etcd/peer"
	// NodeEtcdClient is liken-node's client certificate to the members of the
	// datastore (EtcdServerCA), CN EtcdClientUser.
	NodeEtcdClient Pair = "etcd/liken-node-client"
	// APIServer is the API server's serving certificate (ServerCA).
	APIServer Pair = "apiserver"
	// APIServerEtcdClient is the API server's client certificate to etcd
	// (EtcdServerCA).
	APIServerEtcdClient Pair = "apiserver-etcd-client"
	// APIServerKubeletClient is the API server's client certificate to
	// kubelets (ClientCA), CN KubeletClientUser.
	APIServerKubeletClient Pair = "apiserver-kubelet-client"
	// FrontProxyClient is the API server's client certificate to
	// aggregated APIs (RequestHeaderCA), CN FrontProxyUser.
	FrontProxyClient Pair = "front-proxy-client"
	// ClientCAKey is where Setup copies ClientCA's key, with which the
	// controller manager signs kubelets' client certificates.
	ClientCAKey = "client-ca.key"
	// ControllerManagerKubeconfig is the controller manager's kubeconfig to
	// LocalAPIServer, as system:kube-controller-manager.
	ControllerManagerKubeconfig = "controller-manager.kubeconfig"
	// SchedulerKubeconfig is the scheduler's kubeconfig to LocalAPIServer,
	// as system:kube-scheduler.
	SchedulerKubeconfig = "scheduler.kubeconfig"
	// InitKubeconfig is init's kubeconfig to LocalAPIServer, as InitUser in
	// system:masters.
	InitKubeconfig = "init.kubeconfig"
)

// Users the control plane's certificates name.
const (
	// KubeletClientUser is the API server as a client of kubelets; init
	// binds it to system:kubelet-api-admin.
	KubeletClientUser = "kube-apiserver-kubelet-client"
	// FrontProxyUser is the front proxy; the API server accepts request
	// headers only from it.
	FrontProxyUser = "front-proxy-client"
	// InitUser is liken-node's control-plane init, in system:masters.
	InitUser = "liken-control-plane-init"
	// EtcdClientUser is liken-node as a client of etcd.
	EtcdClientUser = "liken-node"
)

// Setup writes into outDir (made 0700) every certificate, key and
// kubeconfig the control plane runs with, issued at now for CertValidity by
// the CAs in identityDir, and copies the CA certificates, ClientCA's key
// and ServiceAccountKeyFile there. Keys and kubeconfigs are 0600, and every
// file is replaced atomically.
func Setup(cfg Config, identityDir, outDir string, now time.Time) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("the control plane's configuration: %w", err)
	}
	self, err := cfg.Self()
	if err != nil {
		return err
	}
	serviceIP, err := cfg.FirstServiceIP()
	if err != nil {
		return err
	}
	cas := map[Pair]*pki.CA{}
	for _, p := range CAs {
		ca, err := pki.LoadCA(filepath.Join(identityDir, filepath.FromSlash(p.Cert())), filepath.Join(identityDir, filepath.FromSlash(p.Key())))
		if err != nil {
			return fmt.Errorf("the cluster identity's %s: %w", p, err)
		}
		cas[p] = ca
	}
	saPath := filepath.Join(identityDir, ServiceAccountKeyFile)
	saKey, err := os.ReadFile(saPath)
	if err != nil {
		return fmt.Errorf("the cluster identity's service account key: %w", err)
	}
	if _, err := pki.ParseKey(saKey); err != nil {
		return fmt.Errorf("%s: %w", saPath, err)
	}

	for _, d := range []string{outDir, filepath.Join(outDir, "etcd")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	out := func(name string) string { return filepath.Join(outDir, filepath.FromSlash(name)) }

	dns, ips := servingNames(cfg, self)
	apiDNS := append(slices.Clone(dns), "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	apiIPs := appendIP(slices.Clone(ips), serviceIP)
	leaves := []struct {
		pair Pair
		ca   Pair
		req  pki.Request
	}{
		{EtcdServer, EtcdServerCA, pki.Request{CommonName: cfg.Machine, DNSNames: dns, IPAddresses: ips, Usage: pki.ServerAuth | pki.ClientAuth}},
		{EtcdPeer, EtcdPeerCA, pki.Request{CommonName: cfg.Machine, DNSNames: dns, IPAddresses: ips, Usage: pki.ServerAuth | pki.ClientAuth}},
		{NodeEtcdClient, EtcdServerCA, pki.Request{CommonName: EtcdClientUser, Usage: pki.ClientAuth}},
		{APIServerEtcdClient, EtcdServerCA, pki.Request{CommonName: "kube-apiserver-etcd-client", Usage: pki.ClientAuth}},
		{APIServer, ServerCA, pki.Request{CommonName: "kube-apiserver", DNSNames: apiDNS, IPAddresses: apiIPs, Usage: pki.ServerAuth}},
		{APIServerKubeletClient, ClientCA, pki.Request{CommonName: KubeletClientUser, Usage: pki.ClientAuth}},
		{FrontProxyClient, RequestHeaderCA, pki.Request{CommonName: FrontProxyUser, Usage: pki.ClientAuth}},
	}
	for _, l := range leaves {
		l.req.Now, l.req.Validity = now, CertValidity
		leaf, err := cas[l.ca].Issue(l.req)
		if err != nil {
			return fmt.Errorf("issuing %s: %w", l.pair, err)
		}
		if err := leaf.Write(out(l.pair.Cert()), out(l.pair.Key())); err != nil {
			return err
		}
	}

	kubeconfigs := []struct {
		file string
		req  pki.Request
	}{
		{ControllerManagerKubeconfig, pki.Request{CommonName: "system:kube-controller-manager"}},
		{SchedulerKubeconfig, pki.Request{CommonName: "system:kube-scheduler"}},
		{InitKubeconfig, pki.Request{CommonName: InitUser, Organizations: []string{"system:masters"}}},
	}
	for _, k := range kubeconfigs {
		k.req.Usage, k.req.Now, k.req.Validity = pki.ClientAuth, now, CertValidity
		leaf, err := cas[ClientCA].Issue(k.req)
		if err != nil {
			return fmt.Errorf("issuing %s's certificate: %w", k.file, err)
		}
		if err := pki.WriteKubeconfig(out(k.file), pki.Kubeconfig{Server: LocalAPIServer, CA: cas[ServerCA].CertPEM(), Client: leaf}); err != nil {
			return err
		}
	}

	for _, p := range CAs {
		if err := pki.WriteCert(out(p.Cert()), cas[p].Cert); err != nil {
			return err
		}
	}
	if err := pki.WriteKey(out(ClientCAKey), cas[ClientCA].Key); err != nil {
		return err
	}
	if err := atomicfile.Write(out(ServiceAccountKeyFile), saKey, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", out(ServiceAccountKeyFile), err)
	}
	return nil
}

// servingNames are the names a serving certificate of this leader holds:
// localhost, 127.0.0.1, the machine, and the hosts of its reach URLs and of
// the endpoint, split into DNS names and IP addresses.
func servingNames(cfg Config, self Leader) (dns []string, ips []net.IP) {
	hosts := []string{"localhost", "127.0.0.1", cfg.Machine}
	for _, s := range []string{self.APIServer, self.EtcdClient, self.EtcdPeer, cfg.Endpoint} {
		if u, err := url.Parse(s); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = appendIP(ips, ip)
		} else if !slices.Contains(dns, h) {
			dns = append(dns, h)
		}
	}
	return dns, ips
}

func appendIP(ips []net.IP, ip net.IP) []net.IP {
	if slices.ContainsFunc(ips, ip.Equal) {
		return ips
	}
	return append(ips, ip)
}
