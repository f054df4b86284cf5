package layer

import (
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
)

const validCluster = `apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata:
  name: mycluster
spec:
  version: "2026.10.10-001"
  releases:
    source: https://releases.example.com
    catalog:
    - version: "2026.10.10-001"
      digest: sha256:5f2b8c1e0d9a7b3c4e6f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f
  network:
    endpoint: https://10.0.0.10:6443
    podCIDR: 10.42.0.0/16
  disruption:
    maxUnavailable: 1
`

const validMachine = `apiVersion: liken.sh/v1alpha1
kind: Machine
metadata:
  name: node-1
spec:
  cluster: mycluster
  role: Leader
  rebootPolicy: Auto
  disks:
  - device: /dev/disk/by-id/nvme-0
    mountPoint: /var/lib/data
  ports:
  - name: eth0
    mac: 52:54:00:12:34:56
    addresses: [10.0.0.11/24]
    gateway: 10.0.0.1
  kernelModules:
  - name: vfio-pci
    parameters: [ids=10de:1eb8]
`

func TestValidateDocumentAcceptsValid(t *testing.T) {
	d, err := ValidateDocument("cluster.yaml", []byte(validCluster))
	assert.NilError(t, err)
	assert.Equal(t, d.Kind, KindCluster)
	assert.Equal(t, d.Name, "mycluster")
	// Defaults are applied to the decoded object, as the API server would.
	assert.Equal(t, d.Cluster.Spec.Disruption.DrainTimeout.Duration.String(), "10m0s")
	assert.Equal(t, d.Cluster.Spec.Releases.PollInterval.Duration.String(), "1h0m0s")
	// ...but the stored document is what the person wrote.
	assert.Assert(t, !strings.Contains(string(d.YAML), "drainTimeout"), string(d.YAML))

	// Maintenance windows: one that crosses midnight, one of 7 days.
	d, err = ValidateDocument("cluster.yaml", []byte(strings.Replace(validCluster, "maxUnavailable: 1\n",
		"maxUnavailable: 1\n    windows:\n    - {days: [Sat, Sun], start: \"22:00\", duration: 4h, timeZone: Europe/Berlin}\n"+
			"    - {days: [Wed], start: \"00:00\", duration: 168h, timeZone: America/Argentina/ComodRivadavia}\n", 1)))
	assert.NilError(t, err)
	assert.Equal(t, len(d.Cluster.Spec.Disruption.Windows), 2)
	assert.Equal(t, d.Cluster.Spec.Disruption.Windows[0].Duration.Duration.String(), "4h0m0s")

	m, err := ValidateDocument("machine.yaml", []byte(validMachine))
	assert.NilError(t, err)
	assert.Equal(t, m.Machine.Spec.Disks[0].Filesystem, "ext4")
}

