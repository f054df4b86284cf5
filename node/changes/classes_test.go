package changes

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/manifests"
)

func base() Config {
	return Config{
		Role:         likenv1.RoleWorker,
		RebootPolicy: likenv1.RebootManual,
		Disks:        []likenv1.Disk{{Device: "/dev/vdb", MountPoint: "/var/lib/data"}},
		Ports:        []likenv1.Port{{Name: "eth0", Addresses: []string{"10.0.0.11/24"}}},
		KernelModules: []likenv1.KernelModule{
			{Name: "vfio", Parameters: []string{"enable_unsafe_noiommu_mode=1"}},
		},
		Network: likenv1.NetworkSpec{Endpoint: "https://10.0.0.10:6443", PodCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.10"},
		Settings: likenv1.SharedSettings{
			DNSServers:      []string{"192.0.2.53"},
			NTPServers:      []string{"time.example.com"},
			Sysctls:         map[string]string{"vm.max_map_count": "262144"},
			RegistryMirrors: []likenv1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example.com"}}},
			K3sArgs:         []string{"--max-pods=200"},
			KernelArgs:      []string{"mitigations=auto"},
			Banner:          "hello",
		},
	}
}

// TestClassOfEveryField changes each field alone and checks that Diff
// reports exactly that field with its documented class.
func TestClassOfEveryField(t *testing.T) {
	cases := []struct {
		field  string
		class  likenv1.DisruptionClass
		change func(*Config)
	}{
		{FieldRole, likenv1.ClassReboot, func(c *Config) { c.Role = likenv1.RoleLeader }},
		{FieldRebootPolicy, likenv1.ClassLive, func(c *Config) { c.RebootPolicy = likenv1.RebootAuto }},
		{FieldDisks, likenv1.ClassNextBoot, func(c *Config) { c.Disks[0].Filesystem = "xfs" }},
		{FieldPorts, likenv1.ClassReboot, func(c *Config) { c.Ports[0].MTU = 9000 }},
		{FieldKernelModules, likenv1.ClassReboot, func(c *Config) { c.KernelModules[0].Parameters = nil }},
		{FieldEndpoint, likenv1.ClassReboot, func(c *Config) { c.Network.Endpoint = "https://10.0.0.20:6443" }},
		{FieldPodCIDR, likenv1.ClassReboot, func(c *Config) { c.Network.PodCIDR = "10.52.0.0/16" }},
		{FieldServiceCIDR, likenv1.ClassReboot, func(c *Config) { c.Network.ServiceCIDR = "10.53.0.0/16" }},
		{FieldClusterDNS, likenv1.ClassReboot, func(c *Config) { c.Network.ClusterDNS = "10.53.0.10" }},
		{FieldDNSServers, likenv1.ClassLive, func(c *Config) { c.Settings.DNSServers = append(c.Settings.DNSServers, "192.0.2.54:5353") }},
		{FieldCABundle, likenv1.ClassLive, func(c *Config) { c.Settings.CABundle = "-----BEGIN CERTIFICATE-----" }},
		{FieldNTPServers, likenv1.ClassLive, func(c *Config) { c.Settings.NTPServers = append(c.Settings.NTPServers, "pool.ntp.org") }},
		{FieldSysctls, likenv1.ClassLive, func(c *Config) { c.Settings.Sysctls["net.core.somaxconn"] = "4096" }},
		{FieldRegistryMirrors, likenv1.ClassLive, func(c *Config) { c.Settings.RegistryMirrors = nil }},
		{FieldK3sArgs, likenv1.ClassRestartK3s, func(c *Config) { c.Settings.K3sArgs = []string{"--kubelet-arg=max-pods=300"} }},
		{FieldKernelArgs, likenv1.ClassReboot, func(c *Config) { c.Settings.KernelArgs = append(c.Settings.KernelArgs, "quiet") }},
		{FieldBanner, likenv1.ClassNextBoot, func(c *Config) { c.Settings.Banner = "bye" }},
	}
	assert.Equal(t, len(cases), len(Fields), "every field of the class table has a case here")
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			applied := base()
			desired := *base().DeepCopy()
			tc.change(&desired)
			got := Diff(applied, desired)
			assert.Equal(t, len(got), 1, "changes: %+v", got)
			assert.Equal(t, got[0].Field, tc.field)
			assert.Equal(t, got[0].Class, tc.class)
			class, ok := ClassOf(tc.field)
			assert.Assert(t, ok)
			assert.Equal(t, class, tc.class)
			// Merging the field's class makes the diff empty again.
			assert.Assert(t, is.Len(Diff(Merge(applied, desired, tc.class), desired), 0))
		})
	}
}

func TestNoDiffForEqualOrEmpty(t *testing.T) {
	assert.Assert(t, is.Len(Diff(base(), *base().DeepCopy()), 0))
	a, d := Config{}, Config{Settings: likenv1.SharedSettings{NTPServers: []string{}, Sysctls: map[string]string{}}}
	assert.Assert(t, is.Len(Diff(a, d), 0), "an empty list equals a missing one")
}

