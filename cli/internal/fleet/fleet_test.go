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

func TestBudgetAndAhead(t *testing.T) {
	tests := []struct {
		name      string
		mu        string
		turns     []string
		lost      []string
		halt      string
		of        string
		wantMax   int
		wantUsed  int
		wantAhead []string
		blocked   string
	}{
		{name: "one at a time", mu: "1", turns: []string{"l-1"}, of: "w-2", wantMax: 1, wantUsed: 1, wantAhead: []string{"l-2", "w-1"}},
		{name: "percentage rounds down", mu: "50%", of: "w-1", wantMax: 2, wantAhead: []string{"l-1", "l-2"}},
		{name: "small percentage is at least one", mu: "10%", of: "l-2", wantMax: 1, wantAhead: []string{"l-1"}},
		{name: "zero pauses", mu: "0", of: "w-1", wantMax: 0, wantAhead: []string{"l-1", "l-2"}, blocked: "maxUnavailable is 0: every turn is paused"},
		{name: "lost counts", mu: "2", turns: []string{"l-1"}, lost: []string{"w-3"}, of: "w-2", wantMax: 2, wantUsed: 2, wantAhead: []string{"l-2", "w-1"}},
		{name: "halt blocks", mu: "1", halt: v1alpha1.ReasonRolloutStalled, of: "w-1", wantMax: 1, wantAhead: []string{"l-1", "l-2"}, blocked: "halted (RolloutStalled on l-1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cl := clitest.Cluster("c", tc.mu)
			for _, n := range tc.turns {
				cl.Status.RebootTurns = append(cl.Status.RebootTurns, v1alpha1.RebootTurn{Machine: n, Reason: v1alpha1.TurnRelease, GrantedAt: clitest.Since})
			}
			if tc.halt != "" {
				cl.Status.Halt = &v1alpha1.RolloutHalt{Reason: tc.halt, Machine: "l-1", Since: clitest.Since}
			}
			var all []*v1alpha1.Machine
			for _, n := range []string{"w-3", "w-1", "l-2", "l-1", "w-2"} {
				role := v1alpha1.RoleWorker
				if n[0] == 'l' {
					role = v1alpha1.RoleLeader
				}
				m := clitest.Machine(n, "c", role, v1alpha1.RebootAuto)
				clitest.SetStaged(m, clitest.Version1, clitest.Version2, "c-"+n)
				for _, l := range tc.lost {
					if l == n {
						m.Status.Phase = v1alpha1.MachineLost
					}
				}
				all = append(all, m)
			}
			all = append(all, clitest.Machine("x-1", "other", v1alpha1.RoleLeader, v1alpha1.RebootAuto))
			members := fleet.Members("c", all)
			assert.Equal(t, len(members), 5)
			b, err := fleet.BudgetOf(cl, members, clitest.Since.Time)
			assert.NilError(t, err)
			assert.Equal(t, b.Max, tc.wantMax)
			assert.Equal(t, b.Used(), tc.wantUsed)
			var of *v1alpha1.Machine
			for _, m := range members {
				if m.Name == tc.of {
					of = m
				}
			}
			ahead := fleet.Ahead(of, members, b)
			if len(tc.wantAhead) == 0 {
				assert.Equal(t, len(ahead), 0, "%v", ahead)
			} else {
				assert.DeepEqual(t, ahead, tc.wantAhead)
			}
			if tc.blocked == "" {
				assert.Equal(t, b.Blocked(cl, true), "")
			} else {
				assert.ErrorContains(t, errString(b.Blocked(cl, true)), tc.blocked)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }

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
		blocked string
	}{
		{name: "no windows", want: ""},
		{name: "closed", windows: []v1alpha1.MaintenanceWindow{w([]string{"Sat"}, "22:00", 4*time.Hour, "Europe/Berlin")},
			want: "closed now; turns wait for the next window, which opens Sat 2026-12-05 22:00 Europe/Berlin (21:00 UTC), in 5d11h"},
		{name: "open", windows: []v1alpha1.MaintenanceWindow{w([]string{"Mon"}, "09:00", 3*time.Hour+30*time.Minute, "UTC")},
			want: "open until Mon 2026-11-30 12:30 UTC, 2h30m from now; a turn not granted by then waits for the next window"},
		{name: "open all week", windows: []v1alpha1.MaintenanceWindow{w([]string{"Mon"}, "00:00", 168*time.Hour, "UTC")},
			want: "open for the next 7 days or more"},
		{name: "unknown zone", windows: []v1alpha1.MaintenanceWindow{w([]string{"Sat"}, "22:00", 4*time.Hour, "Europe/Berln")},
			want:    `a maintenance window cannot be read (spec.disruption.windows[0].timeZone: Invalid value: "Europe/Berln": unknown time zone`,
			blocked: "a maintenance window cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := clitest.Cluster("c", "1")
			cl.Spec.Disruption.Windows = tc.windows
			b, err := fleet.BudgetOf(cl, nil, clitest.Since.Time)
			assert.NilError(t, err)
			if tc.want == "" {
				assert.Equal(t, b.Window.Note(), "")
			} else {
				assert.Assert(t, strings.HasPrefix(b.Window.Note(), tc.want), b.Window.Note())
			}
			assert.Assert(t, strings.HasPrefix(b.Blocked(cl, true), tc.blocked), b.Blocked(cl, true))
		})
	}
}
