package fleet_test

import (
	"testing"

	"gotest.tools/v3/assert"
	_ "gotest.tools/v3/golden" // go test ./cli/... -update reaches every package

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
			b, err := fleet.BudgetOf(cl, members)
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
