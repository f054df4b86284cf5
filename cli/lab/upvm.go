package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/internal/pki"
	"liken.sh/liken/internal/qemu"
	nodecp "liken.sh/liken/node/controlplane"
)

// The self-hosted VM lab (liken lab up --vm): the leaders' virtual
// machines run the control plane from liken's image (etcd, the API server,
// the controller manager, the scheduler) and cluster-operator runs as the
// Deployment of manifests/. This computer runs only QEMU, the release
// channel and the API endpoint, a loopback port forwarded to a ready
// leader (liken lab serve-endpoint).

// leaderPorts are where a leader's API server, etcd client and etcd peer
// are reached: in the VM lab, the loopback ports QEMU forwards to them.
type leaderPorts struct{ api, etcdClient, etcdPeer int }

// forwards is the leader's hostfwd map: loopback port to the leader's port.
func (p leaderPorts) forwards() map[int]int {
	return map[int]int{p.api: nodecp.APIServerPort, p.etcdClient: nodecp.EtcdClientPort, p.etcdPeer: nodecp.EtcdPeerPort}
}

// freeLoopbackPorts returns n distinct ports of the loopback that are free
// now.
func freeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	var open []net.Listener
	defer func() {
		for _, l := range open {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		open = append(open, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// vmTimeout is the least time liken lab up --vm waits for its Cluster:
// emulated leaders take minutes to bring their datastore and API up
// (docs/benchmarks.md).
const vmTimeout = 30 * time.Minute

func upVM(ctx context.Context, o upOptions, dir string, bins binaries, graceArgs []string, step func(string, ...any), out, log io.Writer) (err error) {
	o.timeout = max(o.timeout, vmTimeout)
	deadline := time.Now().Add(o.timeout)
	imageDir, err := osImageDir(log)
	if err != nil {
		return err
	}
	if _, err := vmTools(log); err != nil {
		return err
	}
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: o.name})
	if err != nil {
		return err
	}
	st := &State{Name: o.name, Dir: dir, Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), ChannelDir: filepath.Join(dir, "channel"), VM: true, ImageDir: imageDir}
	defer func() {
		if err != nil {
			stopAll(st)
			err = fmt.Errorf("%w\nThe lab's logs are in %s (each machine's console is its machine.log); liken lab down --name %s removes them", err, dir, o.name)
		} else {
			err = st.Save()
		}
	}()

	srv, version, digest, err := startServers(ctx, st, bins)
	if err != nil {
		return err
	}
	step("release channel at %s with release %s", st.Channel, version)

	// Three forwarded ports per leader, and the endpoint in front of their
	// API servers.
	names := machineNames(o.machines)
	ports, err := freeLoopbackPorts(3 * o.leaders)
	if err != nil {
		return err
	}
	leaders := map[string]leaderPorts{}
	reach := map[string]string{}
	var backends []string
	for i, n := range names[:o.leaders] {
		p := leaderPorts{ports[3*i], ports[3*i+1], ports[3*i+2]}
		leaders[n] = p
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", p.api))
		if o.leaders > 1 {
			// A sole leader talks only to itself; several reach one
			// another through this computer.
			reach[n] = reachAnnotations(qemu.HostAddress, p)
		}
	}
	caFile := filepath.Join(dir, "server-ca.crt")
	if err := os.WriteFile(caFile, id.Files["server-ca.crt"], 0o644); err != nil {
		return err
	}
	epPort, err := startEndpoint(ctx, st, bins, backends, caFile)
	if err != nil {
		return err
	}
	step("API endpoint at %s, forwarding to the leaders' API servers at %s", st.Endpoint, strings.Join(backends, ", "))

	// The fleet's documents and its deployment layer; the machines reach
	// the endpoint and the channel through QEMU's address of this computer.
	endpoint := fmt.Sprintf("%s:%d", qemu.HostAddress, epPort)
	source := fmt.Sprintf("https://%s:%d", ChannelName, srv.channel)
	_, layerFile, _, err := packLayer(dir, id, fleetDocuments(o, endpoint, source, version, digest, reach, srv.settings(st.ServersAddress())))
	if err != nil {
		return err
	}
	if err := writeAdminKubeconfig(st.Kubeconfig, id, st.Endpoint); err != nil {
		return err
	}
	for i, n := range names {
		m := MachineInfo{Name: n, Role: roleOf(i, o.leaders), Dir: filepath.Join(dir, "machines", n)}
		if p, ok := leaders[n]; ok {
			m.Forwards = p.forwards()
		}
		step("writing %s's disk with liken install (%s)", n, m.Role)
		if err := installVM(ctx, m, st.ChannelDir, version, layerFile); err != nil {
			return fmt.Errorf("installing machine %s: %w", n, err)
		}
		st.Machines = append(st.Machines, m)
	}
	step("%d disks written by liken install, slot A holding %s; the leaders' disks hold their control plane", o.machines, version)
	if err := startSegment(ctx, st, bins); err != nil {
		return err
	}
	step("the machines' network segment: %s.0/24, %s to %s, through the lab's switch (%s)", segmentPrefix, segmentAddress(0), segmentAddress(o.machines-1), segmentSocket(st, switchName))
	for i := range st.Machines {
		p, err := startVM(st, &st.Machines[i])
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, *p)
	}
	if err := st.Save(); err != nil {
		return err
	}
	step("%d virtual machines powered on; each leader has %d CPUs and %d MiB", o.machines, LeaderHardware().CPUs, LeaderHardware().MemoryMiB)

	return finishUp(ctx, st, o, id, version, graceArgs, deadline, step, out, log)
}

