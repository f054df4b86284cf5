package fleet_test

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	_ "gotest.tools/v3/golden" // go test ./cli/... -update reaches every package
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/cli/internal/fleet"
)

func TestDescribeChange(t *testing.T) {
	m := clitest.Machine("m", "c", v1alpha1.RoleWorker, v1alpha1.RebootManual)
	clitest.SetStaged(m, clitest.Version1, clitest.Version2, "x")
	assert.Equal(t, fleet.DescribeChange(m), "release 2026.10.12-001")
	m.Status.Pending = append(m.Status.Pending, v1alpha1.PendingChange{Field: "spec.kernelModules", Class: v1alpha1.ClassReboot})
	assert.Equal(t, fleet.DescribeChange(m), "release 2026.10.12-001 and changes to spec.kernelModules")
	m.Status = v1alpha1.MachineStatus{Phase: v1alpha1.MachineRebootPending, Change: "y"}
	m.Annotations = map[string]string{v1alpha1.AnnotationRequestReboot: "now"}
	assert.Equal(t, fleet.DescribeChange(m), "a requested reboot")
}

// The window notes read the windows with cluster-operator's rule; now is
// Monday 2026-11-30 10:00 UTC.
func TestWindowNote(t *testing.T) {
	w := func(days []string, start string, d time.Duration, zone string) v1alpha1.MaintenanceWindow {
		return v1alpha1.MaintenanceWindow{Days: days, Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: zone}
	}
	for _, tc := range []struct {
		name    string
		windows []v1alpha1.MaintenanceWindow
		want    string
	}{
		{name: "no windows", want: ""},
		{name: "closed", windows: []v1alpha1.MaintenanceWindow{w([]string{"Sat"}, "22:00", 4*time.Hour, "Europe/Berlin")},
			want: "closed now; turns wait for the next window, which opens Sat 2026-12-05 22:00 Europe/Berlin (21:00 UTC), in 5d11h"},
		{name: "open", windows: []v1alpha1.MaintenanceWindow{w([]string{"Mon"}, "09:00", 3*time.Hour+30*time.Minute, "UTC")},
			want: "open until Mon 2026-11-30 12:30 UTC, 2h30m from now; a turn not granted by then waits for the next window"},
		{name: "open all week", windows: []v1alpha1.MaintenanceWindow{w([]string{"Mon"}, "00:00", 168*time.Hour, "UTC")},
			want: "open for the next 7 days or more"},
		{name: "unknown zone", windows: []v1alpha1.MaintenanceWindow{w([]string{"Sat"}, "22:00", 4*time.Hour, "Europe/Berln")},
			want: `a maintenance window cannot be read (spec.disruption.windows[0].timeZone: Invalid value: "Europe/Berln": unknown time zone`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := clitest.Cluster("c", "1")
			cl.Spec.Disruption.Windows = tc.windows
			note := fleet.WindowOf(cl, clitest.Since.Time).Note()
			if tc.want == "" {
				assert.Equal(t, note, "")
			} else {
				assert.Assert(t, strings.HasPrefix(note, tc.want), note)
			}
		})
	}
}
