package watchdog

import (
	"fmt"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestForTrial(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	record := func(timeout string, armedAt time.Time) []byte {
		return fmt.Appendf(nil, `{"formatVersion":1,"bootID":"b1","trial":{"slot":"B","version":"2026.12.02-001","timeout":%q,"armedAt":%q,"armedBootID":"b1"},"later":{"fields":true}}`,
			timeout, armedAt.Format(time.RFC3339Nano))
	}
	for _, tc := range []struct {
		name  string
		state []byte
		want  time.Duration
		why   string
	}{
		{name: "what is left of the Cluster's timeout", state: record("10m0s", now.Add(-90*time.Second)),
			want: 8*time.Minute + 30*time.Second, why: "what is left of the trial timeout of 10m0s"},
		{name: "a timeout longer than the init's own", state: record("30m0s", now.Add(-time.Minute)),
			want: 29 * time.Minute},
		{name: "a clock that jumped back gets the whole timeout", state: record("10m0s", now.Add(time.Hour)),
			want: 10 * time.Minute},
		{name: "a timeout nearly spent still lets liken-node start", state: record("10m0s", now.Add(-9*time.Minute-50*time.Second)),
			want: MinTrialTimeout, why: "nearly spent"},
		{name: "a timeout long spent", state: record("5m0s", now.Add(-time.Hour)),
			want: MinTrialTimeout},
		{name: "no trial record", state: []byte(`{"formatVersion":1}`),
			want: InitTimeout, why: "no trial record"},
		{name: "no state file", state: nil,
			want: InitTimeout, why: "cannot be read"},
		{name: "a damaged state file", state: []byte(`{"trial":{"timeout":`),
			want: InitTimeout, why: "cannot be read"},
		{name: "a timeout that is not a duration", state: record("soon", now),
			want: InitTimeout, why: `"soon" is not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := ForTrial(tc.state, now)
			assert.Equal(t, got, tc.want)
			assert.Check(t, is.Contains(why, tc.why))
		})
	}
}