// labServers are the ports of a real-image lab's servers, which the
// machines reach at one address, and the channel's CA.
type labServers struct {
	caPEM                    []byte
	channel, registry, names int
}

// startServers starts the servers of a lab whose machines run liken's
// image: the channel over https by name, as a fleet reads it (the lab's
// name server answers its name, and the Cluster trusts the lab's own CA,
// settings.caBundle), the registry and the name server, which answers the
// lab's names with st.ServersAddress(), where the machines reach this
// computer. It publishes the first release.
func startServers(ctx context.Context, st *State, bins binaries) (srv labServers, version, digest string, err error) {
	host := st.ServersAddress()
	var certFile, keyFile string
	if srv.caPEM, certFile, keyFile, err = channelCertificate(st.Dir); err != nil {
		return srv, "", "", err
	}
	if srv.channel, err = startChannel(ctx, st, bins, certFile, keyFile); err != nil {
		return srv, "", "", err
	}
	if srv.registry, err = startRegistry(ctx, st, bins); err != nil {
		return srv, "", "", err
	}
	if srv.names, err = startNames(ctx, st, bins, ChannelName+"="+host, RegistryName+"="+host); err != nil {
		return srv, "", "", err
	}
	version, digest, err = publish(st, FaultNone)
	return srv, version, digest, err
}

// finishUp brings a real-image lab's fleet up once its machines are
// powered on: it waits for the leaders' API and for what the first
// leader creates from its layer (adoptFleet), and waits for the Cluster to
// read Ready.
func finishUp(ctx context.Context, st *State, o upOptions, id *layer.Identity, version string, graceArgs []string, deadline time.Time, step func(string, ...any), out, log io.Writer) error {
	if err := waitAPIReady(ctx, st, id.Files["server-ca.crt"], deadline, step); err != nil {
		return err
	}
	step("the leaders' API is ready at %s", st.Endpoint)
	if err := adoptFleet(ctx, st, o, graceArgs, deadline); err != nil {
		return err
	}
	step("the first leader created liken's resources, Cluster %s and its %d Machines from its layer; cluster-operator's %d copies are ready", o.name, o.machines, o.operators)
	if len(graceArgs) > 0 {
		step("cluster-operator runs with %s (from %s)", graceArgs[0], startupGraceEnv)
	}
	if err := waitClusterReady(ctx, st, time.Until(deadline)); err != nil {
		return err
	}
	step("Cluster %s is Ready on %s", o.name, version)
	printUp(st, out, log)
	return nil
}

// startEndpoint starts the lab's API endpoint (liken lab serve-endpoint)
// on a free loopback port, records it in st, and returns the port.
func startEndpoint(ctx context.Context, st *State, bins binaries, backends []string, caFile string, extra ...string) (int, error) {
	portFile := filepath.Join(st.Dir, "endpoint.port")
	p, err := controlplane.StartProcess(bins.liken, append([]string{"lab", "serve-endpoint", "--backends", strings.Join(backends, ","), "--ca", caFile, "--port-file", portFile}, extra...),
		filepath.Join(st.Dir, "endpoint.log"), true)
	if err != nil {
		return 0, err
	}
	p.Kind, p.Name = KindEndpoint, "endpoint"
	st.Processes = append(st.Processes, *p)
	port, err := waitPort(ctx, "the API endpoint", portFile, p.PID)
	if err != nil {
		return 0, err
	}
	st.Endpoint = fmt.Sprintf("https://127.0.0.1:%d", port)
	return port, nil
}

