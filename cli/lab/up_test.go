package lab

import (
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/layer"
	"liken.sh/liken/internal/qemu"
	"liken.sh/liken/internal/trust"
)

// TestStartupGraceArgs: LIKEN_LAB_STARTUP_GRACE becomes the operator's
// --startup-grace; unset or empty keeps the operator's default; anything
// but a duration of zero or more is refused, naming the variable.
func TestStartupGraceArgs(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
		err   string
	}{
		{value: "", want: nil},
		{value: "5s", want: []string{"--startup-grace=5s"}},
		{value: "1m30s", want: []string{"--startup-grace=1m30s"}},
		{value: "0", want: []string{"--startup-grace=0s"}},
		{value: "5", err: `LIKEN_LAB_STARTUP_GRACE="5" is not a duration`},
		{value: "-1s", err: `LIKEN_LAB_STARTUP_GRACE="-1s" is not a duration`},
		{value: "soon", err: `LIKEN_LAB_STARTUP_GRACE="soon" is not a duration`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv(startupGraceEnv, tc.value)
			got, err := startupGraceArgs()
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// TestFleetDocumentsPack: the lab's documents pass liken layer's checks for
// every shape of lab, several leaders included (they carry the reach URL
// annotations), and each leader's control plane configuration derives.
func TestFleetDocumentsPack(t *testing.T) {
	for _, o := range []upOptions{
		{name: "lab", machines: 5, leaders: 3, policy: "Manual"},
		{name: "lab", machines: 1, leaders: 1, policy: "Auto"},
		{name: "vm", machines: 3, leaders: 1, policy: "Auto", vm: true},
		{name: "vm", machines: 5, leaders: 3, policy: "Auto", vm: true},
	} {
		t.Run(fmt.Sprintf("%d/%d vm=%v", o.machines, o.leaders, o.vm), func(t *testing.T) {
			// The VM lab's leaders are reached through this computer at
			// their forwarded ports, when there are several.
			var reach map[string]string
			settings := ""
			if o.vm {
				caPEM, _, _, err := channelCertificate(t.TempDir())
				assert.NilError(t, err)
				settings = labServers{caPEM: caPEM, names: 5353, registry: 5000}.settings(qemu.HostAddress)
			}
			if o.vm && o.leaders > 1 {
				reach = map[string]string{}
				for i, n := range machineNames(o.leaders) {
					reach[n] = reachAnnotations("10.0.2.2", leaderPorts{30000 + 3*i, 30001 + 3*i, 30002 + 3*i})
				}
			}
			docs := fleetDocuments(o, "https://10.0.2.2:7443", "http://10.0.2.2:8080", "2026.10.10-001",
				"sha256:5f2b8c1e0d9a7b3c4e6f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f", reach, settings)
			parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
			assert.Assert(t, is.Len(errs, 0), "%v", errs)
			cluster, machines, errs := layer.CheckFleet(parsed)
			assert.Assert(t, is.Len(errs, 0), "%v", errs)
			if o.vm {
				assert.Check(t, is.DeepEqual(cluster.Cluster.Spec.Settings.DNSServers, []string{"10.0.2.2:5353"}))
				assert.Check(t, is.DeepEqual(cluster.Cluster.Spec.Settings.RegistryMirrors, []likenv1.RegistryMirror{
					{Registry: "registry.liken.internal:5000", Endpoints: []string{"http://registry.liken.internal:5000"}},
				}), "the lab's registry, over plain http")
				_, err := trust.Pool(cluster.Cluster.Spec.Settings.CABundle)
				assert.Check(t, err, "the lab's CA bundle")
			}
			l := &layer.Layer{Cluster: cluster, Machines: machines}
			for _, n := range machineNames(o.leaders) {
				cfg, err := l.ControlPlaneConfig(n)
				assert.NilError(t, err)
				assert.Check(t, is.Len(cfg.Leaders, o.leaders))
				if reach != nil {
					for i, l := range cfg.Leaders {
						assert.Check(t, is.Equal(l.EtcdPeer, fmt.Sprintf("https://10.0.2.2:%d", 30002+3*i)), "leader %s", l.Name)
					}
				}
			}
		})
	}
}
