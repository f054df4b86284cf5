package turns

import (
	"strings"
	"time"

	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// TraceVerbosity is the log verbosity (-v) at which each write that
// grants turns logs a GrantTraceMessage line: where the time between the
// change that asked for the decision and the grant's write went.
const TraceVerbosity = 3

// GrantTraceMessage is the message of a grant trace line. Its values:
// cluster; machines (granted, comma-separated); event (when the change
// that asked for this decision arrived from an informer, RFC 3339, or
// "none" for a requeue or a retry); and, as durations, queued (event to
// the sync's start), read (the caches and the drain check), decide
// (Decide), columns, fence (confirming the lease) and write (the status
// update's round trip).
const GrantTraceMessage = "Grant trace"

// grantTrace is when each step of one sync ended.
type grantTrace struct {
	event, start, read, decided, columns, fenced, written time.Time
}

// log writes the trace of a write that granted turns.
func (tr grantTrace) log(logger klog.Logger, cluster *likenv1.Cluster, granted []likenv1.RebootTurn) {
	if !logger.V(TraceVerbosity).Enabled() {
		return
	}
	names := make([]string, len(granted))
	for i, t := range granted {
		names[i] = t.Machine
	}
	event, queued := "none", "0s"
	if !tr.event.IsZero() {
		event, queued = tr.event.UTC().Format(time.RFC3339Nano), tr.start.Sub(tr.event).String()
	}
	logger.V(TraceVerbosity).Info(GrantTraceMessage, "cluster", cluster.Name, "machines", strings.Join(names, ","),
		"event", event, "queued", queued,
		"read", tr.read.Sub(tr.start).String(), "decide", tr.decided.Sub(tr.read).String(),
		"columns", tr.columns.Sub(tr.decided).String(), "fence", tr.fenced.Sub(tr.columns).String(),
		"write", tr.written.Sub(tr.fenced).String())
}
