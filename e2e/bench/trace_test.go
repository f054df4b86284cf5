package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestGrantPath: grant traces are read from the operator's log as klog
// writes them, among its other lines; a grant's latency splits into
// parts that add up to it; a trace of a requeue has no path.
func TestGrantPath(t *testing.T) {
	log := `I1207 03:37:01.090000   12139 leaderelection.go:258] "Successfully acquired lease" lease="liken-system/cluster-operator"
I1207 03:37:01.150000   12139 trace.go:46] "Grant trace" cluster="lab" machines="m-00003,m-00004" event="2026-12-07T03:37:01.1Z" queued="18.8ms" read="100µs" decide="20µs" columns="10µs" fence="0s" write="11.9ms"
I1207 03:37:02.000000   12139 controller.go:544] "Cluster phase changed" cluster="lab" from="Ready" to="Updating"
I1207 03:37:03.000000   12139 trace.go:46] "Grant trace" cluster="lab" machines="m-00005" event="none" queued="0s" read="1ms" decide="2ms" columns="0s" fence="0s" write="5ms"
`
	path := filepath.Join(t.TempDir(), "operator.log")
	assert.NilError(t, os.WriteFile(path, []byte(log), 0o644))
	traces, err := ReadGrantTraces(path)
	assert.NilError(t, err)
	assert.Equal(t, len(traces), 2)

	tr, ok := TraceOf(traces, "m-00004")
	assert.Assert(t, ok)
	event := time.Date(2026, 12, 7, 3, 37, 1, 100_000_000, time.UTC)
	assert.DeepEqual(t, tr, GrantTrace{Machines: []string{"m-00003", "m-00004"}, Event: event,
		Queued: 18800 * time.Microsecond, Read: 100 * time.Microsecond, Decide: 20 * time.Microsecond, Columns: 10 * time.Microsecond, Write: 11900 * time.Microsecond})
	ended, seen := event.Add(-5*time.Millisecond), event.Add(40*time.Millisecond)
	p, ok := PathOf(tr, ended, seen)
	assert.Assert(t, ok)
	assert.Equal(t, p.Informer, 5*time.Millisecond)
	assert.Equal(t, p.Watch, 40*time.Millisecond-30830*time.Microsecond)
	var sum time.Duration
	for _, x := range p.parts() {
		sum += x.d
	}
	assert.Equal(t, sum, seen.Sub(ended), "the parts add up to the grant's latency")

	requeue, ok := TraceOf(traces, "m-00005")
	assert.Assert(t, ok)
	_, ok = PathOf(requeue, ended, seen)
	assert.Assert(t, !ok, "a requeue's trace has no event to start from")
	_, ok = TraceOf(traces, "m-00006")
	assert.Assert(t, !ok)
}
