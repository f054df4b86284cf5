// Package api tests liken's API as users meet it: the manifests on a real
// kube-apiserver, the printer columns, the CEL refusals, the machine
// identities' limits, and the schema keeping every field of the Go types.
package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/utils/ptr"

	v1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/controlplane/controlplanetest"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/controllers/nodeclients"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
	nodecp "liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/join"
)

var manifests = filepath.Join("..", "..", "manifests")

const digest1 = "sha256:5f2b8c1e0d9a7b3c4e6f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f"
const digest2 = "sha256:0000000000000000000000000000000000000000000000000000000000000abc"

func setup(t *testing.T) (*controlplane.ControlPlane, versioned.Interface) {
	t.Helper()
	return setupWith(t, controlplane.Options{})
}

// setupWith starts a control plane with opts and the machines node-1 and
// node-2, and applies the manifests.
func setupWith(t *testing.T, opts controlplane.Options) (*controlplane.ControlPlane, versioned.Interface) {
	t.Helper()
	opts.Machines = []string{"node-1", "node-2"}
	cp := controlplanetest.Start(t, opts)
	ctx := context.Background()
	out, err := cp.Kubectl(ctx, "apply", "--server-side", "-f", manifests)
	assert.NilError(t, err, out)
	_, err = cp.Kubectl(ctx, "wait", "--for", "condition=established", "--timeout", "60s", "crd/clusters.liken.sh", "crd/machines.liken.sh")
	assert.NilError(t, err)
	cs, err := versioned.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	return cp, cs
}

func TestManifestsAndColumns(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()

	// A server dry run: kubectl 1.37's client dry run fails on a CRD that
	// exists ("applying patch locally: expected a struct, but received a
	// nil", kubernetes/kubernetes#139538), and the server's also runs
	// admission and the schemas.
	out, err := cp.Kubectl(ctx, "apply", "--dry-run=server", "-f", manifests)
	assert.NilError(t, err, out)
	out, err = cp.Kubectl(ctx, "apply", "-f", filepath.Join(manifests, "examples"))
	assert.NilError(t, err, out)

	out, err = cp.Kubectl(ctx, "get", "clusters", "-o", "wide")
	assert.NilError(t, err)
	assert.DeepEqual(t, strings.Fields(strings.SplitN(out, "\n", 2)[0]),
		strings.Fields("NAME STATUS MACHINES VERSION NEWEST AVAILABLE LEADERS ENDPOINT AGE TURNS"))
	out, err = cp.Kubectl(ctx, "get", "clusters")
	assert.NilError(t, err)
	assert.DeepEqual(t, strings.Fields(strings.SplitN(out, "\n", 2)[0]),
		strings.Fields("NAME STATUS MACHINES VERSION AVAILABLE AGE"))

	out, err = cp.Kubectl(ctx, "get", "machines")
	assert.NilError(t, err)
	assert.DeepEqual(t, strings.Fields(strings.SplitN(out, "\n", 2)[0]), strings.Fields("NAME ROLE LIKEN STATUS AGE"))
	out, err = cp.Kubectl(ctx, "get", "machines", "-o", "wide")
	assert.NilError(t, err)
	assert.DeepEqual(t, strings.Fields(strings.SplitN(out, "\n", 2)[0]), strings.Fields("NAME ROLE LIKEN STATUS AGE SLOT STAGED POLICY"))
	assert.Assert(t, is.Contains(out, "node-5"))

	out, err = cp.Kubectl(ctx, "get", "liken")
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(out, "cluster.liken.sh/mycluster"))
	assert.Assert(t, is.Contains(out, "machine.liken.sh/node-1"))

	// Defaults reach the stored object.
	out, err = cp.Kubectl(ctx, "get", "machine", "node-5", "-o", "jsonpath={.spec.rebootPolicy}")
	assert.NilError(t, err)
	assert.Equal(t, out, "Manual")

	// The short names work, and no other resource of the cluster has them.
	out, err = cp.Kubectl(ctx, "get", "lkc", "-o", "name")
	assert.NilError(t, err, out)
	assert.Equal(t, strings.TrimSpace(out), "cluster.liken.sh/mycluster")
	out, err = cp.Kubectl(ctx, "get", "lkm", "node-1", "-o", "name")
	assert.NilError(t, err, out)
	assert.Equal(t, strings.TrimSpace(out), "machine.liken.sh/node-1")
	out, err = cp.Kubectl(ctx, "api-resources", "--no-headers")
	assert.NilError(t, err, out)
	owners := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		// NAME SHORTNAMES APIVERSION NAMESPACED KIND: SHORTNAMES is absent
		// when a resource has none.
		if len(f) == 5 {
			for _, short := range strings.Split(f[1], ",") {
				owners[short] = append(owners[short], f[0]+"."+f[2])
			}
		}
	}
	for _, short := range []string{"lkc", "lkm"} {
		assert.Equal(t, len(owners[short]), 1, "short name %s belongs to %v", short, owners[short])
	}
}

// TestExplain reads the field reference as a person does, with kubectl
// explain: every field sampled prints its doc comment, its default and
// its disruption class, never <no description>.
func TestExplain(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()
	// The API server publishes a CRD's schema a moment after the CRD is
	// Established.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, kind := range []string{"cluster", "machine"} {
			if out, err := cp.Kubectl(ctx, "explain", kind); err != nil {
				return poll.Continue("kubectl explain %s: %v: %s", kind, err, out)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
	for _, tc := range []struct{ field, want string }{
		{"cluster.spec.disruption", "how many machines may be down at once"},
		{"cluster.spec.disruption.maxUnavailable", "Default 1"},
		{"cluster.spec.disruption.drainTimeout", "default 10m"},
		{"cluster.spec.disruption.stallTimeout", "RolloutStalled"},
		{"cluster.spec.disruption.settle", "PodDisruptionBudget"},
		{"cluster.spec.disruption.trialTimeout", "proven slot"},
		{"cluster.spec.settings.registryMirrors", "Disruption class: Live"},
		{"cluster.status.conditions", "Progressing"},
		{"machine.spec", "what the operator declares"},
		{"machine.spec.rebootPolicy", "Disruption class: Live"},
		{"machine.spec.disks.device", "/dev/disk/by-id"},
		{"machine.status.phase", "UpdatePending"},
		{"lkm.status.conditions", "AwaitingApproval"},
	} {
		out, err := cp.Kubectl(ctx, "explain", tc.field)
		assert.NilError(t, err, out)
		// kubectl wraps descriptions: compare on single spaces.
		text := strings.Join(strings.Fields(out), " ")
		assert.Assert(t, is.Contains(text, tc.want), "kubectl explain %s", tc.field)
		assert.Assert(t, !strings.Contains(out, "<no description>") && !strings.Contains(out, "<empty>"),
			"kubectl explain %s:\n%s", tc.field, out)
	}
}

func cluster(name string) *v1.Cluster {
	return &v1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ClusterSpec{
			Version: "2026.10.10-001",
			Releases: v1.ReleasesSpec{
				Source:  "https://releases.example.com",
				Catalog: []v1.CatalogEntry{{Version: "2026.10.10-001", Digest: digest1}},
			},
			Network: v1.NetworkSpec{Endpoint: "https://10.0.0.10:6443"},
		},
	}
}

