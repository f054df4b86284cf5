package layer

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/controlplane"
)

// reachURL is one of a leader's reach URLs: the annotation that sets it and
// the port its default takes.
type reachURL struct {
	annotation string
	port       int
}

// reachURLs are a leader's apiserver, etcdClient and etcdPeer URLs, in
// controlplane.Leader's order.
var reachURLs = []reachURL{
	{v1alpha1.AnnotationAPIServerURL, controlplane.APIServerPort},
	{v1alpha1.AnnotationEtcdClientURL, controlplane.EtcdClientPort},
	{v1alpha1.AnnotationEtcdPeerURL, controlplane.EtcdPeerPort},
}

// soleLeaderHost is where a Cluster's only Leader without a static address
// or annotations is reached: by itself alone.
const soleLeaderHost = "127.0.0.1"

// ControlPlaneConfig is the named Leader's control plane configuration,
// which liken install writes as leader/config.yaml on its disk: see
// LeaderConfig. It fails for a Worker or a machine the layer lacks.
func (l *Layer) ControlPlaneConfig(machine string) (controlplane.Config, error) {
	m := l.Machine(machine)
	if m == nil {
		return controlplane.Config{}, fmt.Errorf("the layer has no Machine %q", machine)
	}
	if m.Spec.Role != v1alpha1.RoleLeader {
		return controlplane.Config{}, fmt.Errorf("Machine %q is a %s: only a Leader runs the control plane", machine, m.Spec.Role)
	}
	ms := make([]*v1alpha1.Machine, 0, len(l.Machines))
	for _, d := range l.Machines {
		ms = append(ms, d.Machine)
	}
	cfg, err := LeaderConfig(l.Cluster.Cluster, ms, machine)
	cfg.SharedJoinToken = l.SharedJoinToken
	return cfg, err
}

// LeaderConfig derives a leader's control plane configuration from its
// Cluster and the Cluster's Machines: the machine's name; the endpoint
// (NetworkSpec.EndpointURL); the service and pod ranges
// (spec.network.serviceCIDR and podCIDR, or their defaults); the first
// Leader by name, which bootstraps a new datastore; and every Leader with
// its reach URLs. Each reach URL is the Leader's annotation
// (v1alpha1.AnnotationAPIServerURL, AnnotationEtcdClientURL,
// AnnotationEtcdPeerURL), or else https on its first static address
// (spec.ports[].addresses, without the prefix length) with port 6443, 2379
// or 2380. A Cluster's only Leader with neither is reached on 127.0.0.1:
// it talks only to itself. With two or more Leaders, one with neither is an
// error naming it and what to add. The result passes Validate, or the
// error is Validate's.
func LeaderConfig(cluster *v1alpha1.Cluster, machines []*v1alpha1.Machine, machine string) (controlplane.Config, error) {
	cfg, missing := deriveConfig(cluster, machines, machine)
	if len(missing) > 0 {
		var errs []error
		for _, m := range missing {
			errs = append(errs, fmt.Errorf("Machine %s: %s", m.machine, m.problem(len(cfg.Leaders))))
		}
		return controlplane.Config{}, errors.Join(errs...)
	}
	if err := cfg.Validate(); err != nil {
		return controlplane.Config{}, fmt.Errorf("%s: %w", configContext(cluster.Name, cfg), err)
	}
	return cfg, nil
}

// unreachable is a Leader that has neither a static address nor some of
// its annotations, in a Cluster of several Leaders.
type unreachable struct {
	machine string
	lacks   []string // the annotations it lacks
}

func (u unreachable) problem(leaders int) string {
	return fmt.Sprintf("is one of %d Leaders but has no static address (spec.ports[].addresses) and lacks the annotations %s: the other leaders could not reach its control plane; give it a static address, or set those annotations, each to an https URL with a host and a port (such as https://10.0.0.11:%d for %s)",
		leaders, strings.Join(u.lacks, ", "), portOf(u.lacks[0]), u.lacks[0])
}

func portOf(annotation string) int {
	for _, r := range reachURLs {
		if r.annotation == annotation {
			return r.port
		}
	}
	return 0
}

