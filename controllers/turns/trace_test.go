package turns

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/leadership"
	tu "liken.sh/liken/controllers/internal/testutil"
)

// slowWriter is the API server's round trip, on the fixture's clock.
type slowWriter struct {
	StatusWriter
	f    *fixture
	took time.Duration
}

func (w slowWriter) UpdateStatus(ctx context.Context, c *likenv1.Cluster, opts metav1.UpdateOptions) (*likenv1.Cluster, error) {
	w.f.clock.Step(w.took)
	return w.StatusWriter.UpdateStatus(ctx, c, opts)
}

// traceSync syncs the cluster once with a logger at verbosity v and
// returns the grant trace lines it logged.
func traceSync(t *testing.T, c *Controller, v int) []string {
	t.Helper()
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v), textlogger.Output(&buf)))
	_, err := c.sync(klog.NewContext(context.Background(), logger), "lab")
	assert.NilError(t, err)
	return regexp.MustCompile(`(?m)^.*"`+GrantTraceMessage+`".*$`).FindAllString(buf.String(), -1)
}

// TestControllerTracesAGrant: at TraceVerbosity a write that grants
// turns logs where the time went since the change that asked for it (in
// the queue, the lease's confirmation, the write's round trip); a write
// that grants nothing, and a lower verbosity, log no trace.
func TestControllerTracesAGrant(t *testing.T) {
	f := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2), tu.MaxUnavailable("1")),
		tu.Machine("a", tu.WantsRelease), tu.Machine("b", tu.WantsRelease),
		tu.Node("a", true), tu.Node("b", true))
	c := f.newController(leadership.Term{Identity: "op-1", Since: tu.Epoch, Token: fixtureTerm,
		Fence: leadership.FenceFunc(func(context.Context, string) error { f.clock.Step(time.Second); return nil })},
		slowWriter{StatusWriter: f.client.LikenV1alpha1().Clusters(), f: f, took: 300 * time.Millisecond})

	event := f.clock.Now()
	c.add("lab")
	f.clock.Step(2 * time.Second)
	lines := traceSync(t, c, TraceVerbosity)
	assert.Equal(t, len(lines), 1, "%q", lines)
	for _, want := range []string{`cluster="lab"`, `machines="a"`, `event="` + event.UTC().Format(time.RFC3339Nano) + `"`,
		`queued="2s"`, `read="0s"`, `decide="0s"`, `columns="0s"`, `fence="1s"`, `write="300ms"`} {
		assert.Check(t, is.Contains(lines[0], want))
	}

	// a's turn ends and the columns move: a write that grants nothing.
	f.refresh("lab")
	f.setMachine(tu.Machine("a", tu.Phase(likenv1.MachineRebooting)))
	f.clock.Step(ColumnsEvery)
	before := f.updates()
	assert.Check(t, is.Len(traceSync(t, c, TraceVerbosity), 0))
	assert.Assert(t, f.updates() > before, "the sync wrote nothing: the case is not the one meant")

	// Below TraceVerbosity a grant logs no trace.
	f2 := newFixture(t, tu.Cluster("lab", tu.TargetVersion(tu.Version2)), tu.Machine("a", tu.WantsRelease), tu.Node("a", true))
	assert.Check(t, is.Len(traceSync(t, f2.ctrl, TraceVerbosity-1), 0))
	assert.Equal(t, f2.stored("lab").Status.Turns, "a")
}