func TestRefusals(t *testing.T) {
	_, cs := setup(t)
	ctx := context.Background()
	neg := intstr.FromInt32(-1)
	huge := intstr.FromInt32(2147483647)
	pct := intstr.FromString("150%")
	cases := []struct {
		name   string
		mutate func(c *v1.Cluster)
		want   []string
	}{
		{
			name:   "version not in catalog",
			mutate: func(c *v1.Cluster) { c.Spec.Version = "2026.11.01-001" },
			want:   []string{"spec.version", "2026.11.01-001 is not in spec.releases.catalog", "liken release digest"},
		},
		{
			name:   "malformed digest",
			mutate: func(c *v1.Cluster) { c.Spec.Releases.Catalog[0].Digest = "sha256:ABC" },
			want:   []string{"spec.releases.catalog[0].digest", "64 lowercase hex"},
		},
		{
			name: "duplicate catalog versions",
			mutate: func(c *v1.Cluster) {
				c.Spec.Releases.Catalog = append(c.Spec.Releases.Catalog, v1.CatalogEntry{Version: "2026.10.10-001", Digest: digest2})
			},
			want: []string{"spec.releases.catalog[1]", "Duplicate value", "2026.10.10-001"},
		},
		{
			name:   "negative maxUnavailable",
			mutate: func(c *v1.Cluster) { c.Spec.Disruption.MaxUnavailable = &neg },
			want:   []string{"spec.disruption.maxUnavailable", "0 or more"},
		},
		{
			name:   "maxUnavailable past any fleet",
			mutate: func(c *v1.Cluster) { c.Spec.Disruption.MaxUnavailable = &huge },
			want:   []string{"spec.disruption.maxUnavailable", "at most 1000000"},
		},
		{
			name:   "control character in the channel URL",
			mutate: func(c *v1.Cluster) { c.Spec.Releases.Source = "https://releases.example.com/\x1b[2J" },
			want:   []string{"spec.releases.source", "control characters"},
		},
		{
			name:   "space in the endpoint",
			mutate: func(c *v1.Cluster) { c.Spec.Network.Endpoint = "https://10.0.0.10:6443 --insecure" },
			want:   []string{"spec.network.endpoint", "control characters"},
		},
		{
			name:   "percentage over 100",
			mutate: func(c *v1.Cluster) { c.Spec.Disruption.MaxUnavailable = &pct },
			want:   []string{"spec.disruption.maxUnavailable", "percentage"},
		},
		{
			name:   "bad version format",
			mutate: func(c *v1.Cluster) { c.Spec.Version = "v1.2.3"; c.Spec.Releases.Catalog[0].Version = "v1.2.3" },
			want:   []string{"YYYY.MM.DD-NNN"},
		},
		{
			name:   "source not http",
			mutate: func(c *v1.Cluster) { c.Spec.Releases.Source = "ftp://example.com" },
			want:   []string{"spec.releases.source", "http:// or https://"},
		},
		{
			name:   "kernel argument the boot loader would misread",
			mutate: func(c *v1.Cluster) { c.Spec.Settings.KernelArgs = []string{"quiet", `root="/dev/sda 1"`} },
			want:   []string{"spec.settings.kernelArgs[1]", "printable ASCII without white space"},
		},
		{
			name: "window on an unknown day",
			mutate: func(c *v1.Cluster) {
				c.Spec.Disruption.Windows = []v1.MaintenanceWindow{window([]string{"Sat", "Sonntag"}, "22:00", 4*time.Hour, "Europe/Berlin")}
			},
			want: []string{"spec.disruption.windows[0].days[1]", `Unsupported value: "Sonntag"`},
		},
		{
			name: "window start not HH:MM",
			mutate: func(c *v1.Cluster) {
				c.Spec.Disruption.Windows = []v1.MaintenanceWindow{window([]string{"Sat"}, "22h", 4*time.Hour, "Europe/Berlin")}
			},
			want: []string{"spec.disruption.windows[0].start", "HH:MM"},
		},
		{
			name: "window over 7 days",
			mutate: func(c *v1.Cluster) {
				c.Spec.Disruption.Windows = []v1.MaintenanceWindow{window([]string{"Sat"}, "22:00", 8*24*time.Hour, "Europe/Berlin")}
			},
			want: []string{"spec.disruption.windows[0].duration", "at most 7 days"},
		},
		{
			name: "window of no time",
			mutate: func(c *v1.Cluster) {
				c.Spec.Disruption.Windows = []v1.MaintenanceWindow{window([]string{"Sat"}, "22:00", 0, "Europe/Berlin")}
			},
			want: []string{"spec.disruption.windows[0].duration", "more than 0"},
		},
		{
			name: "window time zone as an offset",
			mutate: func(c *v1.Cluster) {
				c.Spec.Disruption.Windows = []v1.MaintenanceWindow{window([]string{"Sat"}, "22:00", 4*time.Hour, "+01:00")}
			},
			want: []string{"spec.disruption.windows[0].timeZone", "IANA name"},
		},
		{
			name: "registry mirror for a path",
			mutate: func(c *v1.Cluster) {
				c.Spec.Settings.RegistryMirrors = []v1.RegistryMirror{{Registry: "../etc", Endpoints: []string{"https://mirror.example.com"}}}
			},
			want: []string{"spec.settings.registryMirrors[0].registry", "registry host such as docker.io"},
		},
		{
			name: "registry mirror endpoint that is no URL",
			mutate: func(c *v1.Cluster) {
				c.Spec.Settings.RegistryMirrors = []v1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"mirror.example.com"}}}
			},
			want: []string{"spec.settings.registryMirrors[0].endpoints[0]", "http:// or https:// URL"},
		},
		{
			name:   "kernel argument liken sets",
			mutate: func(c *v1.Cluster) { c.Spec.Settings.KernelArgs = []string{"liken.slot=B"} },
			want:   []string{"spec.settings.kernelArgs[0]", "liken.*"},
		},
		{
			name: "kernel argument that a trial's guard needs",
			mutate: func(c *v1.Cluster) {
				c.Spec.Settings.KernelArgs = []string{"quiet", "sysctl.kernel.softlockup_panic=0"}
			},
			want: []string{"spec.settings.kernelArgs[1]", "sets softlockup_panic, hung_task_panic and panic_on_oops on a trial boot"},
		},
		{
			name:   "sysctl that turns a trial's guard off",
			mutate: func(c *v1.Cluster) { c.Spec.Settings.Sysctls = map[string]string{"kernel.hung_task_panic": "0"} },
			want:   []string{"spec.settings.sysctls", "may only be set to 1"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster("refused")
			tc.mutate(c)
			_, err := cs.LikenV1alpha1().Clusters().Create(ctx, c, metav1.CreateOptions{})
			assert.Assert(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
			_, err = cs.LikenV1alpha1().Clusters().Get(ctx, "refused", metav1.GetOptions{})
			assert.Assert(t, apierrors.IsNotFound(err), "a refused document must change nothing")
		})
	}

	// An edit of spec.version to a release outside the catalog is refused
	// and leaves the stored object as it was.
	c, err := cs.LikenV1alpha1().Clusters().Create(ctx, cluster("edited"), metav1.CreateOptions{})
	assert.NilError(t, err)
	c.Spec.Version = "2026.12.01-001"
	_, err = cs.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
	assert.ErrorContains(t, err, "2026.12.01-001 is not in spec.releases.catalog")
	got, err := cs.LikenV1alpha1().Clusters().Get(ctx, "edited", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Equal(t, got.Spec.Version, "2026.10.10-001")

	// A Machine's cluster and role cannot change (a leader marked Worker
	// could go down beside another leader); its other fields can. A
	// refused update leaves the stored Machine as it was.
	for _, tc := range []struct {
		name   string
		role   v1.MachineRole
		mutate func(*v1.MachineSpec)
		want   []string // empty: the update is accepted
	}{
		{"cluster", v1.RoleLeader, func(s *v1.MachineSpec) { s.Cluster = "other" }, []string{"spec.cluster cannot change"}},
		{"role Leader to Worker", v1.RoleLeader, func(s *v1.MachineSpec) { s.Role = v1.RoleWorker },
			[]string{"spec.role", "spec.role cannot change", "beside another leader", "datastore its majority",
				"delete its Machine and install the machine again with the other role"}},
		{"role Worker to Leader", v1.RoleWorker, func(s *v1.MachineSpec) { s.Role = v1.RoleLeader }, []string{"spec.role", "spec.role cannot change"}},
		{"role left alone", v1.RoleLeader, func(s *v1.MachineSpec) { s.RebootPolicy = v1.RebootAuto }, nil},
	} {
		t.Run("update "+tc.name, func(t *testing.T) {
			name := "update-" + strings.ReplaceAll(strings.ToLower(tc.name), " ", "-")
			m, err := cs.LikenV1alpha1().Machines().Create(ctx, &v1.Machine{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       v1.MachineSpec{Cluster: "edited", Role: tc.role, RebootPolicy: v1.RebootManual},
			}, metav1.CreateOptions{})
			assert.NilError(t, err)
			before := m.Spec
			edited := m.DeepCopy()
			tc.mutate(&edited.Spec)
			_, err = cs.LikenV1alpha1().Machines().Update(ctx, edited, metav1.UpdateOptions{})
			got, gerr := cs.LikenV1alpha1().Machines().Get(ctx, name, metav1.GetOptions{})
			assert.NilError(t, gerr)
			if len(tc.want) == 0 {
				assert.NilError(t, err)
				assert.DeepEqual(t, got.Spec, edited.Spec)
				return
			}
			assert.Assert(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
			assert.DeepEqual(t, got.Spec, before)
			assert.Equal(t, got.ResourceVersion, m.ResourceVersion, "a refused update must change nothing")
		})
	}
	_, err = cs.LikenV1alpha1().Machines().Create(ctx, &v1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "node-9"},
		Spec:       v1.MachineSpec{Cluster: "edited", Role: "Boss"},
	}, metav1.CreateOptions{})
	assert.ErrorContains(t, err, `spec.role: Unsupported value: "Boss"`)

	// Hardware declarations that would escape their folder on the machine,
	// format something that is not a disk, or reach modprobe as options.
	for _, tc := range []struct {
		name   string
		mutate func(*v1.MachineSpec)
		want   []string
	}{
		{"port name with a path", func(s *v1.MachineSpec) { s.Ports = []v1.Port{{Name: "a/../../b"}} }, []string{"spec.ports[0].name", "interface name"}},
		{"port name ..", func(s *v1.MachineSpec) { s.Ports = []v1.Port{{Name: ".."}} }, []string{"spec.ports[0].name", "interface name"}},
		{"device outside /dev", func(s *v1.MachineSpec) {
			s.Disks = []v1.Disk{{Device: "/dev/../var/lib/kubelet/x", MountPoint: "/var/lib/data"}}
		}, []string{"spec.disks[0].device", "clean path under /dev"}},
		{"module parameter as an option", func(s *v1.MachineSpec) {
			s.KernelModules = []v1.KernelModule{{Name: "vfio", Parameters: []string{"--config=/var/x"}}}
		}, []string{"spec.kernelModules[0].parameters[0]", "option"}},
		{"module name as an option", func(s *v1.MachineSpec) { s.KernelModules = []v1.KernelModule{{Name: "-v"}} }, []string{"spec.kernelModules[0].name", "does not start with -"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &v1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "refused"}, Spec: v1.MachineSpec{Cluster: "edited", Role: v1.RoleWorker}}
			tc.mutate(&m.Spec)
			_, err := cs.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
			assert.Assert(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			for _, w := range tc.want {
				assert.Assert(t, is.Contains(err.Error(), w))
			}
			_, err = cs.LikenV1alpha1().Machines().Get(ctx, "refused", metav1.GetOptions{})
			assert.Assert(t, apierrors.IsNotFound(err), "a refused document must change nothing")
		})
	}
}