// labAdmin is the name in the VM lab's admin certificate.
const labAdmin = "liken-lab-admin"

// writeAdminKubeconfig writes the lab's administrator's kubeconfig: a
// certificate of the cluster's client CA in system:masters, valid for a
// year, for the API at server.
func writeAdminKubeconfig(path string, id *layer.Identity, server string) error {
	k, err := layer.AdminKubeconfig(id, layer.AdminRequest{Server: server, User: labAdmin, Groups: []string{layer.AdminGroup}, Now: time.Now(), Validity: 365 * 24 * time.Hour})
	if err != nil {
		return fmt.Errorf("the lab's admin kubeconfig: %w", err)
	}
	return pki.WriteKubeconfig(path, k)
}

// waitAPIReady waits until the API answers /readyz through the lab's
// endpoint, saying every minute what it waits for.
func waitAPIReady(ctx context.Context, st *State, caPEM []byte, deadline time.Time, step func(string, ...any)) error {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	last, said := "no answer yet", time.Now()
	for time.Now().Before(deadline) {
		resp, err := client.Get(st.Endpoint + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return nil
			case http.StatusUnauthorized, http.StatusForbidden:
				// Anyone may read /readyz once the API server made its
				// default roles, one of its last start steps.
				last = "the API server answers but has not made its default roles yet"
			default:
				last = fmt.Sprintf("%s: %s", resp.Status, failedChecks(string(b)))
			}
		} else {
			last = err.Error()
		}
		if time.Since(said) >= time.Minute {
			step("waiting for the leaders' etcd and API server (an emulated leader takes 3 to 8 minutes): %s", last)
			said = time.Now()
		}
		if err := exitedProcess(st); err != nil {
			return err
		}
		if err := sleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	return fmt.Errorf("the leaders' API at %s did not read ready by the deadline (last: %s); see the leaders' consoles (journalctl -u etcd -u kube-apiserver is in them) in %s", st.Endpoint, last, filepath.Join(st.Dir, "machines"))
}

// failedChecks is the checks /readyz?verbose names as failed, or its
// first line.
func failedChecks(body string) string {
	var failed []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, strings.Fields(strings.TrimPrefix(l, "[-]"))[0])
		}
	}
	if len(failed) > 0 {
		return "failed checks " + strings.Join(failed, ", ")
	}
	first, _, _ := strings.Cut(strings.TrimSpace(body), "\n")
	return first
}

// exitedProcess names the first lab process that should run and does not
// (State.Exited), for a lab that is starting.
func exitedProcess(st *State) error {
	if gone := st.Exited(); len(gone) > 0 {
		p := gone[0]
		return fmt.Errorf("%s %s (pid %d) exited; see %s", p.Kind, p.Name, p.PID, p.Log)
	}
	return nil
}

// adoptFleet readies what the first leader's control-plane init created
// from its layer (liken's manifests, cluster-operator's Deployment, the
// Cluster and the Machines: nothing is applied by hand, as on a fleet
// installed from its layers): it waits for liken's CRDs, then scales
// cluster-operator to --operators, gives it the startup grace of
// $LIKEN_LAB_STARTUP_GRACE and waits for its copies to be ready.
func adoptFleet(ctx context.Context, st *State, o upOptions, graceArgs []string, deadline time.Time) error {
	kubectl := func(args ...string) error {
		_, err := controlplane.Kubectl(ctx, st.Kubeconfig, args...)
		return err
	}
	retry := func(what string, args ...string) error {
		for {
			err := kubectl(args...)
			if err == nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s (the first leader's liken-control-plane-init creates it from the layer; its log: liken logs %s -u liken-control-plane-init): %w", what, machineNames(1)[0], err)
			}
			if err := sleep(ctx, 2*time.Second); err != nil {
				return err
			}
		}
	}
	if err := retry("waiting for liken's CRDs", "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh"); err != nil {
		return err
	}
	if err := retry("waiting for Cluster "+o.name, "get", "cluster", o.name); err != nil {
		return err
	}
	deploy := []string{"-n", "liken-system", "deployment/cluster-operator"}
	if err := retry("scaling cluster-operator", append([]string{"scale", "--replicas", strconv.Itoa(o.operators)}, deploy...)...); err != nil {
		return err
	}
	for _, a := range graceArgs {
		patch := fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":%q}]`, a)
		if err := retry("setting cluster-operator's "+a, append([]string{"patch", "--type", "json", "-p", patch}, deploy...)...); err != nil {
			return err
		}
	}
	// Lab up returns once cluster-operator's copies run with what was set
	// here: a rollout still under way when the user's first upgrade starts
	// would leave fewer copies than the Deployment's disruption budget
	// expects.
	return retry("waiting for cluster-operator's "+strconv.Itoa(o.operators)+" copies to be ready", append([]string{"rollout", "status", "--timeout", "60s"}, deploy...)...)
}

