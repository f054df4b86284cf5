package changes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/internal/trust"
	"liken.sh/liken/node/boot"
)

// OS applies changes to the running operating system: sysctls and NTP
// live, the node agent's configuration with a restart of the agent, and,
// at boot, kernel modules, network ports, data disks, the console banner,
// the kubelet's cluster DNS address, the pods' masquerade
// (PodMasqueradeChain) and the kubernetes Service route (ServiceChain).
// Every path is under Root so tests can run it in a folder.
type OS struct {
	// Root prefixes every path: "/" on a machine.
	Root string
	// Run runs a command; nil runs it with os/exec.
	Run func(ctx context.Context, name string, args ...string) error
	// Leader is true on a machine that runs the control plane: a
	// RestartK3s change restarts its components with the node agent.
	Leader bool

	// stat reads a device's mode; nil is os.Stat. Tests, which run in a
	// folder with no block devices, replace it.
	stat func(string) (fs.FileInfo, error)
	// lookup resolves a host name to its addresses; nil is
	// net.DefaultResolver.LookupNetIP. Tests, which must not depend on a
	// DNS server, replace it.
	lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ServiceTable is liken's nftables table (family ip) that sends the
// kubernetes Service (the first address of the service range, port 443)
// to the Cluster's endpoint while kube-proxy does not route it: at a
// machine's first boot, until kube-proxy starts, and whenever kube-proxy
// has not written its table. Its chains hook prerouting (pods) and output
// (host-network processes) at ServicePriority, after kube-proxy's nat
// chains (dstnat, -100). The kernel runs a later nat chain only for a
// connection that no earlier one translated, so once kube-proxy routes the
// Service, its endpoints (every leader's API server, from the kubernetes
// EndpointSlice) take every new connection and this table takes none.
// `nft list table ip liken` shows it on a machine.
const ServiceTable = "liken"

// ServicePriority is the priority of ServiceTable's chains: dstnat + 10.
const ServicePriority = -90

// PodMasqueradeChain is liken's nat chain that masquerades pods' traffic
// leaving the Cluster's pod range (spec.network.podCIDR): a pod's packet
// to an address outside the range leaves with the machine's address, one
// to an address inside it keeps the pod's, and the machine's own packets
// and forwarded ones from outside the range (a client's, to a NodePort)
// keep theirs. POSTROUTING jumps to it. The CNI configuration masquerades
// nothing itself (the bridge plugin's ipMasq would hide a pod's address
// from the pods of other machines too).
const PodMasqueradeChain = "LIKEN-POD-MASQ"

// Files the OS applier writes, relative to Root.
const (
	TimesyncdDropIn = "etc/systemd/timesyncd.conf.d/50-liken.conf"
	// ResolvedDropIn gives systemd-resolved, the machine's resolver, the
	// Cluster's settings.dnsServers.
	ResolvedDropIn = "etc/systemd/resolved.conf.d/50-liken.conf"
	// CABundleFile holds the Cluster's settings.caBundle among the
	// machine's trusted certificates, where every Go program started after
	// it was written (containerd, the kubelet) reads it.
	CABundleFile = "etc/ssl/certs/liken-ca-bundle.pem"
	// AgentArgsFile holds settings.k3sArgs, one a line: the image's
	// kubelet.service passes each line to kubelet as one argument.
	AgentArgsFile = "var/lib/liken/agent/kubelet-args"
	// AgentRegistriesDir is containerd's registry hosts folder (config_path
	// in the image's containerd config): one <registry>/hosts.toml per
	// settings.registryMirrors entry.
	AgentRegistriesDir = "var/lib/liken/agent/registries"
	// KubeletConfigDir is the kubelet's drop-in folder (its --config-dir,
	// which the image's /usr/lib/liken/kubelet passes once the folder
	// exists), on the slot store's partition: the kubelet starts with it
	// at every boot.
	KubeletConfigDir = "var/lib/liken/agent/kubelet.conf.d"
	// KubeletNetworkFile holds the kubelet's clusterDNS, the Cluster's
	// spec.network.clusterDNS (the image's kubelet.yaml sets clusterDomain).
	KubeletNetworkFile = KubeletConfigDir + "/50-liken-network.conf"
	KernelArgsFile     = BootDir + "/" + boot.KernelArgsFile
	BannerFile         = "etc/issue"
	NetworkdDir        = "etc/systemd/network"
	// LayerNetworkDir is where the machine's setup puts the network
	// files liken install wrote to the layer partition from the Machine's
	// ports (PortNetwork), so that its static addresses apply before it
	// joins. NetworkdDir's files of the same names take precedence.
	LayerNetworkDir  = "run/systemd/network"
	ModulesProcFile  = "proc/modules"
	bootStatProcFile = "proc/stat"
	// BootDir is the GRUB folder on the boot partition, where grub.cfg
	// and the boot state are.
	BootDir = "boot/grub"
)

var (
	sysctlName = regexp.MustCompile(`^[a-z0-9_]+(\.[a-zA-Z0-9_\-]+)+$`)
	safeWord   = regexp.MustCompile(`^[A-Za-z0-9_.,:=/@+\-]+$`)
	// moduleName is a kernel module's name.
	moduleName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]*$`)
	// moduleParam is key or key=value; the key starts with a letter, a
	// digit or _, so modprobe can never read it as an option.
	moduleParam = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.\-]*(=[A-Za-z0-9_.,:=/@+\-]*)?$`)
	// interfaceName is a network interface name as Linux accepts it, kept
	// to characters that are safe in a file name: never "." or "..".
	interfaceName = regexp.MustCompile(`^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,14}$`)
)