func window(days []string, start string, d time.Duration, zone string) v1.MaintenanceWindow {
	return v1.MaintenanceWindow{Days: days, Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: zone}
}

// TestSchemaKeepsEveryField stores fully populated objects and reads them
// back: a field the hand-written schema lacks would be pruned.
func TestSchemaKeepsEveryField(t *testing.T) {
	_, cs := setup(t)
	ctx := context.Background()
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	one := intstr.FromString("20%")
	c := cluster("full")
	c.Spec.Releases.PollInterval = &metav1.Duration{Duration: 30 * time.Minute}
	c.Spec.Network = v1.NetworkSpec{Endpoint: "https://10.0.0.10:6443", PodCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.10"}
	c.Spec.Settings = v1.SharedSettings{
		NTPServers:      []string{"ntp.example.com"},
		Sysctls:         map[string]string{"vm.max_map_count": "262144"},
		RegistryMirrors: []v1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example.com"}}},
		K3sArgs:         []string{"--flannel-backend=none"},
		KernelArgs:      []string{"mitigations=auto"},
		Banner:          "hello",
	}
	c.Spec.Disruption = v1.DisruptionSpec{
		MaxUnavailable: &one,
		DrainTimeout:   &metav1.Duration{Duration: time.Minute},
		TrialTimeout:   &metav1.Duration{Duration: 2 * time.Minute},
		StallTimeout:   &metav1.Duration{Duration: 3 * time.Minute},
		Settle:         &metav1.Duration{Duration: 45 * time.Second},
		Canary:         &v1.CanarySpec{Duration: metav1.Duration{Duration: 2 * time.Hour}},
		Gates: []v1.Gate{
			{BlockingPods: &v1.BlockingPodsGate{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"example.com/no-reboot": "true"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"db"}}}}, Namespaces: []string{"shop"}}},
			{Prometheus: &v1.PrometheusGate{URL: "http://prometheus.monitoring:9090", Alerts: "Kube.*|Etcd.*", Timeout: &metav1.Duration{Duration: 5 * time.Second}}},
		},
		Windows: []v1.MaintenanceWindow{window([]string{"Sat", "Sun"}, "22:00", 4*time.Hour, "Europe/Berlin"),
			window([]string{"Wed"}, "00:00", 7*24*time.Hour, "UTC")},
	}
	created, err := cs.LikenV1alpha1().Clusters().Create(ctx, c, metav1.CreateOptions{})
	assert.NilError(t, err)
	created.Status = v1.ClusterStatus{
		Phase:       v1.ClusterUpdating,
		Machines:    "1/2",
		Leaders:     []string{"node-1"},
		Endpoint:    "https://10.0.0.10:6443",
		RebootTurns: []v1.RebootTurn{{Machine: "node-2", Reason: v1.TurnRelease, Change: "abc", Leader: true, BootID: "b1", GrantedAt: now, Budgets: []string{"shop/web"}}},
		Turns:       "node-2",
		Settling:    []v1.SettlingMachine{{Machine: "node-1", Reason: v1.TurnReboot, Budgets: []string{"shop/db"}, GrantedAt: now, ReturnedAt: now}},
		Canary:      &v1.CanaryStatus{Machine: "node-2", Version: "2026.10.10-001", ReturnedAt: &now},
		Releases: v1.ReleasesStatus{Newest: "2026.10.10-001", Available: "2026.10.11-001", AvailableDigest: digest2,
			CheckedAt: &now, Error: "x", ObservedCheckRequest: "r"},
		Halt:               &v1.RolloutHalt{Reason: v1.ReasonTrialFailed, Machine: "node-2", Version: "2026.10.10-001", Message: "m", Since: now},
		ObservedResume:     "r1",
		Conditions:         []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Updating", Message: "m", LastTransitionTime: now, ObservedGeneration: 1}},
		ObservedGeneration: 1,
	}
	updated, err := cs.LikenV1alpha1().Clusters().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	assert.NilError(t, err)
	got, err := cs.LikenV1alpha1().Clusters().Get(ctx, "full", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, got.Spec, c.Spec)
	assert.DeepEqual(t, got.Status, updated.Status)
	assert.DeepEqual(t, got.Status, created.Status, cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) }))

	m := &v1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: v1.MachineSpec{
			Cluster: "full", Role: v1.RoleWorker, RebootPolicy: v1.RebootAuto,
			Disks:         []v1.Disk{{Device: "/dev/vdb", MountPoint: "/var/lib/data", Filesystem: "xfs"}},
			Ports:         []v1.Port{{Name: "eth0", MAC: "52:54:00:12:34:56", DHCP: false, Addresses: []string{"192.0.2.10/24"}, Gateway: "192.0.2.1", MTU: 9000}},
			KernelModules: []v1.KernelModule{{Name: "vfio-pci", Parameters: []string{"ids=10de:1eb8"}}},
		},
	}
	createdM, err := cs.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
	assert.NilError(t, err)
	createdM.Status = v1.MachineStatus{
		Phase: v1.MachineDownloading, Version: "2026.10.10-001", Slot: "A", Staged: "2026.10.11-001",
		Slots:                 []v1.SlotStatus{{Name: "A", State: v1.SlotActive, Version: "2026.10.10-001", Digest: digest1}, {Name: "B", State: v1.SlotDownloading}},
		Download:              &v1.DownloadProgress{Version: "2026.10.11-001", BytesDone: 10, BytesTotal: 20},
		Pending:               []v1.PendingChange{{Field: "cluster.spec.version", Class: v1.ClassReboot, Since: now}},
		Change:                "abc",
		ObservedRebootRequest: "r",
		Observed: v1.ObservedState{
			Disks:   []v1.ObservedDisk{{Device: "/dev/vdb", SizeBytes: 1 << 30, MountPoint: "/var/lib/data"}},
			Ports:   []v1.ObservedPort{{Name: "eth0", MAC: "52:54:00:12:34:56", Addresses: []string{"192.0.2.10/24"}, Up: true}},
			Modules: []string{"vfio_pci"}, BootID: "b1", LastBoot: &now,
		},
		Conditions:         []metav1.Condition{{Type: v1.ConditionTrialFailed, Status: metav1.ConditionFalse, Reason: "None", Message: "m", LastTransitionTime: now}},
		ObservedGeneration: 1,
	}
	want := createdM.Status
	_, err = cs.LikenV1alpha1().Machines().UpdateStatus(ctx, createdM, metav1.UpdateOptions{})
	assert.NilError(t, err)
	gotM, err := cs.LikenV1alpha1().Machines().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.DeepEqual(t, gotM.Spec, m.Spec)
	assert.DeepEqual(t, gotM.Status, want, cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) }))
}