// deriveConfig builds the configuration without validating it, and lists
// the Leaders it could not place.
func deriveConfig(cluster *v1alpha1.Cluster, machines []*v1alpha1.Machine, machine string) (controlplane.Config, []unreachable) {
	var leaders []*v1alpha1.Machine
	for _, m := range machines {
		if m.Spec.Role == v1alpha1.RoleLeader {
			leaders = append(leaders, m)
		}
	}
	slices.SortFunc(leaders, func(a, b *v1alpha1.Machine) int { return strings.Compare(a.Name, b.Name) })
	cfg := controlplane.Config{
		Machine:     machine,
		Endpoint:    cluster.Spec.Network.EndpointURL(),
		ServiceCIDR: cluster.Spec.Network.ServiceCIDROrDefault(),
		PodCIDR:     cluster.Spec.Network.PodCIDROrDefault(),
	}
	// An error leaves it empty, for Validate to name.
	cfg.ClusterDNS, _ = cluster.Spec.Network.ClusterDNSOrDefault()
	if len(leaders) > 0 {
		cfg.FirstLeader = leaders[0].Name
	}
	var missing []unreachable
	for _, m := range leaders {
		host := firstStaticAddress(m)
		if host == "" && len(leaders) == 1 {
			host = soleLeaderHost
		}
		urls := make([]string, len(reachURLs))
		var lacks []string
		for i, r := range reachURLs {
			switch {
			case m.Annotations[r.annotation] != "":
				urls[i] = m.Annotations[r.annotation]
			case host != "":
				urls[i] = "https://" + net.JoinHostPort(host, strconv.Itoa(r.port))
			default:
				lacks = append(lacks, r.annotation)
			}
		}
		if len(lacks) > 0 {
			missing = append(missing, unreachable{machine: m.Name, lacks: lacks})
		}
		cfg.Leaders = append(cfg.Leaders, controlplane.Leader{Name: m.Name, APIServer: urls[0], EtcdClient: urls[1], EtcdPeer: urls[2]})
	}
	return cfg, missing
}

// firstStaticAddress is the address of the Machine's first static address
// (spec.ports[].addresses, in CIDR form), or "" when it has none.
func firstStaticAddress(m *v1alpha1.Machine) string {
	for _, p := range m.Spec.Ports {
		for _, a := range p.Addresses {
			if pfx, err := netip.ParsePrefix(a); err == nil {
				return pfx.Addr().String()
			}
			if addr, err := netip.ParseAddr(a); err == nil {
				return addr.String()
			}
		}
	}
	return ""
}

// configContext says, for an error of Validate, where the configuration
// comes from and which Machine each leaders[i] is.
func configContext(cluster string, cfg controlplane.Config) string {
	var names []string
	for i, l := range cfg.Leaders {
		names = append(names, fmt.Sprintf("leaders[%d] is %s", i, l.Name))
	}
	return fmt.Sprintf("the control plane's configuration derived from Cluster %s and its Leaders is invalid (%s; each reach URL is the Leader's annotation %s, %s or %s, or else its first static address)",
		cluster, strings.Join(names, ", "), v1alpha1.AnnotationAPIServerURL, v1alpha1.AnnotationEtcdClientURL, v1alpha1.AnnotationEtcdPeerURL)
}

// checkControlPlane checks that every Leader of a fleet can be reached and
// that the configuration liken install would write on a Leader passes
// Validate. Problems with one Machine are *DocumentError.
func checkControlPlane(cluster *Document, machines []*Document) []error {
	ms := make([]*v1alpha1.Machine, 0, len(machines))
	for _, d := range machines {
		ms = append(ms, d.Machine)
	}
	cfg, missing := deriveConfig(cluster.Cluster, ms, "")
	if len(cfg.Leaders) == 0 {
		return nil
	}
	if len(missing) > 0 {
		var errs []error
		for _, u := range missing {
			for _, d := range machines {
				if d.Name == u.machine {
					errs = append(errs, &DocumentError{Source: d.Source + ": Machine " + d.Name, Err: errors.New(u.problem(len(cfg.Leaders)))})
				}
			}
		}
		return errs
	}
	cfg.Machine = cfg.FirstLeader
	if err := cfg.Validate(); err != nil {
		return []error{fmt.Errorf("%s: %s: %w", cluster.Source, configContext(cluster.Name, cfg), err)}
	}
	return nil
}
