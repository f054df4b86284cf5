package bench

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"liken.sh/liken/controllers/turns"
)

// GrantTrace is one grant trace line of cluster-operator's log (at -v
// turns.TraceVerbosity): one write that granted turns, and where its time
// went.
type GrantTrace struct {
	// Machines are the machines granted.
	Machines []string
	// Event is when the change that asked for the decision reached the
	// operator's informer; zero for a requeue or a retry.
	Event time.Time
	// The sync's steps, in order (see turns.GrantTraceMessage).
	Queued, Read, Decide, Columns, Fence, Write time.Duration
}

// traceLine is a grant trace line; traceField one of its key="value"
// pairs.
var (
	traceLine  = regexp.MustCompile(`(?m)^.*"` + turns.GrantTraceMessage + `"(.*)$`)
	traceField = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// ReadGrantTraces reads the grant traces of the operator's log at path.
func ReadGrantTraces(path string) ([]GrantTrace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []GrantTrace
	for _, m := range traceLine.FindAllStringSubmatch(string(b), -1) {
		kv := map[string]string{}
		for _, f := range traceField.FindAllStringSubmatch(m[1], -1) {
			kv[f[1]] = f[2]
		}
		tr := GrantTrace{Machines: strings.Split(kv["machines"], ",")}
		if e := kv["event"]; e != "none" {
			if tr.Event, err = time.Parse(time.RFC3339Nano, e); err != nil {
				return nil, fmt.Errorf("%s: grant trace %q: event: %w", path, m[0], err)
			}
		}
		for _, d := range []struct {
			key string
			to  *time.Duration
		}{{"queued", &tr.Queued}, {"read", &tr.Read}, {"decide", &tr.Decide}, {"columns", &tr.Columns}, {"fence", &tr.Fence}, {"write", &tr.Write}} {
			if *d.to, err = time.ParseDuration(kv[d.key]); err != nil {
				return nil, fmt.Errorf("%s: grant trace %q: %s: %w", path, m[0], d.key, err)
			}
		}
		out = append(out, tr)
	}
	return out, nil
}

// TraceOf is the last trace that granted machine, if any.
func TraceOf(traces []GrantTrace, machine string) (GrantTrace, bool) {
	for i := len(traces) - 1; i >= 0; i-- {
		for _, m := range traces[i].Machines {
			if m == machine {
				return traces[i], true
			}
		}
	}
	return GrantTrace{}, false
}

// GrantPath is where the time of one grant went, from the turn's end (the
// machine's last write of its turn) to the grant seen by a watch.
type GrantPath struct {
	// Informer: from the turn's end to the operator's informer event.
	Informer time.Duration
	// The operator's sync (GrantTrace).
	Queued, Read, Decide, Columns, Fence, Write time.Duration
	// Watch: from the write's answer to a watch seeing the grant.
	Watch time.Duration
}

// PathOf splits a grant seen at seen, into a place freed by a turn that
// ended at ended, along its trace; false for a trace of a requeue (no
// event to start from).
func PathOf(tr GrantTrace, ended, seen time.Time) (GrantPath, bool) {
	if tr.Event.IsZero() {
		return GrantPath{}, false
	}
	p := GrantPath{Informer: tr.Event.Sub(ended), Queued: tr.Queued, Read: tr.Read, Decide: tr.Decide, Columns: tr.Columns, Fence: tr.Fence, Write: tr.Write}
	written := tr.Event.Add(tr.Queued + tr.Read + tr.Decide + tr.Columns + tr.Fence + tr.Write)
	p.Watch = seen.Sub(written)
	return p, true
}

// parts are a path's parts with their names, in order.
func (p GrantPath) parts() []struct {
	name string
	d    time.Duration
} {
	return []struct {
		name string
		d    time.Duration
	}{{"informer", p.Informer}, {"queued", p.Queued}, {"read", p.Read}, {"decide", p.Decide}, {"columns", p.Columns}, {"fence", p.Fence}, {"write", p.Write}, {"watch", p.Watch}}
}

// MedianPath is each part's median over paths.
func MedianPath(paths []GrantPath) GrantPath {
	col := func(f func(GrantPath) time.Duration) time.Duration {
		d := make([]time.Duration, len(paths))
		for i, p := range paths {
			d[i] = f(p)
		}
		return Median(d)
	}
	return GrantPath{
		Informer: col(func(p GrantPath) time.Duration { return p.Informer }),
		Queued:   col(func(p GrantPath) time.Duration { return p.Queued }),
		Read:     col(func(p GrantPath) time.Duration { return p.Read }),
		Decide:   col(func(p GrantPath) time.Duration { return p.Decide }),
		Columns:  col(func(p GrantPath) time.Duration { return p.Columns }),
		Fence:    col(func(p GrantPath) time.Duration { return p.Fence }),
		Write:    col(func(p GrantPath) time.Duration { return p.Write }),
		Watch:    col(func(p GrantPath) time.Duration { return p.Watch }),
	}
}

// String is the path in milliseconds, part by part.
func (p GrantPath) String() string {
	var s []string
	for _, x := range p.parts() {
		s = append(s, fmt.Sprintf("%s %.1f", x.name, ms(x.d)))
	}
	return strings.Join(s, ", ") + " ms"
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
