// Package changes knows the disruption class of every declared field, diffs
// what a machine applied against what its Machine and Cluster declare, and
// applies each change with the smallest disruption it needs.
package changes

import (
	"bytes"
	"encoding/json"
	"sort"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Field paths as they appear in status.pending and in the reference docs.
const (
	FieldRole          = "spec.role"
	FieldRebootPolicy  = "spec.rebootPolicy"
	FieldDisks         = "spec.disks"
	FieldPorts         = "spec.ports"
	FieldKernelModules = "spec.kernelModules"

	FieldVersion = "cluster.spec.version"

	FieldEndpoint    = "cluster.spec.network.endpoint"
	FieldPodCIDR     = "cluster.spec.network.podCIDR"
	FieldServiceCIDR = "cluster.spec.network.serviceCIDR"
	FieldClusterDNS  = "cluster.spec.network.clusterDNS"

	FieldDNSServers      = "cluster.spec.settings.dnsServers"
	FieldCABundle        = "cluster.spec.settings.caBundle"
	FieldNTPServers      = "cluster.spec.settings.ntpServers"
	FieldSysctls         = "cluster.spec.settings.sysctls"
	FieldRegistryMirrors = "cluster.spec.settings.registryMirrors"
	FieldK3sArgs         = "cluster.spec.settings.k3sArgs"
	FieldKernelArgs      = likenv1.PendingKernelArgs
	FieldBanner          = "cluster.spec.settings.banner"

	// FieldRebootRequest is the pending entry of a reboot a person asked
	// for with liken request-reboot.
	FieldRebootRequest = "metadata.annotations[liken.sh/request-reboot]"
)

// Config is every declared value a machine applies to itself: its own
// Machine's spec and the Cluster's network and shared settings. The
// release (cluster.spec.version) is not part of it: the release pipeline
// handles it.
type Config struct {
	Role          likenv1.MachineRole    `json:"role,omitempty"`
	RebootPolicy  likenv1.RebootPolicy   `json:"rebootPolicy,omitempty"`
	Disks         []likenv1.Disk         `json:"disks,omitempty"`
	Ports         []likenv1.Port         `json:"ports,omitempty"`
	KernelModules []likenv1.KernelModule `json:"kernelModules,omitempty"`
	Network       likenv1.NetworkSpec    `json:"network"`
	Settings      likenv1.SharedSettings `json:"settings"`
}

// Desired is the Config a Machine and its Cluster declare.
func Desired(m *likenv1.Machine, c *likenv1.Cluster) Config {
	cfg := Config{
		Role:          m.Spec.Role,
		RebootPolicy:  m.Spec.RebootPolicy,
		Disks:         m.Spec.Disks,
		Ports:         m.Spec.Ports,
		KernelModules: m.Spec.KernelModules,
		Network:       c.Spec.Network,
		Settings:      c.Spec.Settings,
	}
	if cfg.RebootPolicy == "" {
		cfg.RebootPolicy = likenv1.RebootManual
	}
	return *cfg.DeepCopy()
}

// DeepCopy copies a Config through JSON; the result shares nothing with c.
func (c Config) DeepCopy() *Config {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // a Config always marshals
	}
	var out Config
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return &out
}

// Field is one declared field, its class, and how to read and write it in
// a Config.
type Field struct {
	// Path is the field's path, such as spec.kernelModules.
	Path string
	// Class is how a change of the field reaches the machine.
	Class likenv1.DisruptionClass
	get   func(*Config) any
	set   func(dst, src *Config)
}

// Get is the field's value in c.
func (f Field) Get(c *Config) any { return f.get(c) }

// Copy sets the field in dst to its value in src.
func (f Field) Copy(dst, src *Config) { f.set(dst, src) }