// Every rule the API server applies refuses a bad document with an error
// that names the file and the field.
func TestValidateDocumentRefuses(t *testing.T) {
	cluster := func(old, new string) string { return strings.Replace(validCluster, old, new, 1) }
	machine := func(old, new string) string { return strings.Replace(validMachine, old, new, 1) }
	windows := func(items string) string {
		return cluster("maxUnavailable: 1\n", "maxUnavailable: 1\n    windows:\n    - "+items+"\n")
	}
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"version not in catalog", cluster(`version: "2026.10.10-001"`, `version: "2026.10.11-001"`),
			[]string{"spec.version", "2026.10.11-001 is not in spec.releases.catalog"}},
		{"version format", cluster(`version: "2026.10.10-001"`, `version: "v1.2.3"`),
			[]string{"spec.version", "YYYY.MM.DD-NNN"}},
		{"digest format", cluster("digest: sha256:5f2b", "digest: sha256:XX2b"),
			[]string{"spec.releases.catalog[0].digest", "64 lowercase hex"}},
		{"source scheme", cluster("source: https://releases.example.com", "source: ftp://releases.example.com"),
			[]string{"spec.releases.source", "http:// or https://"}},
		{"missing endpoint", cluster("    endpoint: https://10.0.0.10:6443\n", ""),
			[]string{"spec.network.endpoint", "Required value"}},
		{"pod CIDR", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0"),
			[]string{"spec.network.podCIDR", "CIDR"}},
		{"pod CIDR smaller than a machine's range", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0/25"),
			[]string{"spec.network.podCIDR", "podCIDR 10.42.0.0/25 is smaller than one machine's pod range, a /24"}},
		{"IPv6 pod CIDR too large to number", cluster("podCIDR: 10.42.0.0/16", "podCIDR: fd00::/32"),
			[]string{"spec.network.podCIDR", "podCIDR fd00::/32 cannot be numbered in machine ranges of /64"}},
		{"pod CIDR holding the service range", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.0.0.0/8"),
			[]string{"spec.network.podCIDR", "podCIDR 10.0.0.0/8 overlaps serviceCIDR 10.96.0.0/16 (the default)", "ranges of their own"}},
		{"service CIDR holding the pod range", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0/16\n    serviceCIDR: 10.40.0.0/14"),
			[]string{"spec.network.podCIDR", "podCIDR 10.42.0.0/16 overlaps serviceCIDR 10.40.0.0/14"}},
		{"service CIDR holding the default pod range", cluster("podCIDR: 10.42.0.0/16", "serviceCIDR: 10.240.0.0/12"),
			[]string{"spec.network.podCIDR", "podCIDR " + likenv1.DefaultPodCIDR + " (the default) overlaps serviceCIDR 10.240.0.0/12"}},
		{"cluster DNS outside the service range", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0/16\n    serviceCIDR: 10.43.0.0/16\n    clusterDNS: 10.96.0.10"),
			[]string{"spec.network.clusterDNS", "clusterDNS 10.96.0.10 is not inside serviceCIDR 10.43.0.0/16", "such as its tenth"}},
		{"cluster DNS outside the default service range", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0/16\n    clusterDNS: 10.43.0.10"),
			[]string{"spec.network.clusterDNS", "clusterDNS 10.43.0.10 is not inside serviceCIDR " + likenv1.DefaultServiceCIDR + " (the default)"}},
		{"cluster DNS of another family", cluster("podCIDR: 10.42.0.0/16", "podCIDR: 10.42.0.0/16\n    clusterDNS: fd00::10"),
			[]string{"spec.network.clusterDNS", "clusterDNS fd00::10 is not inside serviceCIDR"}},
		{"max unavailable percentage", cluster("maxUnavailable: 1", "maxUnavailable: 150%"),
			[]string{"spec.disruption.maxUnavailable", "percentage"}},
		{"unknown field", cluster("  network:", "  netwrk: {}\n  network:"),
			[]string{"spec.netwrk", "unknown field"}},
		{"catalog duplicate", cluster("  network:", "    - version: \"2026.10.10-001\"\n      digest: sha256:5f2b8c1e0d9a7b3c4e6f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f\n  network:"),
			[]string{"spec.releases.catalog[1]", "Duplicate value"}},
		{"window day", windows(`{days: [Sat, Sunday], start: "22:00", duration: 4h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].days[1]", `Unsupported value: "Sunday"`, `"Sun"`}},
		{"window day twice", windows(`{days: [Sat, Sat], start: "22:00", duration: 4h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].days[1]", `Duplicate value: "Sat"`}},
		{"window without days", windows(`{days: [], start: "22:00", duration: 4h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].days", "should have at least 1 items"}},
		{"window start", windows(`{days: [Sat], start: "10pm", duration: 4h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].start", "start must be a time of day HH:MM"}},
		{"window start 24:00", windows(`{days: [Sat], start: "24:00", duration: 4h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].start", "from 00:00 to 23:59"}},
		{"window duration over 7 days", windows(`{days: [Sat], start: "22:00", duration: 169h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].duration", "at most 7 days"}},
		{"window duration in days", windows(`{days: [Sat], start: "22:00", duration: 7d, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].duration", "a day is 24h"}},
		{"window duration zero", windows(`{days: [Sat], start: "22:00", duration: 0h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].duration", "more than 0"}},
		{"window duration that would overflow", windows(`{days: [Sat], start: "22:00", duration: 9999999999h, timeZone: Europe/Berlin}`),
			[]string{"spec.disruption.windows[0].duration", "at most 7 days"}},
		{"window without time zone", windows(`{days: [Sat], start: "22:00", duration: 4h}`),
			[]string{"spec.disruption.windows[0].timeZone", "Required value"}},
		{"window time zone offset", windows(`{days: [Sat], start: "22:00", duration: 4h, timeZone: "+01:00"}`),
			[]string{"spec.disruption.windows[0].timeZone", "timeZone must be the IANA name of a time zone"}},
		{"window time zone Local", windows(`{days: [Sat], start: "22:00", duration: 4h, timeZone: Local}`),
			[]string{"spec.disruption.windows[0].timeZone", "not Local"}},
		{"window unknown time zone", windows(`{days: [Sat], start: "22:00", duration: 4h, timeZone: Europe/Berln}`),
			[]string{"spec.disruption.windows[0].timeZone", `Invalid value: "Europe/Berln": unknown time zone`, "Europe/Berlin"}},
		{"second window unknown time zone", windows(`{days: [Sat], start: "22:00", duration: 4h, timeZone: UTC}` + "\n    - " + `{days: [Sun], start: "02:00", duration: 1h, timeZone: Mars/Olympus_Mons}`),
			[]string{"spec.disruption.windows[1].timeZone", `"Mars/Olympus_Mons": unknown time zone`}},
		{"role enum", machine("role: Leader", "role: leader"),
			[]string{"spec.role", `Unsupported value: "leader"`, `"Leader"`, `"Worker"`}},
		{"reboot policy enum", machine("rebootPolicy: Auto", "rebootPolicy: Sometimes"),
			[]string{"spec.rebootPolicy", "Unsupported value"}},
		{"mac format", machine("mac: 52:54:00:12:34:56", "mac: 52-54-00-12-34-56"),
			[]string{"spec.ports[0].mac", "six lowercase hex pairs"}},
		{"address not CIDR", machine("addresses: [10.0.0.11/24]", "addresses: [10.0.0.11]"),
			[]string{"spec.ports[0].addresses[0]", "CIDR"}},
		{"mount point outside /var", machine("mountPoint: /var/lib/data", "mountPoint: /etc"),
			[]string{"spec.disks[0].mountPoint", "under /var"}},
		{"device outside /dev", machine("device: /dev/disk/by-id/nvme-0", "device: disk0"),
			[]string{"spec.disks[0].device", "/dev"}},
		{"module name", machine("name: vfio-pci", "name: vfio pci"),
			[]string{"spec.kernelModules[0].name", "letters, digits"}},
		{"wrong type", machine("addresses: [10.0.0.11/24]", "mtu: big"),
			[]string{"spec.ports[0].mtu", "Invalid value"}},
		{"missing cluster", machine("  cluster: mycluster\n", ""),
			[]string{"spec.cluster", "Required value"}},
		{"bad name", machine("name: node-1", "name: Node_1"),
			[]string{"metadata.name", "Invalid value"}},
		{"namespace", machine("  name: node-1\n", "  name: node-1\n  namespace: default\n"),
			[]string{"metadata.namespace", "cluster-scoped"}},
		{"no name", machine("  name: node-1\n", "  labels: {a: b}\n"),
			[]string{"metadata.name", "Required value"}},
		{"bad label", machine("  name: node-1\n", "  name: node-1\n  labels: {\"a b\": c}\n"),
			[]string{"metadata.labels", "Invalid value"}},
		{"other kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
			[]string{"v1 ConfigMap", "only liken.sh/v1alpha1 Cluster and Machine"}},
		{"no kind", "metadata: {name: x}\n",
			[]string{"apiVersion and kind are required"}},
		{"duplicate key", machine("  role: Leader\n", "  role: Leader\n  role: Worker\n"),
			[]string{"not valid YAML", `key "role" already set`}},
		{"not a mapping", "- a\n- b\n",
			[]string{"must be a YAML mapping"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ValidateDocument("input.yaml", []byte(tc.doc))
			assert.Assert(t, err != nil, "accepted:\n%s", tc.doc)
			assert.Assert(t, is.Contains(err.Error(), "input.yaml"))
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
		})
	}
}

// kubectl get -o yaml output (a List with status and server fields) packs:
// status and server-set metadata are left out, as a create would drop them.
func TestParseDocumentsList(t *testing.T) {
	in := `apiVersion: v1
kind: List
items:
- apiVersion: liken.sh/v1alpha1
  kind: Machine
  metadata:
    name: node-1
    uid: 6c1f
    resourceVersion: "42"
    creationTimestamp: "2026-11-30T05:00:00Z"
    labels: {rack: r1}
  spec: {cluster: mycluster, role: Leader}
  status: {phase: Ready, version: 2026.10.10-001}
- apiVersion: liken.sh/v1alpha1
  kind: Machine
  metadata: {name: node-2}
  spec: {cluster: mycluster, role: Boss}
`
	docs, errs := ParseDocuments("machines.yaml", strings.NewReader(in))
	assert.Equal(t, len(docs), 1)
	assert.Equal(t, len(errs), 1)
	assert.Assert(t, is.Contains(errs[0].Error(), "machines.yaml items[1]: Machine node-2:"))
	assert.Assert(t, is.Contains(errs[0].Error(), `spec.role: Unsupported value: "Boss"`))
	golden.Assert(t, string(docs[0].YAML), gold("list-item.golden.yaml"))
}

func TestParseDocumentsNamesTheDocument(t *testing.T) {
	in := validCluster + "---\n# a comment only\n---\n" + strings.Replace(validMachine, "role: Leader", "role: Queen", 1)
	docs, errs := ParseDocuments("all.yaml", strings.NewReader(in))
	assert.Equal(t, len(docs), 1)
	assert.Equal(t, len(errs), 1)
	assert.Assert(t, is.Contains(errs[0].Error(), "all.yaml (document 2): Machine node-1:"))
	assert.Assert(t, is.Contains(errs[0].Error(), `spec.role: Unsupported value: "Queen"`))
}

func TestCheckFleet(t *testing.T) {
	doc := func(s string) *Document {
		t.Helper()
		d, err := ValidateDocument("x.yaml", []byte(s))
		assert.NilError(t, err)
		return d
	}
	m := func(name, cluster, role string) *Document {
		s := strings.NewReplacer("name: node-1", "name: "+name, "cluster: mycluster", "cluster: "+cluster, "role: Leader", "role: "+role).Replace(validMachine)
		return doc(s)
	}
	other := doc(strings.Replace(validCluster, "name: mycluster", "name: other", 1))
	tests := []struct {
		name string
		docs []*Document
		want string
	}{
		{"no cluster", []*Document{m("node-1", "mycluster", "Leader")}, "no Cluster document"},
		{"two clusters", []*Document{doc(validCluster), other, m("node-1", "mycluster", "Leader")}, "2 Cluster documents (mycluster in x.yaml, other in x.yaml)"},
		{"no machines", []*Document{doc(validCluster)}, "no Machine documents"},
		{"other cluster", []*Document{doc(validCluster), m("node-1", "mycluster", "Leader"), m("node-2", "theirs", "Worker")},
			`Machine node-2: spec.cluster: Invalid value: "theirs": the layer's Cluster is "mycluster"`},
		{"duplicate", []*Document{doc(validCluster), m("node-1", "mycluster", "Leader"), m("node-1", "mycluster", "Worker")},
			`Machine node-1: metadata.name: Duplicate value`},
		{"no leader", []*Document{doc(validCluster), m("node-1", "mycluster", "Worker")}, "no Machine has spec.role: Leader"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, errs := CheckFleet(tc.docs)
			assert.Assert(t, len(errs) > 0)
			var all []string
			for _, e := range errs {
				all = append(all, e.Error())
			}
			assert.Assert(t, is.Contains(strings.Join(all, "\n"), tc.want))
		})
	}
	c, ms, errs := CheckFleet([]*Document{m("node-2", "mycluster", "Worker"), doc(validCluster), m("node-1", "mycluster", "Leader")})
	assert.Equal(t, len(errs), 0)
	assert.Equal(t, c.Name, "mycluster")
	assert.Equal(t, ms[0].Name, "node-1")
	assert.Equal(t, ms[1].Name, "node-2")
}

// settings.sysctls cannot set kernel.panic, nor turn off a trial's guard:
// a trial kernel that panics, or hangs, must reboot into the proven slot.
func TestSysctlsRefuseKernelPanic(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       string
	}{
		{"vm.max_map_count", "0", ""},
		{"kernel.panic_on_warn", "0", ""},
		{"kernel.panic", "0", "kernel.panic is set by liken"},
		{"kernel/panic", "0", "kernel.panic is set by liken"},
		{"kernel.panic_on_oops", "0", "may only be set to 1"},
		{"kernel/softlockup_panic", "0", "may only be set to 1"},
		{"kernel.hung_task_panic", "1", ""},
	} {
		doc := strings.Replace(validCluster, "  disruption:", "  settings:\n    sysctls: {"+strconv.Quote(tc.key)+": "+strconv.Quote(tc.value)+"}\n  disruption:", 1)
		_, err := ValidateDocument("input.yaml", []byte(doc))
		if tc.want == "" {
			assert.NilError(t, err, tc.key)
			continue
		}
		assert.ErrorContains(t, err, tc.want, tc.key)
	}
}

// The Cluster's rules on settings.kernelArgs refuse exactly what the
// machine's boot loader writer refuses, so a bad argument is refused at
// kubectl time instead of degrading every machine.
func TestKernelArgsRulesMatchTheMachine(t *testing.T) {
	long := strings.Repeat("a", 600)
	many := make([]string, boot.MaxKernelArgs+1)
	for i := range many {
		many[i] = "quiet"
	}
	for _, tc := range []struct {
		args []string
		want string // "" when accepted
	}{
		{[]string{"mitigations=auto", "console=ttyS0,115200n8", "a!#$%&()+,-./0123456789:;<=>@Z^_`z{|}~"}, ""},
		{[]string{"init=/bin/sh"}, ""},
		{[]string{"paniced=1", "xliken.slot=B"}, ""},
		{[]string{`quote="x"`}, "printable ASCII"},
		{[]string{"it's"}, "printable ASCII"},
		{[]string{`back\slash`}, "printable ASCII"},
		{[]string{"glob*"}, "printable ASCII"},
		{[]string{"a?"}, "printable ASCII"},
		{[]string{"x[0]"}, "printable ASCII"},
		{[]string{"two words"}, "printable ASCII"},
		{[]string{"tab\there"}, "printable ASCII"},
		{[]string{"é"}, "printable ASCII"},
		{[]string{"--"}, "pass the arguments after it to init"},
		{[]string{"liken.slot=B"}, "liken.*"},
		{[]string{"panic=0"}, "panic="},
		{[]string{"panic"}, "panic="},
		{[]string{"sysctl.kernel.panic=0"}, "kernel.panic"},
		{[]string{"sysctl.kernel/panic=0"}, "kernel.panic"},
		{[]string{"sysctl/kernel/panic=0"}, "kernel.panic"},
		{[]string{"sysctl..kernel//panic"}, "kernel.panic"},
		{[]string{"sysctl.kernel.panic_on_warn=1", "sysctl.vm.swappiness=10", "sysctlkernel.panic=0", "panic_on_oopsx=1"}, ""},
		{[]string{"softlockup_panic=0"}, "sets softlockup_panic, hung_task_panic and panic_on_oops on a trial boot"},
		{[]string{"hung_task_panic"}, "on a trial boot"},
		{[]string{"sysctl.kernel.panic_on_oops=1"}, "on a trial boot"},
		{[]string{"sysctl//kernel.softlockup_panic=0"}, "on a trial boot"},
		{[]string{""}, "spec.settings.kernelArgs[0]"},
		{[]string{long, long}, "1024 bytes"},
		{many, "must have at most 24 items"},
	} {
		items := make([]string, len(tc.args))
		for i, a := range tc.args {
			items[i] = strconv.Quote(a)
		}
		doc := strings.Replace(validCluster, "  disruption:", "  settings:\n    kernelArgs: ["+strings.Join(items, ", ")+"]\n  disruption:", 1)
		_, err := ValidateDocument("input.yaml", []byte(doc))
		machineErr := boot.ValidateKernelArgs(tc.args)
		if tc.want == "" {
			assert.NilError(t, err, "%q", tc.args)
			assert.NilError(t, machineErr, "%q", tc.args)
			continue
		}
		assert.ErrorContains(t, err, tc.want, "%q", tc.args)
		assert.Assert(t, machineErr != nil, "the machine accepts %q, which the Cluster refuses", tc.args)
	}
}

// TestRegistryMirrorRulesMatchTheMachine: the Cluster's schema refuses
// the registry mirrors a machine could not write for containerd, and
// accepts those it can.
func TestRegistryMirrorRulesMatchTheMachine(t *testing.T) {
	for _, tc := range []struct {
		registry, endpoint string
		want               string // "" when accepted
	}{
		{"docker.io", "https://mirror.example.com", ""},
		{"registry.example:5000", "http://10.0.0.5:5000/v2", ""},
		{"*", "https://mirror.example.com", ""},
		{"../etc", "https://mirror.example.com", "registry must be a registry host"},
		{"docker.io/library", "https://mirror.example.com", "registry must be a registry host"},
		{"-bad.example", "https://mirror.example.com", "registry must be a registry host"},
		{"docker.io", "mirror.example.com", "must be an http:// or https:// URL"},
		{"docker.io", "https://mirror.example.com/\"x", "without spaces, quotes or control characters"},
		{"docker.io", "https://mirror.example.com/ x", "without spaces, quotes or control characters"},
		{"docker.io", "https://mirror.example.com/\\", "without spaces, quotes or control characters"},
	} {
		doc := strings.Replace(validCluster, "  disruption:", "  settings:\n    registryMirrors:\n    - registry: "+strconv.Quote(tc.registry)+
			"\n      endpoints: ["+strconv.Quote(tc.endpoint)+"]\n  disruption:", 1)
		_, err := ValidateDocument("input.yaml", []byte(doc))
		machineErr := changes.ValidateRegistryMirror(likenv1.RegistryMirror{Registry: tc.registry, Endpoints: []string{tc.endpoint}})
		if tc.want == "" {
			assert.NilError(t, err, "%q %q", tc.registry, tc.endpoint)
			assert.NilError(t, machineErr, "%q %q", tc.registry, tc.endpoint)
			continue
		}
		assert.ErrorContains(t, err, tc.want, "%q %q", tc.registry, tc.endpoint)
		assert.Assert(t, machineErr != nil, "the machine accepts %q %q, which the Cluster refuses", tc.registry, tc.endpoint)
	}
}

// TestPodCIDRRulesMatchTheControlPlane: the Cluster's schema refuses the
// pod ranges the controller manager could not cut into Node ranges
// (v1alpha1.NodePodCIDRPrefix), and accepts those it can; the defaults
// its rules assume are v1alpha1's.
func TestPodCIDRRulesMatchTheControlPlane(t *testing.T) {
	for _, tc := range []struct {
		podCIDR string
		want    string // "" when accepted
	}{
		{"10.42.0.0/16", ""},
		{"10.128.0.0/9", ""},
		{"192.168.5.0/24", ""},
		{"10.42.0.0/25", "is smaller than one machine's pod range"},
		{"10.42.0.1/32", "is smaller than one machine's pod range"},
		{"fd00:10:244::/56", ""},
		{"fd00:10::/48", ""},
		{"fd00:10:244:1::/64", ""},
		{"fd00:10:244:1::/65", "cannot be numbered in machine ranges of /64"},
		{"fd00::/47", "cannot be numbered in machine ranges of /64"},
	} {
		doc := strings.Replace(validCluster, "podCIDR: 10.42.0.0/16", "podCIDR: "+tc.podCIDR, 1)
		_, err := ValidateDocument("input.yaml", []byte(doc))
		_, cpErr := likenv1.NodePodCIDRPrefix(tc.podCIDR)
		if tc.want == "" {
			assert.NilError(t, err, tc.podCIDR)
			assert.NilError(t, cpErr, tc.podCIDR)
			continue
		}
		assert.ErrorContains(t, err, tc.want, tc.podCIDR)
		assert.Assert(t, cpErr != nil, "the control plane accepts %s, which the Cluster refuses", tc.podCIDR)
	}
	// Unset, each range is its default, and the defaults do not overlap.
	d, err := ValidateDocument("input.yaml", []byte(strings.Replace(validCluster, "    podCIDR: 10.42.0.0/16\n", "    clusterDNS: 10.96.0.10\n", 1)))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(d.Cluster.Spec.Network.PodCIDROrDefault(), likenv1.DefaultPodCIDR))
	assert.Check(t, is.Equal(d.Cluster.Spec.Network.ServiceCIDROrDefault(), likenv1.DefaultServiceCIDR))
}