// TestMachineIdentity checks that a machine writes only its own Machine's
// status, its own Node Lease, its own Node and events about its own
// Machine.
func TestMachineIdentity(t *testing.T) {
	cp, cs := setup(t)
	ctx := context.Background()
	for _, n := range []string{"node-1", "node-2"} {
		_, err := cs.LikenV1alpha1().Machines().Create(ctx, &v1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec:       v1.MachineSpec{Cluster: "c", Role: v1.RoleWorker},
		}, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
	_, err := cs.LikenV1alpha1().Clusters().Create(ctx, cluster("c"), metav1.CreateOptions{})
	assert.NilError(t, err)

	asNode1, err := versioned.NewForConfig(cp.Config("system:node:node-1"))
	assert.NilError(t, err)

	own, err := asNode1.LikenV1alpha1().Machines().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	own.Status.Phase = v1.MachineReady
	_, err = asNode1.LikenV1alpha1().Machines().UpdateStatus(ctx, own, metav1.UpdateOptions{})
	assert.NilError(t, err)

	other, err := asNode1.LikenV1alpha1().Machines().Get(ctx, "node-2", metav1.GetOptions{})
	assert.NilError(t, err)
	other.Status.Phase = v1.MachineReady
	_, err = asNode1.LikenV1alpha1().Machines().UpdateStatus(ctx, other, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)
	assert.ErrorContains(t, err, "may write only the status of its own Machine node-1")

	own, err = asNode1.LikenV1alpha1().Machines().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	own.Spec.RebootPolicy = v1.RebootAuto
	_, err = asNode1.LikenV1alpha1().Machines().Update(ctx, own, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)

	c, err := asNode1.LikenV1alpha1().Clusters().Get(ctx, "c", metav1.GetOptions{})
	assert.NilError(t, err, "a machine reads its Cluster")
	c.Status.Phase = v1.ClusterReady
	_, err = asNode1.LikenV1alpha1().Clusters().UpdateStatus(ctx, c, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)

	// kubectl as the machine: its own status, and not another's.
	kc := cp.MachineKubeconfig("node-1")
	_, err = cp.KubectlAs(ctx, kc, "patch", "machine", "node-1", "--subresource", "status", "--type", "merge", "-p", `{"status":{"slot":"A"}}`)
	assert.NilError(t, err)
	out, err := cp.KubectlAs(ctx, kc, "patch", "machine", "node-2", "--subresource", "status", "--type", "merge", "-p", `{"status":{"slot":"A"}}`)
	assert.ErrorContains(t, err, "exit status")
	assert.Assert(t, is.Contains(out, "Forbidden"))

	// Leases: its own Node Lease (its heartbeat, as the kubelet renews it),
	// not another machine's, and none in liken-system.
	lease := `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"%[1]s","namespace":"%[2]s"},"spec":{"holderIdentity":"%[1]s"}}`
	_, err = kubectlStdin(ctx, kc, fmt.Sprintf(lease, "node-1", "kube-node-lease"))
	assert.NilError(t, err)
	out, err = kubectlStdin(ctx, kc, fmt.Sprintf(lease, "node-2", "kube-node-lease"))
	assert.ErrorContains(t, err, "exit status")
	assert.Assert(t, is.Contains(out, "can only access node lease with the same name as the requesting node"))
	out, err = kubectlStdin(ctx, kc, fmt.Sprintf(lease, "node-1", v1.SystemNamespace))
	assert.ErrorContains(t, err, "exit status")
	assert.Assert(t, is.Contains(out, `can only access leases in the "kube-node-lease" system namespace`))

	// Nodes: the policy lets it change its own and no other.
	kube := twoNodes(t, cp)
	asNode1Kube, err := kubernetes.NewForConfig(cp.Config("system:node:node-1"))
	assert.NilError(t, err)
	err = cordon(ctx, asNode1Kube, "node-2")
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)
	// NodeRestriction refuses it before the policy would.
	assert.ErrorContains(t, err, `node "node-1" is not allowed to modify node "node-2"`)
	assert.NilError(t, cordon(ctx, asNode1Kube, "node-1"))
	n, err := kube.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, n.Spec.Unschedulable)

	// Events, through either events API (the kubelet writes core v1
	// events, liken-node events.k8s.io ones): about its own Machine as
	// liken-node; about its own Node and about pods as liken-node or as its
	// kubelet (which reports pulls, starts and its Node's conditions);
	// nothing else.
	for _, tc := range []struct {
		kind, name, reporter, want string
	}{
		{kind: "Machine", name: "node-1"},
		{kind: "Node", name: "node-1"},
		{kind: "Node", name: "node-1", reporter: "kubelet"},
		{kind: "Pod", name: "web-1", reporter: "kubelet"},
		{kind: "Machine", name: "node-2", want: "machine node-1 may record events only about its own Machine or Node node-1 and about pods"},
		{kind: "Node", name: "node-2", reporter: "kubelet", want: "machine node-1 may record events only about its own Machine or Node node-1 and about pods"},
		{kind: "Cluster", name: "node-1", want: "machine node-1 may record events only about its own Machine or Node node-1 and about pods"},
		{kind: "Machine", name: "node-1", reporter: "cluster-operator", want: "machine node-1 may report events only as liken-node, or as kubelet about its Node and pods, not as cluster-operator"},
		{kind: "Machine", name: "node-1", reporter: "kubelet", want: "not as kubelet"},
		{kind: "Pod", name: "web-1", reporter: "cluster-operator", want: "not as cluster-operator"},
	} {
		reporter := tc.reporter
		if reporter == "" {
			reporter = "liken-node"
		}
		ev := event(tc.kind, tc.name)
		ev.ReportingController = reporter
		_, err := asNode1Kube.EventsV1().Events("default").Create(ctx, ev, metav1.CreateOptions{})
		core := coreEvent(tc.kind, tc.name, reporter)
		_, coreErr := asNode1Kube.CoreV1().Events("default").Create(ctx, core, metav1.CreateOptions{})
		// As older clients write them: the reporter in source.component only.
		core = coreEvent(tc.kind, tc.name, reporter)
		core.ReportingController, core.ReportingInstance = "", ""
		_, sourceErr := asNode1Kube.CoreV1().Events("default").Create(ctx, core, metav1.CreateOptions{})
		for api, err := range map[string]error{"events.k8s.io": err, "core v1": coreErr, "core v1, source only": sourceErr} {
			if tc.want == "" {
				assert.Check(t, err, "%s event about %s %s", api, tc.kind, tc.name)
				continue
			}
			assert.Check(t, apierrors.IsForbidden(err), "%s event about %s %s: got %v", api, tc.kind, tc.name, err)
			assert.Check(t, is.ErrorContains(err, tc.want), "%s event about %s %s", api, tc.kind, tc.name)
		}
	}
}