// channelCertificate makes the lab's channel CA and the channel's
// certificate for ChannelName (and 127.0.0.1, for this computer), written
// in dir, and returns the CA's certificate and the files' paths.
func channelCertificate(dir string) (caPEM []byte, certFile, keyFile string, err error) {
	now := time.Now()
	ca, err := pki.NewCA("liken lab channel CA", now, 365*24*time.Hour)
	if err != nil {
		return nil, "", "", err
	}
	leaf, err := ca.Issue(pki.Request{CommonName: ChannelName, DNSNames: []string{ChannelName}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		Usage: pki.ServerAuth, Now: now, Validity: 365 * 24 * time.Hour})
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "channel.crt"), filepath.Join(dir, "channel.key")
	if err := leaf.Write(certFile, keyFile); err != nil {
		return nil, "", "", err
	}
	return ca.CertPEM(), certFile, keyFile, os.WriteFile(filepath.Join(dir, "channel-ca.crt"), ca.CertPEM(), 0o644)
}

// startNames starts the lab's name server with the given NAME=ADDRESS
// pairs and returns its loopback UDP port.
func startNames(ctx context.Context, st *State, bins binaries, pairs ...string) (int, error) {
	portFile := filepath.Join(st.Dir, "dns.port")
	args := append([]string{"lab", "serve-dns", "--port-file", portFile}, serverArgs(st)...)
	for _, p := range pairs {
		args = append(args, "--name", p)
	}
	p, err := controlplane.StartProcess(bins.liken, args, filepath.Join(st.Dir, "dns.log"), true)
	if err != nil {
		return 0, err
	}
	p.Kind, p.Name = KindNames, "dns"
	st.Processes = append(st.Processes, *p)
	return waitPort(ctx, "the lab's name server", portFile, p.PID)
}

// startRegistry starts the lab's image registry, serving the folder
// registry of the lab, records it in st and returns its loopback port.
func startRegistry(ctx context.Context, st *State, bins binaries) (int, error) {
	portFile := filepath.Join(st.Dir, "registry.port")
	st.RegistryDir = filepath.Join(st.Dir, "registry")
	p, err := controlplane.StartProcess(bins.liken, append([]string{"lab", "serve-registry", "--dir", st.RegistryDir, "--port-file", portFile}, serverArgs(st)...),
		filepath.Join(st.Dir, "registry.log"), true)
	if err != nil {
		return 0, err
	}
	p.Kind, p.Name = KindRegistry, "registry"
	st.Processes = append(st.Processes, *p)
	port, err := waitPort(ctx, "the lab's registry", portFile, p.PID)
	if err != nil {
		return 0, err
	}
	st.Registry = fmt.Sprintf("%s:%d", RegistryName, port)
	return port, nil
}

// settings is a real-image lab's Cluster spec.settings block: the lab's
// name server and registry, which the machines reach at host (QEMU's
// address of this computer, or the segment's gateway), the registry over
// plain http as a mirror of itself, and the lab's channel CA.
func (srv labServers) settings(host string) string {
	dnsPort, registryPort, caPEM := srv.names, srv.registry, srv.caPEM
	var b strings.Builder
	fmt.Fprintf(&b, "  settings:\n    dnsServers: [\"%s:%d\"]\n", host, dnsPort)
	fmt.Fprintf(&b, "    registryMirrors:\n    - registry: \"%[1]s:%[2]d\"\n      endpoints: [\"http://%[1]s:%[2]d\"]\n", RegistryName, registryPort)
	b.WriteString("    caBundle: |\n")
	for _, l := range strings.Split(strings.TrimSpace(string(caPEM)), "\n") {
		b.WriteString("      " + l + "\n")
	}
	return b.String()
}