// Fields is the class table: every field of Config, with its class. The
// reference docs (docs/reference/machine.md, cluster.md) list the same
// table; a test keeps them in step.
var Fields = []Field{
	{FieldRole, likenv1.ClassReboot, func(c *Config) any { return c.Role }, func(d, s *Config) { d.Role = s.Role }},
	{FieldRebootPolicy, likenv1.ClassLive, func(c *Config) any { return c.RebootPolicy }, func(d, s *Config) { d.RebootPolicy = s.RebootPolicy }},
	{FieldDisks, likenv1.ClassNextBoot, func(c *Config) any { return c.Disks }, func(d, s *Config) { d.Disks = s.Disks }},
	{FieldPorts, likenv1.ClassReboot, func(c *Config) any { return c.Ports }, func(d, s *Config) { d.Ports = s.Ports }},
	{FieldKernelModules, likenv1.ClassReboot, func(c *Config) any { return c.KernelModules }, func(d, s *Config) { d.KernelModules = s.KernelModules }},
	{FieldEndpoint, likenv1.ClassReboot, func(c *Config) any { return c.Network.Endpoint }, func(d, s *Config) { d.Network.Endpoint = s.Network.Endpoint }},
	{FieldPodCIDR, likenv1.ClassReboot, func(c *Config) any { return c.Network.PodCIDR }, func(d, s *Config) { d.Network.PodCIDR = s.Network.PodCIDR }},
	{FieldServiceCIDR, likenv1.ClassReboot, func(c *Config) any { return c.Network.ServiceCIDR }, func(d, s *Config) { d.Network.ServiceCIDR = s.Network.ServiceCIDR }},
	{FieldClusterDNS, likenv1.ClassReboot, func(c *Config) any { return c.Network.ClusterDNS }, func(d, s *Config) { d.Network.ClusterDNS = s.Network.ClusterDNS }},
	{FieldDNSServers, likenv1.ClassLive, func(c *Config) any { return c.Settings.DNSServers }, func(d, s *Config) { d.Settings.DNSServers = s.Settings.DNSServers }},
	{FieldCABundle, likenv1.ClassLive, func(c *Config) any { return c.Settings.CABundle }, func(d, s *Config) { d.Settings.CABundle = s.Settings.CABundle }},
	{FieldNTPServers, likenv1.ClassLive, func(c *Config) any { return c.Settings.NTPServers }, func(d, s *Config) { d.Settings.NTPServers = s.Settings.NTPServers }},
	{FieldSysctls, likenv1.ClassLive, func(c *Config) any { return c.Settings.Sysctls }, func(d, s *Config) { d.Settings.Sysctls = s.Settings.Sysctls }},
	{FieldRegistryMirrors, likenv1.ClassLive, func(c *Config) any { return c.Settings.RegistryMirrors }, func(d, s *Config) { d.Settings.RegistryMirrors = s.Settings.RegistryMirrors }},
	{FieldK3sArgs, likenv1.ClassRestartK3s, func(c *Config) any { return c.Settings.K3sArgs }, func(d, s *Config) { d.Settings.K3sArgs = s.Settings.K3sArgs }},
	{FieldKernelArgs, likenv1.ClassReboot, func(c *Config) any { return c.Settings.KernelArgs }, func(d, s *Config) { d.Settings.KernelArgs = s.Settings.KernelArgs }},
	{FieldBanner, likenv1.ClassNextBoot, func(c *Config) any { return c.Settings.Banner }, func(d, s *Config) { d.Settings.Banner = s.Settings.Banner }},
}

// ClassOf is the class of a field path (as in Fields, plus
// cluster.spec.version and the reboot request, both Reboot), and false for
// a path with no class.
func ClassOf(path string) (likenv1.DisruptionClass, bool) {
	switch path {
	case FieldVersion, FieldRebootRequest:
		return likenv1.ClassReboot, true
	}
	for _, f := range Fields {
		if f.Path == path {
			return f.Class, true
		}
	}
	return "", false
}

// Change is one field whose declared value differs from what was applied.
type Change struct {
	// Field is the field's path.
	Field string
	// Class is the field's class.
	Class likenv1.DisruptionClass
	// Value is the declared value, as canonical JSON.
	Value string
}

// Diff lists the fields whose values in desired differ from applied, in
// the order of Fields. An empty list and a missing list are equal.
func Diff(applied, desired Config) []Change {
	var out []Change
	for _, f := range Fields {
		a, d := canonical(f.get(&applied)), canonical(f.get(&desired))
		if a != d {
			out = append(out, Change{Field: f.Path, Class: f.Class, Value: d})
		}
	}
	return out
}

// Only keeps the changes of the given classes.
func Only(cs []Change, classes ...likenv1.DisruptionClass) []Change {
	var out []Change
	for _, c := range cs {
		for _, k := range classes {
			if c.Class == k {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// Merge returns base with every field of the given classes taken from src.
func Merge(base, src Config, classes ...likenv1.DisruptionClass) Config {
	out := *base.DeepCopy()
	s := src.DeepCopy()
	for _, f := range Fields {
		for _, k := range classes {
			if f.Class == k {
				f.set(&out, s)
			}
		}
	}
	return out
}

// Immediate tells whether a Live change takes effect at once, without a
// turn: rebootPolicy changes only how liken-node asks for its turns,
// nothing the machine runs. Every other Live change waits for a Live
// turn under the disruption budget.
func (c Change) Immediate() bool {
	return c.Field == FieldRebootPolicy
}

// SplitLive parts Live changes into those that wait for a turn and those
// that take effect at once (Change.Immediate).
func SplitLive(live []Change) (inTurn, now []Change) {
	for _, c := range live {
		if c.Immediate() {
			now = append(now, c)
		} else {
			inTurn = append(inTurn, c)
		}
	}
	return inTurn, now
}

// MergeChanges returns base with the fields cs names taken from src.
func MergeChanges(base, src Config, cs []Change) Config {
	out := *base.DeepCopy()
	s := src.DeepCopy()
	for _, f := range Fields {
		for _, c := range cs {
			if c.Field == f.Path {
				f.set(&out, s)
				break
			}
		}
	}
	return out
}

// Paths are the field paths of cs, sorted.
func Paths(cs []Change) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.Field)
	}
	sort.Strings(out)
	return out
}

// canonical is v as JSON, with empty slices, maps and strings all "null".
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	switch string(b) {
	case "[]", "{}", `""`, "null":
		return "null"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}