// TestMachineNodeScope checks, on an API server that runs NodeRestriction
// (as every test and the lab do, and production requires), that a machine
// changes only its own Node and evicts only the pods bound to it.
func TestMachineNodeScope(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()
	kube := twoNodes(t, cp)
	asNode1, err := kubernetes.NewForConfig(cp.Config("system:node:node-1"))
	assert.NilError(t, err)

	ns := "workload"
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	assert.NilError(t, err)
	// The service-account controller creates the namespace's default
	// ServiceAccount, which every pod needs.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return poll.Continue("ServiceAccount %s/default: %v", ns, err)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	for _, node := range []string{"node-1", "node-2"} {
		_, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "on-" + node},
			Spec: corev1.PodSpec{
				NodeName:    node,
				Containers:  []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
				Tolerations: []corev1.Toleration{{Key: controlplane.KwokAnnotation, Operator: corev1.TolerationOpExists}},
			},
		}, metav1.CreateOptions{})
		assert.NilError(t, err)
	}
	// kwok runs as the admin, so NodeRestriction leaves its simulated
	// kubelets alone: the Nodes go Ready and the pods run.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, node := range []string{"node-1", "node-2"} {
			n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return poll.Continue("Node %s: %v", node, err)
			}
			if !nodeIsReady(n) {
				return poll.Continue("Node %s is not Ready: %v", node, n.Status.Conditions)
			}
			p, err := kube.CoreV1().Pods(ns).Get(ctx, "on-"+node, metav1.GetOptions{})
			if err != nil {
				return poll.Continue("pod on-%s: %v", node, err)
			}
			if p.Status.Phase != corev1.PodRunning {
				return poll.Continue("pod on-%s is %s", node, p.Status.Phase)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(200*time.Millisecond))

	getPod := func(name string) func() error {
		return func() error { _, err := asNode1.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); return err }
	}
	listPods := func(selector string) func() error {
		return func() error {
			_, err := asNode1.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: selector})
			return err
		}
	}
	cases := []struct {
		name string
		do   func() error
		want string // empty: allowed
	}{
		// Pods: only those bound to it, as the Node authorizer allows;
		// liken grants no read of pods of its own.
		{name: "read a pod bound to its own Node", do: getPod("on-node-1")},
		{name: "list the pods bound to its own Node", do: listPods("spec.nodeName=node-1")},
		{name: "read a pod bound to another Node", do: getPod("on-node-2"), want: "no relationship found between node 'node-1' and this object"},
		{name: "list every pod", do: listPods(""), want: `cannot list resource "pods"`},
		{name: "list the pods bound to another Node", do: listPods("spec.nodeName=node-2"), want: `cannot list resource "pods"`},
		{
			name: "patch another Node",
			do:   func() error { return cordon(ctx, asNode1, "node-2") },
			want: `node "node-1" is not allowed to modify node "node-2"`,
		},
		{
			name: "evict a pod bound to another Node",
			do:   func() error { return evict(ctx, asNode1, ns, "on-node-2") },
			want: "node-1 can only evict pods with spec.nodeName set to itself",
		},
		{
			name: "patch its own Node",
			do:   func() error { return cordon(ctx, asNode1, "node-1") },
		},
		{
			name: "evict a pod bound to its own Node",
			do:   func() error { return evict(ctx, asNode1, ns, "on-node-1") },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if tc.want == "" {
				assert.NilError(t, err)
				return
			}
			assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)
			assert.ErrorContains(t, err, tc.want)
		})
	}

	n, err := kube.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, !n.Spec.Unschedulable, "node-2 was cordoned by node-1")
	p, err := kube.CoreV1().Pods(ns).Get(ctx, "on-node-2", metav1.GetOptions{})
	assert.NilError(t, err, "the pod on node-2 is gone")
	assert.Check(t, p.DeletionTimestamp == nil, "node-1 evicted the pod on node-2")
	p, err = kube.CoreV1().Pods(ns).Get(ctx, "on-node-1", metav1.GetOptions{})
	assert.Check(t, apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), "the pod on node-1 was not evicted: %v", err)

	// The machine renews its own Node Lease, the one kwok renewed for it
	// until then, as a kubelet does.
	leases := asNode1.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	l, err := leases.Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	l.Spec.HolderIdentity = ptr.To("node-1")
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	assert.NilError(t, err)
	l2, err := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "node-2", metav1.GetOptions{})
	assert.NilError(t, err)
	l2.Spec.HolderIdentity = ptr.To("node-1")
	_, err = asNode1.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l2, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "node-1 renewed the Lease of node-2: %v", err)
}

// twoNodes registers the Nodes node-1 and node-2 (simulated by kwok) and
// returns an admin clientset.
func twoNodes(t *testing.T, cp *controlplane.ControlPlane) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	for _, n := range []string{"node-1", "node-2"} {
		assert.NilError(t, cp.AddNode(ctx, n, nil))
	}
	kube, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	return kube
}

func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// cordon patches a Node as liken-node does when it cordons it.
func cordon(ctx context.Context, c kubernetes.Interface, node string) error {
	patch := `{"metadata":{"annotations":{"` + v1.AnnotationCordoned + `":"test"}},"spec":{"unschedulable":true}}`
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// evict asks the Eviction API to evict a pod.
func evict(ctx context.Context, c kubernetes.Interface, ns, pod string) error {
	return c.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns}})
}

