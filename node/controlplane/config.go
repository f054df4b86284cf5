package controlplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Config is a leader's leader/config.yaml, which liken install writes on a
// Leader's layer partition: this machine, the Cluster's endpoint and
// service range, and how every leader is reached. A machine is a leader
// exactly when the file exists.
type Config struct {
	// Machine is this machine's name, one of Leaders.
	Machine string `json:"machine"`
	// Endpoint is the Cluster's API endpoint (spec.network.endpoint), an
	// https URL such as https://10.0.2.2:6443.
	Endpoint string `json:"endpoint"`
	// ServiceCIDR is the Cluster's service range, such as 10.96.0.0/16.
	ServiceCIDR string `json:"serviceCIDR"`
	// PodCIDR is the Cluster's pod range, such as 10.244.0.0/16, out of
	// which the controller manager gives each Node its range. Empty (a
	// configuration written before liken gave Nodes ranges) is
	// v1alpha1.DefaultPodCIDR.
	PodCIDR string `json:"podCIDR,omitempty"`
	// ClusterDNS is the address of the cluster DNS's Service (the Cluster's
	// spec.network.clusterDNS), inside ServiceCIDR. Empty (a configuration
	// written before liken ran a cluster DNS) is ServiceCIDR's tenth
	// address.
	ClusterDNS string `json:"clusterDNS,omitempty"`
	// FirstLeader names the leader that bootstraps a new datastore: the
	// first Leader by name.
	FirstLeader string `json:"firstLeader"`
	// Leaders are every leader of the Cluster, this machine included.
	Leaders []Leader `json:"leaders"`
	// SharedJoinToken is true for a fleet that opted in to one join token
	// for every machine (liken layer pack --shared-join-token): control-plane
	// init makes the identity's token a token of the fleet. Otherwise each
	// worker joins with its own (JoinTokensFile) and the identity's token
	// joins nothing.
	SharedJoinToken bool `json:"sharedJoinToken,omitempty"`
}

// Leader is how the others reach one leader's control plane. Every URL is
// https with a host and a port.
type Leader struct {
	// Name is the leader's Machine name.
	Name string `json:"name"`
	// APIServer is its API server's URL (port 6443 on the machine).
	APIServer string `json:"apiserver"`
	// EtcdClient is its etcd member's client URL (port 2379 on the
	// machine).
	EtcdClient string `json:"etcdClient"`
	// EtcdPeer is its etcd member's peer URL (port 2380 on the machine).
	EtcdPeer string `json:"etcdPeer"`
}