func TestMergeTakesOnlyTheGivenClasses(t *testing.T) {
	applied := base()
	desired := *base().DeepCopy()
	desired.Settings.Banner = "new"
	desired.Settings.Sysctls = map[string]string{"vm.swappiness": "1"}
	desired.Role = likenv1.RoleLeader
	got := Merge(applied, desired, likenv1.ClassLive)
	assert.DeepEqual(t, Paths(Diff(got, desired)), []string{FieldBanner, FieldRole})
	assert.Equal(t, applied.Settings.Sysctls["vm.max_map_count"], "262144", "Merge leaves its inputs alone")
}

// TestOnlyRebootPolicyTakesEffectWithoutATurn: of the Live fields, the
// ones that change something the machine runs wait for a Live turn, and
// MergeChanges takes exactly the fields named.
func TestOnlyRebootPolicyTakesEffectWithoutATurn(t *testing.T) {
	applied := base()
	desired := *base().DeepCopy()
	desired.RebootPolicy = likenv1.RebootAuto
	desired.Settings.Sysctls = map[string]string{"vm.swappiness": "1"}
	desired.Settings.NTPServers = []string{"ntp.example.com"}
	desired.Settings.Banner = "new"
	inTurn, now := SplitLive(Only(Diff(applied, desired), likenv1.ClassLive))
	assert.DeepEqual(t, Paths(inTurn), []string{FieldNTPServers, FieldSysctls})
	assert.DeepEqual(t, Paths(now), []string{FieldRebootPolicy})
	got := MergeChanges(applied, desired, now)
	assert.DeepEqual(t, Paths(Diff(got, desired)), []string{FieldBanner, FieldNTPServers, FieldSysctls})
	assert.Equal(t, applied.RebootPolicy, base().RebootPolicy, "MergeChanges leaves its inputs alone")
}

// TestEveryAPIFieldHasAClass walks the Go types of the API: a new field in
// MachineSpec, NetworkSpec or SharedSettings must get a class here.
func TestEveryAPIFieldHasAClass(t *testing.T) {
	check := func(prefix string, typ reflect.Type, skip ...string) {
		for i := 0; i < typ.NumField(); i++ {
			name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]
			if contains(skip, name) {
				continue
			}
			_, ok := ClassOf(prefix + name)
			assert.Check(t, ok, "field %s%s has no disruption class", prefix, name)
		}
	}
	check("spec.", reflect.TypeOf(likenv1.MachineSpec{}), "cluster")
	check("cluster.spec.network.", reflect.TypeOf(likenv1.NetworkSpec{}))
	check("cluster.spec.settings.", reflect.TypeOf(likenv1.SharedSettings{}))
}

// TestReferenceDocsAgree reads the class columns of docs/reference and
// checks them against the class table.
func TestReferenceDocsAgree(t *testing.T) {
	row := regexp.MustCompile("^\\| `([a-zA-Z0-9.\\[\\]]+)` \\|[^|]*\\| (Live|RestartK3s|NextBoot|Reboot) \\|")
	found := map[string]likenv1.DisruptionClass{}
	for doc, prefix := range map[string]string{"../../docs/reference/machine.md": "spec.", "../../docs/reference/cluster.md": "cluster.spec."} {
		b, err := os.ReadFile(doc)
		assert.NilError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			if m := row.FindStringSubmatch(l); m != nil {
				found[prefix+strings.TrimSuffix(m[1], "[]")] = likenv1.DisruptionClass(m[2])
			}
		}
	}
	for _, f := range Fields {
		assert.Check(t, is.Equal(found[f.Path], f.Class), "the reference docs give %s the class %q", f.Path, found[f.Path])
	}
	assert.Check(t, is.Equal(found[FieldVersion], likenv1.ClassReboot))
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestCRDDescriptionsNameTheClass checks what kubectl explain prints for
// every declared field: its description names the field's class from the
// class table, so a person reading it learns what a change will disrupt.
func TestCRDDescriptionsNameTheClass(t *testing.T) {
	descriptions := map[string]string{}
	for file, prefix := range map[string]string{"11-crd-machine.yaml": "", "10-crd-cluster.yaml": "cluster."} {
		b, err := manifests.FS.ReadFile(file)
		assert.NilError(t, err)
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema crdSchema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		assert.NilError(t, yaml.Unmarshal(b, &crd))
		var walk func(path string, s crdSchema)
		walk = func(path string, s crdSchema) {
			descriptions[path] = s.Description
			for name, p := range s.Properties {
				walk(path+"."+name, p)
			}
		}
		for name, p := range crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties {
			walk(prefix+name, p)
		}
	}
	paths := []string{FieldVersion}
	for _, f := range Fields {
		paths = append(paths, f.Path)
	}
	for _, path := range paths {
		class, _ := ClassOf(path)
		d, ok := descriptions[path]
		assert.Assert(t, ok, "%s is not in the CRDs", path)
		assert.Assert(t, strings.Contains(d, "Disruption class: "+string(class)),
			"kubectl explain %s does not say \"Disruption class: %s\"; fix its doc comment in apis/liken/v1alpha1, then run go test ./manifests -run TestCRDDescriptions -update\ndescription: %s",
			path, class, d)
	}
}

type crdSchema struct {
	Description string               `json:"description"`
	Properties  map[string]crdSchema `json:"properties"`
}