// event is an event about kind/name, as liken-node records them.
func event(kind, name string) *eventsv1.Event {
	return &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: name + "-", Namespace: "default"},
		EventTime:           metav1.NowMicro(),
		Regarding:           corev1.ObjectReference{APIVersion: "liken.sh/v1alpha1", Kind: kind, Name: name},
		Reason:              "Test",
		Action:              "Test",
		Type:                corev1.EventTypeNormal,
		Note:                "an event",
		ReportingController: "liken-node", // as liken-node's recorder reports
		ReportingInstance:   "liken-node-" + name,
	}
}

// coreEvent is a core v1 event about kind/name reported by reporter, as
// the kubelet records them.
func coreEvent(kind, name, reporter string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: name + "-", Namespace: "default"},
		InvolvedObject:      corev1.ObjectReference{Kind: kind, Name: name, Namespace: "default"},
		Reason:              "Test",
		Message:             "an event",
		Type:                corev1.EventTypeNormal,
		Source:              corev1.EventSource{Component: reporter, Host: "node-1"},
		ReportingController: reporter,
		ReportingInstance:   "node-1",
		FirstTimestamp:      metav1.Now(),
		LastTimestamp:       metav1.Now(),
		Count:               1,
	}
}

// joinFleet starts the control plane with cluster-operator (the approver
// of machines' certificates), creates Machines for names, and gives each a
// join token of its own, valid for ttl, as a leader's init does with a
// layer's. It returns the tokens by machine.
func joinFleet(t *testing.T, ttl time.Duration, names ...string) (*controlplane.ControlPlane, map[string]nodecp.MachineToken) {
	t.Helper()
	cp, cs := setup(t)
	ctx := context.Background()
	tokens := map[string]nodecp.MachineToken{}
	var list []nodecp.MachineToken
	for _, n := range names {
		_, err := cs.LikenV1alpha1().Machines().Create(ctx, &v1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec:       v1.MachineSpec{Cluster: "c", Role: v1.RoleWorker},
		}, metav1.CreateOptions{})
		assert.NilError(t, err)
		tok, err := layer.NewJoinToken(nil)
		assert.NilError(t, err)
		tokens[n] = nodecp.MachineToken{Machine: n, Token: tok, Expires: time.Now().Add(ttl)}
		list = append(list, tokens[n])
	}
	assert.NilError(t, cp.CreateJoinTokens(ctx, list))
	fleetsim.StartOperator(t, cp, "op-1")
	return cp, tokens
}

// csrVerdict waits until a certificate request of the user for the named
// machine is decided, and returns its condition's type and reason.
func csrVerdict(t *testing.T, cp *controlplane.ControlPlane, requester, machine string) (string, string) {
	t.Helper()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	var typ, reason string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		list, err := admin.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return poll.Error(err)
		}
		for _, c := range list.Items {
			blk, _ := pem.Decode(c.Spec.Request)
			req, err := x509.ParseCertificateRequest(blk.Bytes)
			if err != nil || c.Spec.Username != requester || req.Subject.CommonName != "system:node:"+machine || len(c.Status.Conditions) == 0 {
				continue
			}
			typ, reason = string(c.Status.Conditions[0].Type), c.Status.Conditions[0].Reason
			return poll.Success()
		}
		return poll.Continue("no decided request of %s for %s", requester, machine)
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	return typ, reason
}