// Load reads and validates a config.yaml. Unknown fields are errors, so a
// misspelt field never passes for a missing one.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading the control plane's configuration: %w", err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate reports every field that is missing or wrong, each error naming
// the field.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if err := checkURL(c.Endpoint); err != nil {
		add("endpoint", "%v", err)
	}
	if c.ServiceCIDR == "" {
		add("serviceCIDR", "missing; give the Cluster's service range, such as 10.96.0.0/16")
	} else if _, err := c.FirstServiceIP(); err != nil {
		add("serviceCIDR", "%v", err)
	}
	if _, err := likenv1.NodePodCIDRPrefix(c.PodCIDROrDefault()); err != nil {
		add("podCIDR", "%v", err)
	}
	if c.ServiceCIDR != "" {
		if dns, err := c.ClusterDNSOrDefault(); err != nil {
			add("clusterDNS", "%v", err)
		} else if ip, err := netip.ParseAddr(dns); err != nil {
			add("clusterDNS", "%q is not an IP address such as 10.96.0.10", dns)
		} else if p, err := netip.ParsePrefix(c.ServiceCIDR); err == nil && !p.Contains(ip) {
			add("clusterDNS", "%s is not inside serviceCIDR %s: the cluster DNS is a Service, whose address comes from the service range", dns, c.ServiceCIDR)
		}
	}
	if len(c.Leaders) == 0 {
		add("leaders", "none; list every leader with its reach URLs")
	}
	names := map[string]int{}
	urls := map[string]string{} // host:port -> field that uses it
	for i, l := range c.Leaders {
		field := fmt.Sprintf("leaders[%d]", i)
		switch {
		case l.Name == "":
			add(field+".name", "missing")
		case len(validation.IsDNS1123Subdomain(l.Name)) > 0:
			add(field+".name", "%q is not a Machine name: %s", l.Name, strings.Join(validation.IsDNS1123Subdomain(l.Name), "; "))
		default:
			if j, dup := names[l.Name]; dup {
				add(field+".name", "%q is also leaders[%d]'s name; every leader appears once", l.Name, j)
			} else {
				names[l.Name] = i
			}
		}
		for _, u := range []struct{ name, value string }{{"apiserver", l.APIServer}, {"etcdClient", l.EtcdClient}, {"etcdPeer", l.EtcdPeer}} {
			f := field + "." + u.name
			if err := checkURL(u.value); err != nil {
				add(f, "%v", err)
				continue
			}
			pu, _ := url.Parse(u.value)
			key := strings.ToLower(pu.Host)
			if other, dup := urls[key]; dup {
				add(f, "%s is also %s; every reach URL needs a host and port of its own", pu.Host, other)
			} else {
				urls[key] = f
			}
		}
	}
	if c.Machine == "" {
		add("machine", "missing; give this machine's name")
	} else if _, ok := names[c.Machine]; !ok {
		add("machine", "%q is not among the leaders; a machine runs the control plane only as a leader", c.Machine)
	}
	if c.FirstLeader == "" {
		add("firstLeader", "missing; give the first leader by name")
	} else if _, ok := names[c.FirstLeader]; !ok {
		add("firstLeader", "%q is not among the leaders", c.FirstLeader)
	}
	return errors.Join(errs...)
}

// checkURL checks a reach URL or the endpoint: https, a host and a port,
// nothing else (etcd takes no path).
func checkURL(s string) error {
	if s == "" {
		return errors.New("missing; give an https URL with a host and a port, such as https://10.0.0.1:6443")
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", s, err)
	}
	switch {
	case u.Scheme != "https":
		return fmt.Errorf("%q is not https; the control plane speaks only TLS", s)
	case u.Hostname() == "":
		return fmt.Errorf("%q has no host", s)
	case u.Port() == "":
		return fmt.Errorf("%q has no port; give it, such as :6443", s)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%q has more than a scheme, a host and a port", s)
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %s is not between 1 and 65535", s, u.Port())
	}
	return nil
}

// Self is this machine's entry in Leaders. The error says Machine is not
// among them (Validate refuses such a config).
func (c Config) Self() (Leader, error) {
	for _, l := range c.Leaders {
		if l.Name == c.Machine {
			return l, nil
		}
	}
	return Leader{}, fmt.Errorf("machine %q is not among the leaders of the control plane's configuration", c.Machine)
}

// FirstServiceIP is the first address of ServiceCIDR, which the kubernetes
// Service takes: 10.96.0.1 for 10.96.0.0/16 (v1alpha1.FirstServiceIP).
func (c Config) FirstServiceIP() (net.IP, error) {
	return likenv1.FirstServiceIP(c.ServiceCIDR)
}

// ClusterDNSOrDefault is ClusterDNS, or ServiceCIDR's tenth address when
// it is empty.
func (c Config) ClusterDNSOrDefault() (string, error) {
	return (&likenv1.NetworkSpec{ServiceCIDR: c.ServiceCIDR, ClusterDNS: c.ClusterDNS}).ClusterDNSOrDefault()
}

// PodCIDROrDefault is PodCIDR, or v1alpha1.DefaultPodCIDR when it is empty.
func (c Config) PodCIDROrDefault() string {
	return (&likenv1.NetworkSpec{PodCIDR: c.PodCIDR}).PodCIDROrDefault()
}