func (o *OS) path(rel string) string { return filepath.Join(o.Root, rel) }

func (o *OS) run(ctx context.Context, name string, args ...string) error {
	if o.Run != nil {
		return o.Run(ctx, name, args...)
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// write replaces the file at rel atomically: a temporary file next to it
// is written and synced, then renamed over it, and the folder is synced,
// so a power cut leaves the old contents or the new, never a mix.
func (o *OS) write(rel string, data []byte, mode os.FileMode) error {
	p := o.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, data, mode)
}

// ApplyLive writes the sysctls to /proc/sys, the NTP servers to a
// systemd-timesyncd drop-in (restarting timesyncd when they changed), the
// name servers to a systemd-resolved drop-in (restarting resolved), and
// the CA bundle and the registry mirrors' hosts.toml (trust), which
// containerd reads at every pull: no restart.
func (o *OS) ApplyLive(ctx context.Context, cfg Config, changed []Change) error {
	if err := o.sysctls(cfg.Settings.Sysctls); err != nil {
		return err
	}
	trusted := false
	for _, c := range changed {
		switch c.Field {
		case FieldDNSServers:
			if _, err := o.dns(ctx, cfg.Settings.DNSServers); err != nil {
				return err
			}
		case FieldCABundle, FieldRegistryMirrors:
			if trusted {
				continue
			}
			if err := o.trust(cfg.Settings); err != nil {
				return err
			}
			trusted = true
		}
		if c.Field == FieldNTPServers {
			if err := o.ntp(cfg.Settings.NTPServers); err != nil {
				return err
			}
			if err := o.run(ctx, "systemctl", "try-restart", "systemd-timesyncd.service"); err != nil {
				return fmt.Errorf("restarting the time service for the new NTP servers: %w", err)
			}
		}
	}
	return nil
}

func (o *OS) sysctls(s map[string]string) error {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	// Check every name before writing any value.
	for _, k := range names {
		if !sysctlName.MatchString(k) || strings.Contains(k, "..") {
			return fmt.Errorf("sysctl %q is not a kernel parameter name (such as vm.max_map_count)", k)
		}
		if boot.IsKernelPanicSysctl(k) {
			return fmt.Errorf("sysctl %s is set by liken (a kernel that fails reboots into the proven slot after 5 seconds) and cannot be changed: remove it from the Cluster's settings.sysctls", k)
		}
		if g, ok := boot.TrialGuardSysctl(k); ok && strings.TrimSpace(s[k]) != "1" {
			return fmt.Errorf("sysctl %s=%q would let a trial boot that hangs stay hung instead of rebooting into the proven slot (liken's boot script sets %s=1 on a trial): set it to 1 or remove it from the Cluster's settings.sysctls", k, s[k], g)
		}
	}
	// Every parameter must exist in this kernel, and its value is kept:
	// a value the kernel refuses puts the ones written before it back, so
	// a change that fails changes nothing.
	path := func(k string) string { return o.path(filepath.Join("proc/sys", strings.ReplaceAll(k, ".", "/"))) }
	before := map[string][]byte{}
	for _, k := range names {
		fi, err := os.Stat(path(k))
		if err != nil || fi.IsDir() {
			return fmt.Errorf("sysctl %s: this machine's kernel has no such parameter; remove it from the Cluster's settings.sysctls or correct its name", k)
		}
		if b, err := os.ReadFile(path(k)); err == nil {
			before[k] = b // a parameter that can only be written cannot be put back
		}
	}
	for i, k := range names {
		if err := os.WriteFile(path(k), []byte(s[k]+"\n"), 0o644); err != nil {
			for _, w := range names[:i] {
				if b, ok := before[w]; ok {
					_ = os.WriteFile(path(w), b, 0o644)
				}
			}
			return fmt.Errorf("setting sysctl %s=%s: %w (the kernel refused the value; the sysctls set before it were put back)", k, s[k], err)
		}
	}
	return nil
}

func (o *OS) ntp(servers []string) error {
	for _, s := range servers {
		if !safeWord.MatchString(s) {
			return fmt.Errorf("NTP server %q is not a host name or address", s)
		}
	}
	return o.write(TimesyncdDropIn, []byte("# Written by liken-node from the Cluster's settings.ntpServers.\n[Time]\nNTP="+strings.Join(servers, " ")+"\n"), 0o644)
}

// dns writes ResolvedDropIn with the name servers (removes it when there
// are none) and restarts systemd-resolved when that changed the file. It
// checks every server first, so a bad one changes nothing.
func (o *OS) dns(ctx context.Context, servers []string) (changed bool, err error) {
	for _, s := range servers {
		if err := checkDNSServer(s); err != nil {
			return false, err
		}
	}
	var want []byte
	if len(servers) > 0 {
		want = []byte("# Written by liken-node from the Cluster's settings.dnsServers.\n[Resolve]\nDNS=" + strings.Join(servers, " ") + "\n")
	}
	got, err := os.ReadFile(o.path(ResolvedDropIn))
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if exists == (want != nil) && bytes.Equal(got, want) {
		return false, nil
	}
	if want == nil {
		err = os.Remove(o.path(ResolvedDropIn))
	} else {
		err = o.write(ResolvedDropIn, want, 0o644)
	}
	if err != nil {
		return false, err
	}
	if err := o.run(ctx, "systemctl", "try-restart", "systemd-resolved.service"); err != nil {
		return true, fmt.Errorf("restarting the machine's resolver for the new name servers: %w", err)
	}
	klog.FromContext(ctx).Info("Gave the machine's resolver the Cluster's name servers", "dnsServers", servers)
	return true, nil
}

// checkDNSServer checks one settings.dnsServers entry: an IP address, or
// one with a port (192.0.2.53:5353, [2001:db8::53]:53).
func checkDNSServer(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Port() != 0 {
		return nil
	}
	return fmt.Errorf("name server %q in the Cluster's settings.dnsServers is not an IP address with an optional port, such as 192.0.2.53 or 192.0.2.53:5353", s)
}

// caBundle writes CABundleFile with the Cluster's CA bundle, or removes it
// when the bundle is empty. A bundle with no certificate in it is refused.
func (o *OS) caBundle(pemBundle string) error {
	if pemBundle == "" {
		if err := os.Remove(o.path(CABundleFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	if _, err := trust.Pool(pemBundle); err != nil {
		return err
	}
	return o.write(CABundleFile, []byte(pemBundle), 0o644)
}

// trust writes the Cluster's CA bundle (caBundle) and the registry
// mirrors' hosts.toml that name it (registries), in the order that never
// leaves a hosts.toml naming a file that is not there: a new bundle
// first, the mirrors first when the bundle goes.
func (o *OS) trust(s likenv1.SharedSettings) error {
	steps := []func() error{
		func() error { return o.caBundle(s.CABundle) },
		func() error { return o.registries(s) },
	}
	if s.CABundle == "" {
		slices.Reverse(steps)
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// agentFiles writes the node agent's configuration from the RestartK3s
// settings: settings.k3sArgs, one kubelet argument a line, and a
// containerd hosts.toml per settings.registryMirrors entry, with the CA
// bundle they may name (trust, the one writer of both). They live on the
// slot store's partition, so the agent starts with the last configuration
// written at every boot, before liken-node runs. argsChanged says whether
// the kubelet's arguments differed from the file's.
func (o *OS) agentFiles(cfg Config) (argsChanged bool, err error) {
	var args bytes.Buffer
	for _, a := range cfg.Settings.K3sArgs {
		if strings.ContainsAny(a, "\n\x00") {
			return false, fmt.Errorf("settings.k3sArgs: %q holds a line break", a)
		}
		args.WriteString(a + "\n")
	}
	old, err := os.ReadFile(o.path(AgentArgsFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	// Arguments may carry secrets (a token): readable by root only, as the
	// mirrors.
	if err := o.write(AgentArgsFile, args.Bytes(), 0o600); err != nil {
		return false, err
	}
	return !bytes.Equal(old, args.Bytes()), o.trust(cfg.Settings)
}

// registries writes a containerd hosts.toml per settings.registryMirrors
// entry (writeRegistries); with a settings.caBundle, each https mirror
// trusts it besides the public CAs.
func (o *OS) registries(s likenv1.SharedSettings) error {
	var ca string
	if s.CABundle != "" {
		ca = "/" + CABundleFile
	}
	hosts := map[string][]byte{}
	for _, m := range s.RegistryMirrors {
		dir, toml, err := registryHosts(m, ca)
		if err != nil {
			return err
		}
		hosts[dir] = toml
	}
	return o.writeRegistries(hosts)
}

// registryName is a registry host with an optional port, as containerd
// names its hosts.toml folders; "*" stands for every registry.
var registryName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$`)

// ValidateRegistryMirror says why a machine would refuse a
// settings.registryMirrors entry, or nil; the Cluster's schema refuses the
// same entries.
func ValidateRegistryMirror(m likenv1.RegistryMirror) error {
	_, _, err := registryHosts(m, "")
	return err
}

// registryHosts is the folder name and hosts.toml of one mirror entry:
// the mirrors in order, then the registry itself. Each https mirror
// trusts the CA file ca too, unless ca is "".
func registryHosts(m likenv1.RegistryMirror, ca string) (string, []byte, error) {
	dir := m.Registry
	if dir == "*" {
		dir = "_default"
	} else if !registryName.MatchString(dir) || strings.Contains(dir, "..") {
		return "", nil, fmt.Errorf("settings.registryMirrors: %q is not a registry host (such as docker.io or registry.example:5000, or * for every registry)", m.Registry)
	}
	var b bytes.Buffer
	b.WriteString("# Written by liken-node from the Cluster's settings.registryMirrors.\n")
	for _, e := range m.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(e, "\"\\\x00\n\r\t ") {
			return "", nil, fmt.Errorf("settings.registryMirrors: %s: endpoint %q is not an http or https URL", m.Registry, e)
		}
		fmt.Fprintf(&b, "\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", e)
		if ca != "" && u.Scheme == "https" {
			fmt.Fprintf(&b, "  ca = %q\n", ca)
		}
	}
	return dir, b.Bytes(), nil
}

// writeRegistries makes AgentRegistriesDir hold exactly the given
// hosts.toml files, one folder per registry.
func (o *OS) writeRegistries(hosts map[string][]byte) error {
	dir := o.path(AgentRegistriesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, toml := range hosts {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(dir, name, "hosts.toml"), toml, 0o600); err != nil {
			return err
		}
	}
	old, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range old {
		if _, keep := hosts[e.Name()]; !keep {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// AgentUnits are the node agent's systemd units, restarted in this order
// for a RestartK3s change: the container runtime first, so the kubelet
// that starts next finds it up. Both leave the pods running.
var AgentUnits = []string{"containerd.service", "kubelet.service"}

// ControlPlaneUnits are a leader's control-plane units, which a RestartK3s
// change restarts with the node agent (their units order them: etcd, then
// the API server, then the other two).
var ControlPlaneUnits = []string{"etcd.service", APIServerUnit, "kube-controller-manager.service", "kube-scheduler.service"}

// APIServerUnit is a leader's API server's unit.
const APIServerUnit = "kube-apiserver.service"

// StopUnit stops a unit until it is started again (a RestartK3s change,
// or the next boot).
func (o *OS) StopUnit(ctx context.Context, unit string) error {
	if err := o.run(ctx, "systemctl", "stop", unit); err != nil {
		return fmt.Errorf("stopping %s: %w", unit, err)
	}
	return nil
}

// RestartUnits are the units a RestartK3s change restarts: the node
// agent's, and on a leader its control plane's first.
func (o *OS) RestartUnits() []string {
	if o.Leader {
		return append(slices.Clone(ControlPlaneUnits), AgentUnits...)
	}
	return AgentUnits
}

// RestartK3s writes the node agent's configuration, then restarts the
// agent: containerd and the kubelet, whose pods keep running, and on a
// leader its control plane, in one systemctl call.
func (o *OS) RestartK3s(ctx context.Context, cfg Config, _ []Change) error {
	if _, err := o.agentFiles(cfg); err != nil {
		return err
	}
	units := o.RestartUnits()
	if err := o.run(ctx, "systemctl", append([]string{"restart"}, units...)...); err != nil {
		return fmt.Errorf("restarting the node agent (%s): %w", strings.Join(units, ", "), err)
	}
	return nil
}

// StageBoot checks the kernel arguments: one GRUB could not pass
// unchanged is refused with an error naming it. They are written to the
// boot partition only in the machine's turn, right before its reboot
// (node/boot Bootloader.SetKernelArgs), so a reboot that is not a turn
// boots with the arguments in effect.
func (o *OS) StageBoot(_ context.Context, cfg Config, _ []Change) error {
	if err := boot.ValidateKernelArgs(cfg.Settings.KernelArgs); err != nil {
		return fmt.Errorf("staging the kernel arguments: %w", err)
	}
	return nil
}

// Boot loads the kernel modules, writes the network configuration, mounts
// the data disks (making a filesystem only on a disk that has none),
// writes the banner, the Live settings and k3s's files (restarting the
// node agent when the kubelet's arguments were not those in effect: the
// power failed during a restart of k3s on trial), installs the pods'
// masquerade (podMasquerade), installs the kubernetes Service's route to
// the endpoint for while kube-proxy does not route it (serviceRoute) once
// the network is configured, and last gives the kubelet the cluster DNS
// address (kubeletNetwork), restarting it. Every step can run again: Boot
// runs at every boot and again after a failed boot apply.
func (o *OS) Boot(ctx context.Context, cfg Config) error {
	for _, m := range cfg.KernelModules {
		if !moduleName.MatchString(m.Name) {
			return fmt.Errorf("kernel module %q is not a module name (letters, digits, _ and -)", m.Name)
		}
		for _, p := range m.Parameters {
			if !moduleParam.MatchString(p) {
				return fmt.Errorf("kernel module %s: %q is not a key=value parameter whose key starts with a letter, a digit or _", m.Name, p)
			}
		}
		// "--" ends modprobe's options: nothing after it is read as one.
		if err := o.run(ctx, "modprobe", append([]string{"--", m.Name}, m.Parameters...)...); err != nil {
			return fmt.Errorf("loading kernel module %s: %w", m.Name, err)
		}
	}
	own := map[string]bool{}
	for _, p := range cfg.Ports {
		if err := o.port(p); err != nil {
			return err
		}
		name, _, _ := PortNetwork(p)
		own[name] = true
	}
	// The layer's copies of the ports (written at install) hold until
	// now; the Machine's ports replace them, and a port the Machine no
	// longer lists loses its layer copy too.
	stale, _ := filepath.Glob(filepath.Join(o.path(LayerNetworkDir), "50-liken-*.network"))
	for _, f := range stale {
		if own[filepath.Base(f)] {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the install's copy of a port the Machine no longer lists: %w", err)
		}
		own[filepath.Base(f)] = true
	}
	if len(own) > 0 {
		if err := o.run(ctx, "networkctl", "reload"); err != nil {
			return fmt.Errorf("reloading the network configuration: %w", err)
		}
	}
	for _, d := range cfg.Disks {
		if err := o.disk(ctx, d); err != nil {
			return err
		}
	}
	if err := o.write(BannerFile, []byte(cfg.Settings.Banner+"\n"), 0o644); err != nil {
		return err
	}
	if err := o.sysctls(cfg.Settings.Sysctls); err != nil {
		return err
	}
	if err := o.ntp(cfg.Settings.NTPServers); err != nil {
		return err
	}
	if _, err := o.dns(ctx, cfg.Settings.DNSServers); err != nil {
		return err
	}
	restart, err := o.agentFiles(cfg)
	if err != nil {
		return err
	}
	if restart {
		// The kubelet started with arguments other than those in effect:
		// the power failed while a restart of k3s with new ones was on
		// trial. It starts again with those in effect; its pods stay up.
		if err := o.run(ctx, "systemctl", append([]string{"restart"}, AgentUnits...)...); err != nil {
			return fmt.Errorf("restarting the node agent with the arguments in effect (%s): %w", strings.Join(AgentUnits, ", "), err)
		}
	}
	if err := o.podMasquerade(ctx, cfg.Network); err != nil {
		return err
	}
	if err := o.serviceRoute(ctx, cfg.Network); err != nil {
		return err
	}
	// Last: a kubelet that fails to restart leaves every route in place.
	return o.kubeletNetwork(ctx, cfg.Network)
}

// kubeletNetwork writes KubeletNetworkFile with the Cluster's clusterDNS
// (removes it when clusterDNS is unset) and, when that changed the file,
// restarts the kubelet, which reads it only when it starts: at a machine's
// first boot, at the first boot of a release that brought the file, and at
// the boot that applies a new clusterDNS. At every other boot the kubelet
// started with the file already there. The pods keep running.
func (o *OS) kubeletNetwork(ctx context.Context, n likenv1.NetworkSpec) error {
	dns, err := n.ClusterDNSOrDefault()
	if err != nil {
		return fmt.Errorf("the kubelet's cluster DNS: %w; correct the Cluster", err)
	}
	ip, err := netip.ParseAddr(dns)
	if err != nil {
		return fmt.Errorf("the kubelet's cluster DNS: spec.network.clusterDNS %q is not an IP address; correct the Cluster", n.ClusterDNS)
	}
	want := fmt.Appendf(nil, "# Written by liken-node at boot from the Cluster's spec.network.clusterDNS (or its default).\n"+
		"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDNS:\n- %s\n", ip)
	file := o.path(KubeletNetworkFile)
	old, err := os.ReadFile(file)
	had := err == nil
	if !had && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the kubelet's cluster DNS: %w", err)
	}
	if had == (want != nil) && bytes.Equal(old, want) {
		return nil
	}
	// put makes the file hold content, or not exist when content is nil.
	put := func(content []byte) error {
		if content == nil {
			if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		}
		return o.write(KubeletNetworkFile, content, 0o644)
	}
	if err := put(want); err != nil {
		return fmt.Errorf("the kubelet's cluster DNS: %w", err)
	}
	if err := o.run(ctx, "systemctl", "try-restart", "kubelet.service"); err != nil {
		// Put the old file back (none when there was none), so that the
		// retry restarts the kubelet.
		_ = put(old)
		return fmt.Errorf("restarting the kubelet for the cluster DNS address: %w", err)
	}
	klog.FromContext(ctx).Info("Restarted the kubelet for the Cluster's cluster DNS address", "clusterDNS", ip, "file", "/"+KubeletNetworkFile)
	return nil
}

// podMasquerade makes PodMasqueradeChain hold exactly its three rules,
// from the Cluster's pod range (spec.network.podCIDR or its default):
// return for a destination inside the range and for a packet from one of
// the machine's own addresses, masquerade the rest, and makes POSTROUTING
// jump to it once. ip6tables for an IPv6 range.
func (o *OS) podMasquerade(ctx context.Context, n likenv1.NetworkSpec) error {
	cidr := n.PodCIDROrDefault()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Errorf("the pods' masquerade: spec.network.podCIDR %q is not a CIDR; correct the Cluster", cidr)
	}
	tables := "iptables"
	if !p.Addr().Is4() {
		tables = "ip6tables"
	}
	rules := [][]string{
		{"!", "-s", p.Masked().String(), "-j", "RETURN"},
		{"-d", p.Masked().String(), "-j", "RETURN"},
		{"-m", "addrtype", "--src-type", "LOCAL", "-j", "RETURN"},
		{"-j", "MASQUERADE"},
	}
	if err := o.natChain(ctx, tables, PodMasqueradeChain, rules, "POSTROUTING"); err != nil {
		return fmt.Errorf("installing the pods' masquerade (traffic leaving %s): %w", p.Masked(), err)
	}
	return nil
}

// natChain makes the nat chain hold exactly rules, in order, and makes
// the chain from jump to it once. The chain is made when tables (iptables
// or ip6tables) cannot list it, then flushed and refilled; the jump is
// added only when -C does not find it. Every call waits for the xtables
// lock.
func (o *OS) natChain(ctx context.Context, tables, chain string, rules [][]string, from string) error {
	nat := func(args ...string) error {
		return o.run(ctx, tables, append([]string{"-w", "-t", "nat"}, args...)...)
	}
	// -S fails when the chain does not exist; -N would fail when it does.
	if nat("-S", chain) != nil {
		if err := nat("-N", chain); err != nil {
			return err
		}
	}
	if err := nat("-F", chain); err != nil {
		return err
	}
	for _, r := range rules {
		if err := nat(append([]string{"-A", chain}, r...)...); err != nil {
			return err
		}
	}
	if nat("-C", from, "-j", chain) == nil {
		return nil
	}
	return nat("-A", from, "-j", chain)
}

// serviceRoute makes ServiceTable hold exactly its two chains, each with
// one DNAT rule from the first service address's TCP port 443 to the
// endpoint's address and port (a name resolved now, to its first IPv4
// address). One nft command replaces the table in one transaction (made
// if missing, deleted, made again), so a failure leaves the table as it
// was and a second Boot leaves the same. IPv4 only.
func (o *OS) serviceRoute(ctx context.Context, n likenv1.NetworkSpec) error {
	cidr := n.ServiceCIDROrDefault()
	svc, err := likenv1.FirstServiceIP(cidr)
	if err != nil {
		return fmt.Errorf("the kubernetes Service route: spec.network.serviceCIDR %w", err)
	}
	if svc.To4() == nil {
		return fmt.Errorf("the kubernetes Service route: the service range %s is IPv6, and liken routes the kubernetes Service over IPv4 only; give the Cluster an IPv4 spec.network.serviceCIDR", cidr)
	}
	to, err := o.endpointAddr(ctx, n)
	if err != nil {
		return fmt.Errorf("the kubernetes Service route: %w", err)
	}
	addr, _ := netip.AddrFromSlice(svc.To4())
	if err := o.run(ctx, "nft", ServiceRuleset(addr, to)); err != nil {
		return fmt.Errorf("installing the kubernetes Service route (%s:443 → %s): %w", svc, to, err)
	}
	return nil
}

// ServiceRuleset is the nft script that replaces ServiceTable: the
// Service address svc's TCP port 443 to the endpoint to, in prerouting
// and output at ServicePriority.
func ServiceRuleset(svc netip.Addr, to netip.AddrPort) string {
	chain := func(name, hook string) string {
		return fmt.Sprintf("chain %s { type nat hook %s priority %d; policy accept; ip daddr %s tcp dport 443 dnat to %s; }; ", name, hook, ServicePriority, svc, to)
	}
	return fmt.Sprintf("table ip %[1]s; delete table ip %[1]s; table ip %[1]s { %s%s}", ServiceTable,
		chain("kubernetes-service-prerouting", "prerouting"), chain("kubernetes-service-output", "output"))
}

// endpointAddr is the IPv4 address and port of spec.network.endpoint
// (host:port or URL; an https URL without a port means 443): an IP
// literal as it is, a name resolved to its first IPv4 address.
func (o *OS) endpointAddr(ctx context.Context, n likenv1.NetworkSpec) (netip.AddrPort, error) {
	if n.Endpoint == "" {
		return netip.AddrPort{}, errors.New("the Cluster's spec.network.endpoint is empty; set it to the API's host:port or URL")
	}
	u, err := url.Parse(n.EndpointURL())
	if err != nil || u.Hostname() == "" {
		return netip.AddrPort{}, fmt.Errorf("endpoint %q is not host:port or a URL such as https://10.0.0.10:6443; correct the Cluster's spec.network.endpoint", n.Endpoint)
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil || port == 0 {
		return netip.AddrPort{}, fmt.Errorf("endpoint %q has no port between 1 and 65535; give one in the Cluster's spec.network.endpoint, such as https://10.0.0.10:6443", n.Endpoint)
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if a = a.Unmap(); !a.Is4() {
			return netip.AddrPort{}, fmt.Errorf("endpoint host %s is an IPv6 address, and liken routes the kubernetes Service over IPv4 only; give the Cluster's spec.network.endpoint an IPv4 address or a name with one", host)
		}
		return netip.AddrPortFrom(a, uint16(port)), nil
	}
	lookup := o.lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	addrs, err := lookup(ctx, "ip4", host)
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			return netip.AddrPortFrom(a, uint16(port)), nil
		}
	}
	if err == nil {
		err = errors.New("no A record")
	}
	return netip.AddrPort{}, fmt.Errorf("endpoint host %q resolves to no IPv4 address: %w; check the machine's DNS servers and the name, or give the endpoint as an IPv4 address (IPv6 is not supported)", host, err)
}

func (o *OS) port(p likenv1.Port) error {
	name, b, err := PortNetwork(p)
	if err != nil {
		return err
	}
	return o.write(filepath.Join(NetworkdDir, name), b, 0o644)
}

// PortNetwork renders a Machine's port as a systemd-networkd file: its
// name (50-liken-NAME.network, before the image's DHCP default) and its
// contents. liken-node writes it to NetworkdDir at every boot, and liken
// install writes it to the layer partition, whose copy the machine's
// setup puts in place before the network starts (LayerNetworkDir).
func PortNetwork(p likenv1.Port) (string, []byte, error) {
	if !interfaceName.MatchString(p.Name) {
		return "", nil, fmt.Errorf("port name %q is not an interface name (1 to 15 letters, digits, _, - and ., not starting with .)", p.Name)
	}
	var b bytes.Buffer
	b.WriteString("# Written by liken from the Machine's spec.ports.\n[Match]\n")
	if p.MAC != "" {
		if _, err := net.ParseMAC(p.MAC); err != nil {
			return "", nil, fmt.Errorf("port %s: MAC %q: %w", p.Name, p.MAC, err)
		}
		fmt.Fprintf(&b, "MACAddress=%s\n", p.MAC)
	} else {
		fmt.Fprintf(&b, "Name=%s\n", p.Name)
	}
	if p.MTU > 0 {
		fmt.Fprintf(&b, "\n[Link]\nMTUBytes=%d\n", p.MTU)
	}
	b.WriteString("\n[Network]\n")
	if p.DHCP {
		b.WriteString("DHCP=yes\n")
	}
	for _, a := range p.Addresses {
		if _, _, err := net.ParseCIDR(a); err != nil {
			return "", nil, fmt.Errorf("port %s: address %q is not in CIDR form (such as 10.0.0.11/24)", p.Name, a)
		}
		fmt.Fprintf(&b, "Address=%s\n", a)
	}
	if p.Gateway != "" {
		if net.ParseIP(p.Gateway) == nil {
			return "", nil, fmt.Errorf("port %s: gateway %q is not an IP address", p.Name, p.Gateway)
		}
		fmt.Fprintf(&b, "Gateway=%s\n", p.Gateway)
	}
	return "50-liken-" + p.Name + ".network", b.Bytes(), nil
}

func (o *OS) disk(ctx context.Context, d likenv1.Disk) error {
	mp := filepath.Clean(d.MountPoint)
	if !strings.HasPrefix(mp, "/var/") || strings.Contains(d.MountPoint, "..") {
		return fmt.Errorf("disk %s: mount point %q must be a folder under /var", d.Device, d.MountPoint)
	}
	fs := d.Filesystem
	if fs == "" {
		fs = "ext4"
	}
	if fs != "ext4" && fs != "xfs" {
		return fmt.Errorf("disk %s: filesystem %q is not ext4 or xfs", d.Device, fs)
	}
	if err := o.blockDevice(d.Device); err != nil {
		return err
	}
	if err := os.MkdirAll(o.path(mp), 0o755); err != nil {
		return err
	}
	// blkid exits 2 when the device holds no filesystem it knows.
	if err := o.run(ctx, "blkid", "-p", d.Device); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			return fmt.Errorf("disk %s: reading its filesystem: %w", d.Device, err)
		}
		if err := o.run(ctx, "mkfs."+fs, d.Device); err != nil {
			return fmt.Errorf("disk %s: making an %s filesystem: %w", d.Device, fs, err)
		}
	}
	if err := o.run(ctx, "mount", "-t", fs, d.Device, mp); err != nil {
		return fmt.Errorf("disk %s: mounting on %s: %w", d.Device, mp, err)
	}
	return nil
}

// Observe reads the block devices from /sys/block, the mounts from
// /proc/mounts, the network interfaces from /sys/class/net, the loaded
// modules from /proc/modules and the boot time from /proc/stat.
func (o *OS) Observe(_ context.Context, _ Config) (likenv1.ObservedState, error) {
	var st likenv1.ObservedState
	mounts := map[string]string{}
	if b, err := os.ReadFile(o.path("proc/mounts")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 {
				mounts[f[0]] = f[1]
			}
		}
	}
	if ents, err := os.ReadDir(o.path("sys/block")); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "loop") || strings.HasPrefix(e.Name(), "ram") {
				continue
			}
			d := likenv1.ObservedDisk{Device: "/dev/" + e.Name(), MountPoint: mounts["/dev/"+e.Name()]}
			if b, err := os.ReadFile(o.path(filepath.Join("sys/block", e.Name(), "size"))); err == nil {
				if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
					d.SizeBytes = n * 512
				}
			}
			st.Disks = append(st.Disks, d)
		}
	}
	if ents, err := os.ReadDir(o.path("sys/class/net")); err == nil {
		for _, e := range ents {
			if e.Name() == "lo" {
				continue
			}
			p := likenv1.ObservedPort{Name: e.Name()}
			if b, err := os.ReadFile(o.path(filepath.Join("sys/class/net", e.Name(), "address"))); err == nil {
				p.MAC = strings.TrimSpace(string(b))
			}
			if b, err := os.ReadFile(o.path(filepath.Join("sys/class/net", e.Name(), "operstate"))); err == nil {
				p.Up = strings.TrimSpace(string(b)) == "up"
			}
			if o.Root == "/" || o.Root == "" {
				if ifc, err := net.InterfaceByName(e.Name()); err == nil {
					if addrs, err := ifc.Addrs(); err == nil {
						for _, a := range addrs {
							p.Addresses = append(p.Addresses, a.String())
						}
					}
				}
			}
			st.Ports = append(st.Ports, p)
		}
	}
	if f, err := os.Open(o.path(ModulesProcFile)); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fl := strings.Fields(sc.Text()); len(fl) > 0 {
				st.Modules = append(st.Modules, fl[0])
			}
		}
		f.Close()
		sort.Strings(st.Modules)
	}
	if b, err := os.ReadFile(o.path(bootStatProcFile)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "btime "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					t := metav1.NewTime(time.Unix(n, 0).UTC())
					st.LastBoot = &t
				}
			}
		}
	}
	return st, nil
}

// blockDevice refuses a disk device that leaves /dev or is not a block
// device, so mkfs never formats a regular file or a character device.
func (o *OS) blockDevice(device string) error {
	if clean := filepath.Clean(device); clean != device || !strings.HasPrefix(clean, "/dev/") {
		return fmt.Errorf("disk %s: the device must be a clean path under /dev, such as /dev/disk/by-id/...", device)
	}
	stat := o.stat
	if stat == nil {
		stat = os.Stat
	}
	// os.Stat follows the /dev/disk/by-* links to the device itself.
	fi, err := stat(o.path(device))
	if err != nil {
		return fmt.Errorf("disk %s: %w (is the disk attached?)", device, err)
	}
	if fi.Mode()&fs.ModeDevice == 0 || fi.Mode()&fs.ModeCharDevice != 0 {
		return fmt.Errorf("disk %s is not a block device (it is %s); liken formats and mounts only block devices", device, fi.Mode().Type())
	}
	return nil
}