// TestMachineJoins follows a machine that starts with its own join token
// only: the token alone reads nothing of the fleet; with it, the machine
// asks for a kubelet client certificate through TLS bootstrap,
// cluster-operator approves it for the token's own machine and the
// controller manager signs it, and from then on the machine is
// system:node:<name>. A machine with a valid certificate does not ask
// again; once its renewal is due it renews with the certificate itself.
func TestMachineJoins(t *testing.T) {
	cp, tokens := joinFleet(t, time.Hour, "node-3")
	ctx := context.Background()
	boot := filepath.Join(t.TempDir(), "bootstrap.kubeconfig")
	assert.NilError(t, cp.WriteBootstrapKubeconfig(boot, tokens["node-3"].Token))

	out, err := cp.KubectlAs(ctx, boot, "get", "machines")
	assert.ErrorContains(t, err, "exit status", "the join token read the Machines: %s", out)
	assert.Assert(t, is.Contains(out, `User "system:bootstrap:`))
	assert.Assert(t, is.Contains(out, "forbidden"))

	kc := filepath.Join(t.TempDir(), "node-3.kubeconfig")
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	bootCfg := cp.BootstrapConfig(tokens["node-3"].Token)
	assert.NilError(t, join.Join(jctx, join.Options{Machine: "node-3", Bootstrap: bootCfg, Kubeconfig: kc}))
	out, err = cp.KubectlAs(ctx, kc, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}")
	assert.NilError(t, err, out)
	assert.Equal(t, out, `system:node:node-3 ["system:nodes","system:authenticated"]`)
	id, _, err := tokens["node-3"].Split()
	assert.NilError(t, err)
	typ, reason := csrVerdict(t, cp, "system:bootstrap:"+id, "node-3")
	assert.Equal(t, typ+" "+reason, "Approved "+nodeclients.ReasonOwnJoinToken)

	csrs := func() string {
		out, err := cp.Kubectl(ctx, "get", "csr", "-o", `jsonpath={range .items[*]}{.spec.username} {.status.conditions[0].type}{"\n"}{end}`)
		assert.NilError(t, err, out)
		return out
	}
	before := csrs()
	assert.NilError(t, join.Join(jctx, join.Options{Machine: "node-3", Bootstrap: bootCfg, Kubeconfig: kc}))
	assert.Equal(t, csrs(), before, "a machine with a valid certificate asked for another")

	// The certificate is node-3's: it is not another machine's identity.
	assert.ErrorContains(t, join.Check(kc, "node-1", time.Now()), `holds the certificate of "system:node:node-3", not of "system:node:node-1"`)

	// Past two thirds of its life, it renews with the certificate itself,
	// no token needed, and the client reads the new one from the file.
	old, err := os.ReadFile(join.KeyFile(kc))
	assert.NilError(t, err)
	later := func() time.Time { return time.Now().Add(300 * 24 * time.Hour) }
	assert.NilError(t, join.Renew(jctx, join.Options{Machine: "node-3", Kubeconfig: kc, Now: later}))
	renewed, err := os.ReadFile(join.KeyFile(kc))
	assert.NilError(t, err)
	assert.Assert(t, string(renewed) != string(old), "the certificate was not renewed")
	typ, reason = csrVerdict(t, cp, "system:node:node-3", "node-3")
	assert.Equal(t, typ+" "+reason, "Approved "+nodeclients.ReasonOwnCertificate)
	out, err = cp.KubectlAs(ctx, kc, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	assert.NilError(t, err, out)
	assert.Equal(t, out, "system:node:node-3")
}

// TestJoinTokenGetsItsOwnMachineOnly: a worker's token asking for a
// leader's name is denied, and a machine's own certificate cannot ask for
// another's: no credential on a worker's disk acts as another machine.
func TestJoinTokenGetsItsOwnMachineOnly(t *testing.T) {
	cp, tokens := joinFleet(t, time.Hour, "worker-1", "leader-2")
	ctx := context.Background()
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	stolen := filepath.Join(t.TempDir(), "leader-2.kubeconfig")
	err := join.Join(jctx, join.Options{Machine: "leader-2", Bootstrap: cp.BootstrapConfig(tokens["worker-1"].Token), Kubeconfig: stolen})
	assert.ErrorContains(t, err, "denied")
	id, _, err := tokens["worker-1"].Split()
	assert.NilError(t, err)
	typ, reason := csrVerdict(t, cp, "system:bootstrap:"+id, "leader-2")
	assert.Equal(t, typ+" "+reason, "Denied "+nodeclients.ReasonAnotherMachine)
	_, err = os.Stat(stolen)
	assert.Assert(t, os.IsNotExist(err), "a denied join wrote %s", stolen)
	out, err := cp.Kubectl(ctx, "get", "events", "-o", `jsonpath={range .items[*]}{.involvedObject.name} {.reason}{"\n"}{end}`)
	assert.NilError(t, err, out)
	assert.Assert(t, is.Contains(out, "leader-2 "+nodeclients.EventCertificateRefused), "no Warning on the Machine whose name was asked for")

	// worker-1's own certificate, asking for leader-2's name.
	kc := filepath.Join(t.TempDir(), "worker-1.kubeconfig")
	assert.NilError(t, join.Join(jctx, join.Options{Machine: "worker-1", Bootstrap: cp.BootstrapConfig(tokens["worker-1"].Token), Kubeconfig: kc}))
	self, err := clientcmd.BuildConfigFromFlags("", kc)
	assert.NilError(t, err)
	asWorker, err := kubernetes.NewForConfig(self)
	assert.NilError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	req, err := cert.MakeCSR(key, &pkix.Name{CommonName: "system:node:leader-2", Organization: []string{join.NodeGroup}}, nil, nil)
	assert.NilError(t, err)
	_, _, err = csr.RequestCertificateWithContext(ctx, asWorker, req, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
	// NodeRestriction refuses it before cluster-operator would deny it
	// (controllers/nodeclients TestDecide, "renewal for another name").
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)
	assert.ErrorContains(t, err, "can only create a node CSR with CN=system:node:worker-1")
}

// TestJoinTokenExpires: the API server refuses a machine's join token once
// its expiry has passed.
func TestJoinTokenExpires(t *testing.T) {
	cp, tokens := joinFleet(t, 5*time.Second, "worker-1")
	ctx := context.Background()
	boot := filepath.Join(t.TempDir(), "bootstrap.kubeconfig")
	assert.NilError(t, cp.WriteBootstrapKubeconfig(boot, tokens["worker-1"].Token))
	out, err := cp.KubectlAs(ctx, boot, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	assert.NilError(t, err, "the token before its expiry: %s", out)
	// The API server keeps a token's answer for 10 s: refused within that
	// of its expiry.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		out, err = cp.KubectlAs(ctx, boot, "auth", "whoami")
		if err == nil {
			return poll.Continue("the token is still accepted, %s after its expiry", time.Since(tokens["worker-1"].Expires).Round(time.Second))
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second+30*time.Second), poll.WithDelay(500*time.Millisecond))
	assert.Assert(t, time.Now().After(tokens["worker-1"].Expires), "refused before its expiry: %s", out)
	assert.Assert(t, is.Contains(out, "Unauthorized"))
}

// TestOperatorRunsOnLeadersOnly: cluster-operator's Deployment, as the
// manifests have it, never puts a copy on a worker, and puts its two
// copies on two leaders when two can take them; a worker cannot give its
// own Node the leaders' label.
func TestOperatorRunsOnLeadersOnly(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()
	// node-1 and node-2 are machines (their identities issued at start),
	// and workers.
	kube := twoNodes(t, cp)
	assert.NilError(t, cp.AddNode(ctx, "leader-1", map[string]string{v1.LeaderNodeLabel: "true"}))

	asWorker, err := kubernetes.NewForConfig(cp.Config("system:node:node-1"))
	assert.NilError(t, err)
	_, err = asWorker.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+v1.LeaderNodeLabel+`":"true"}}}`), metav1.PatchOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "a worker labelled its own Node a leader's: %v", err)
	assert.ErrorContains(t, err, "is not allowed to modify labels: "+v1.LeaderNodeLabel)

	// operatorPods waits until want copies are scheduled, none named gone,
	// and says how many each Node runs.
	operatorPods := func(want int, gone string) map[string]int {
		t.Helper()
		var on map[string]int
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			pods, err := kube.CoreV1().Pods(v1.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cluster-operator"})
			if err != nil {
				return poll.Error(err)
			}
			on = map[string]int{}
			for _, p := range pods.Items {
				if p.Name == gone || p.DeletionTimestamp != nil {
					return poll.Continue("pod %s is going", p.Name)
				}
				if p.Spec.NodeName == "" {
					return poll.Continue("pod %s is not scheduled yet", p.Name)
				}
				on[p.Spec.NodeName]++
			}
			if len(pods.Items) != want {
				return poll.Continue("%d of %d copies", len(pods.Items), want)
			}
			return poll.Success()
		}, poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))
		return on
	}
	assert.DeepEqual(t, operatorPods(2, ""), map[string]int{"leader-1": 2})

	// A second leader: a copy that goes is placed there, not beside the
	// other.
	assert.NilError(t, cp.AddNode(ctx, "leader-2", map[string]string{v1.LeaderNodeLabel: "true"}))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		n, err := kube.CoreV1().Nodes().Get(ctx, "leader-2", metav1.GetOptions{})
		if err != nil || !nodeIsReady(n) || len(n.Spec.Taints) > 0 {
			return poll.Continue("leader-2 is not Ready and schedulable yet")
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))
	pods, err := kube.CoreV1().Pods(v1.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=cluster-operator"})
	assert.NilError(t, err)
	assert.NilError(t, kube.CoreV1().Pods(v1.SystemNamespace).Delete(ctx, pods.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	assert.DeepEqual(t, operatorPods(2, pods.Items[0].Name), map[string]int{"leader-1": 1, "leader-2": 1})
}

// TestReleaseMovers: with docs/examples/release-movers.yaml applied, a
// member of liken:release-movers moves a fleet's release (spec.version and
// the catalog) and can change nothing else that would run on the machines.
func TestReleaseMovers(t *testing.T) {
	cp, cs := setup(t)
	ctx := context.Background()
	out, err := cp.Kubectl(ctx, "apply", "-f", filepath.Join("..", "..", "docs", "examples", "release-movers.yaml"))
	assert.NilError(t, err, out)
	c := cluster("c")
	c.Spec.Settings.Banner = "fleet c"
	_, err = cs.LikenV1alpha1().Clusters().Create(ctx, c, metav1.CreateOptions{})
	assert.NilError(t, err)
	moverCfg := rest.CopyConfig(cp.AdminConfig())
	moverCfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"liken:release-movers", "system:authenticated"}}
	mover, err := versioned.NewForConfig(moverCfg)
	assert.NilError(t, err)

	// Merge patches, as kubectl patch and liken rollout write them.
	change := func(patch string) error {
		_, err := mover.LikenV1alpha1().Clusters().Patch(ctx, "c", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	// The API server loads a new policy within a few seconds.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		err := change(`{"spec":{"settings":{"k3sArgs":["--v=9"]}}}`)
		if err == nil {
			return poll.Error(errors.New("a release mover changed spec.settings before the policy was in force: the test cannot tell"))
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not spec.settings") {
			return poll.Continue("not refused by the policy yet: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))

	assert.NilError(t, change(`{"spec":{"version":"2026.10.11-001","releases":{"catalog":[{"version":"2026.10.10-001","digest":"`+digest1+`"},{"version":"2026.10.11-001","digest":"`+digest2+`"}]}}}`),
		"a release mover moves the release")
	for _, tc := range []struct{ field, patch string }{
		{"spec.settings", `{"spec":{"settings":{"kernelArgs":["init=/bin/sh"]}}}`},
		{"spec.settings", `{"spec":{"settings":null}}`},
		{"spec.network", `{"spec":{"network":{"endpoint":"https://10.0.0.99:6443"}}}`},
		{"spec.disruption", `{"spec":{"disruption":{"maxUnavailable":5}}}`},
		{"spec.releases.source", `{"spec":{"releases":{"source":"https://elsewhere.example.com"}}}`},
	} {
		err := change(tc.patch)
		assert.Check(t, apierrors.IsForbidden(err), "%s: %v", tc.patch, err)
		assert.Check(t, is.ErrorContains(err, "a release mover may change spec.version and spec.releases.catalog only, not "+tc.field), tc.patch)
	}
	m := &v1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: v1.MachineSpec{Cluster: "c", Role: v1.RoleWorker}}
	_, err = cs.LikenV1alpha1().Machines().Create(ctx, m, metav1.CreateOptions{})
	assert.NilError(t, err)
	m, err = mover.LikenV1alpha1().Machines().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err)
	m.Spec.KernelModules = []v1.KernelModule{{Name: "evil"}}
	_, err = mover.LikenV1alpha1().Machines().Update(ctx, m, metav1.UpdateOptions{})
	assert.Check(t, apierrors.IsForbidden(err), "a release mover changed a Machine: %v", err)
	got, err := cs.LikenV1alpha1().Clusters().Get(ctx, "c", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(got.Spec.Version, "2026.10.11-001"))
	assert.Check(t, is.Len(got.Spec.Settings.K3sArgs, 0))
}

// TestNodeGroupWithoutMachineName: an identity in group system:nodes that
// is not named system:node:<machine> gets the group's RBAC, and the
// admission policy refuses it every write a machine may make, instead of
// leaving it unconfined.
func TestNodeGroupWithoutMachineName(t *testing.T) {
	cp, cs := setup(t)
	ctx := context.Background()
	_, err := cs.LikenV1alpha1().Machines().Create(ctx, &v1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec:       v1.MachineSpec{Cluster: "c", Role: v1.RoleWorker},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)

	// The admin signs a client certificate for "rogue" in system:nodes (the
	// kubelet signer would refuse such a name; the general client signer
	// takes whatever an administrator approves).
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	req, err := cert.MakeCSR(key, &pkix.Name{CommonName: "rogue", Organization: []string{controlplane.NodeGroup}}, nil, nil)
	assert.NilError(t, err)
	name, uid, err := csr.RequestCertificateWithContext(ctx, admin, req, "", certificatesv1.KubeAPIServerClientSignerName, nil,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
	assert.NilError(t, err)
	c, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	assert.NilError(t, err)
	c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "a rogue identity for the test",
	})
	_, err = admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, c, metav1.UpdateOptions{})
	assert.NilError(t, err)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(wctx, admin, name, uid)
	assert.NilError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	assert.NilError(t, err)
	rogueCfg := rest.AnonymousClientConfig(cp.AdminConfig())
	rogueCfg.CertData, rogueCfg.KeyData = certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	rogue, err := versioned.NewForConfig(rogueCfg)
	assert.NilError(t, err)

	m, err := rogue.LikenV1alpha1().Machines().Get(ctx, "node-1", metav1.GetOptions{})
	assert.NilError(t, err, "the group's RBAC lets it read Machines")
	m.Status.Phase = v1.MachineReady
	_, err = rogue.LikenV1alpha1().Machines().UpdateStatus(ctx, m, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "got %v", err)
	assert.ErrorContains(t, err, "user rogue is in group system:nodes but is not a machine (system:node:<machine>)")
}

// TestOperatorScope: cluster-operator, as the lab runs it (its service
// account's name), holds only its own leader Lease and records events only
// where the events of Clusters and Machines live.
func TestOperatorScope(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	assert.NilError(t, err)
	op, err := kubernetes.NewForConfig(cp.Config(controlplane.OperatorUser))
	assert.NilError(t, err)

	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.SystemNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("op-1")}}
	}
	own, err := op.CoordinationV1().Leases(v1.SystemNamespace).Create(ctx, lease("cluster-operator"), metav1.CreateOptions{})
	assert.NilError(t, err, "the operator creates its leader Lease")
	own.Spec.HolderIdentity = ptr.To("op-2")
	_, err = op.CoordinationV1().Leases(v1.SystemNamespace).Update(ctx, own, metav1.UpdateOptions{})
	assert.NilError(t, err, "the operator renews its leader Lease")

	other, err := admin.CoordinationV1().Leases(v1.SystemNamespace).Create(ctx, lease("someone-else"), metav1.CreateOptions{})
	assert.NilError(t, err)
	other.Spec.HolderIdentity = ptr.To("op-1")
	_, err = op.CoordinationV1().Leases(v1.SystemNamespace).Update(ctx, other, metav1.UpdateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "the operator took another Lease in %s: %v", v1.SystemNamespace, err)

	ev := event("Cluster", "c")
	ev.ReportingController = "cluster-operator"
	_, err = op.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{})
	assert.NilError(t, err, "the operator records an event about a Cluster")
	ev.Namespace = metav1.NamespaceSystem
	_, err = op.EventsV1().Events(metav1.NamespaceSystem).Create(ctx, ev, metav1.CreateOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "the operator wrote an event in %s: %v", metav1.NamespaceSystem, err)

	// The drain check reads pods and PodDisruptionBudgets everywhere, and
	// changes neither.
	_, err = op.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	assert.NilError(t, err, "the operator lists pods")
	_, err = op.PolicyV1().PodDisruptionBudgets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	assert.NilError(t, err, "the operator lists PodDisruptionBudgets")
	w, err := op.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{})
	assert.NilError(t, err, "the operator watches pods")
	w.Stop()
	err = op.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "any", metav1.DeleteOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "the operator may delete pods: %v", err)
	err = op.CoreV1().Pods(metav1.NamespaceDefault).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "any", Namespace: metav1.NamespaceDefault}})
	assert.Assert(t, apierrors.IsForbidden(err), "the operator may evict pods: %v", err)
	err = op.PolicyV1().PodDisruptionBudgets(metav1.NamespaceDefault).Delete(ctx, "any", metav1.DeleteOptions{})
	assert.Assert(t, apierrors.IsForbidden(err), "the operator may delete PodDisruptionBudgets: %v", err)
}

// TestMachineReadsTheNetwork: with its own credential, a machine reads
// what its kube-proxy and its pod routes need: every Node, Service and
// EndpointSlice (Kubernetes' proxier role, bound to the machines' group by
// liken's manifests), and may not change a Service.
func TestMachineReadsTheNetwork(t *testing.T) {
	cp, _ := setup(t)
	ctx := context.Background()
	twoNodes(t, cp)
	asNode1, err := kubernetes.NewForConfig(cp.Config("system:node:node-1"))
	assert.NilError(t, err)

	nodes, err := asNode1.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Len(nodes.Items, 2), "the other machines' Nodes, whose pod ranges it routes")
	_, err = asNode1.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	_, err = asNode1.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	assert.NilError(t, err, "kube-proxy reads every EndpointSlice")
	svc, err := asNode1.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	assert.NilError(t, err)
	svc.Labels = map[string]string{"changed": "by-a-machine"}
	_, err = asNode1.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{})
	assert.Check(t, apierrors.IsForbidden(err), "a machine changed a Service: %v", err)
}
