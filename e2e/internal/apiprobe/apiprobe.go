// Package apiprobe writes and reads a ConfigMap through the Kubernetes API
// while an end-to-end test upgrades the fleet, and reports how long the
// API was gone.
package apiprobe

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Defaults of a Probe whose fields are zero.
const (
	DefaultNamespace = "default"
	DefaultName      = "liken-probe"
	DefaultInterval  = 200 * time.Millisecond
	DefaultTimeout   = 2 * time.Second
)

// CounterKey is the key of the ConfigMap's data that holds the counter.
const CounterKey = "counter"

// Op is the request of a round that failed.
type Op string

const (
	// OpWrite is the update (or create) of the ConfigMap.
	OpWrite Op = "write"
	// OpRead is the get of the ConfigMap and the check of its counter.
	OpRead Op = "read"
)

// Probe writes a counter into a ConfigMap and reads it back every
// Interval, and records every request that failed. Set its fields before
// Run; Mark and Report are safe from any goroutine.
type Probe struct {
	// Client reaches the API, through the fleet's endpoint.
	Client kubernetes.Interface
	// Namespace and Name name the ConfigMap (DefaultNamespace, DefaultName
	// when empty).
	Namespace, Name string
	// Interval is the time between rounds (DefaultInterval when zero).
	Interval time.Duration
	// Timeout bounds each request (DefaultTimeout when zero).
	Timeout time.Duration
	// Clock times the rounds and the records (the real clock when nil).
	Clock clock.WithTicker

	mu       sync.Mutex
	counter  int
	seq      int
	requests int
	rounds   int
	failures []Failure
	marks    []Mark
	started  time.Time
	ended    time.Time
	// lastOK is the end of the last successful round, or the start of the
	// run before the first.
	lastOK time.Time
	// down is true from a failed round to the next successful one.
	down    bool
	longest Window
}

// Failure is one failed request.
type Failure struct {
	// At is when the request returned.
	At time.Time
	// Op is the request.
	Op Op
	// Err is the error's text.
	Err string

	seq int
}

// Mark is a labelled point of the run, with an optional text such as the
// datastore's state (Datastore).
type Mark struct {
	// At is when it was marked.
	At time.Time
	// Label says what happened, e.g. "vm-1 left its turn".
	Label string
	// Text is attached to it; empty when none.
	Text string

	seq int
}

// Window is a time without a successful round: from the last success
// before a failure to the next success.
type Window struct {
	// From is the end of the last successful round before the window (the
	// start of the run when none had succeeded yet).
	From time.Time
	// To is the end of the next successful round, or the time of the
	// report when Ongoing.
	To time.Time
	// Ongoing is true when no round had succeeded again at the report.
	Ongoing bool
}

// Duration is the window's length; zero for no window.
func (w Window) Duration() time.Duration { return w.To.Sub(w.From) }

// Report is what a Probe saw up to a point.
type Report struct {
	// Started is when Run started; zero before.
	Started time.Time
	// Ended is when Run returned; zero while it runs.
	Ended time.Time
	// At is when the report was taken.
	At time.Time
	// Rounds counts the rounds (a write and its read), failed or not.
	Rounds int
	// Requests counts the requests sent: a round whose write fails sends
	// no read.
	Requests int
	// Failures are the failed requests in order, at most one per round.
	Failures []Failure
	// Longest is the longest window without a successful round, counting
	// an ongoing one up to At; zero when no round failed.
	Longest Window
	// Marks are the labelled points in order.
	Marks []Mark
}

// Run probes the API every Interval until ctx is done: the first round
// at once. Call it once.
func (p *Probe) Run(ctx context.Context) {
	log := klog.FromContext(ctx).WithValues("configMap", p.namespace()+"/"+p.name())
	clk := p.clock()
	ticker := clk.NewTicker(p.interval())
	defer ticker.Stop()
	p.mu.Lock()
	p.started = clk.Now()
	p.lastOK = p.started
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.ended = clk.Now()
		p.mu.Unlock()
	}()
	for {
		p.round(ctx, log)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// round writes the next counter, reads it back and records the outcome.
func (p *Probe) round(ctx context.Context, log klog.Logger) {
	if ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	p.counter++
	n := p.counter
	p.mu.Unlock()

	op, err := OpWrite, p.write(ctx, n)
	if err == nil {
		op, err = OpRead, p.read(ctx, n)
	}
	if ctx.Err() != nil {
		// The run ends; a request cut short by the test's end is not the
		// API's failure.
		return
	}
	now := p.clock().Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rounds++
	p.requests++
	if op == OpRead {
		p.requests++
	}
	if err != nil {
		p.seq++
		p.failures = append(p.failures, Failure{At: now, Op: op, Err: err.Error(), seq: p.seq})
		if !p.down {
			p.down = true
			log.Info("The API probe failed", "op", op, "err", err, "lastSuccess", p.lastOK)
		}
		return
	}
	if p.down {
		p.down = false
		w := Window{From: p.lastOK, To: now}
		if w.Duration() > p.longest.Duration() {
			p.longest = w
		}
		log.Info("The API probe succeeded again", "without", w.Duration())
	}
	p.lastOK = now
}

// write updates the ConfigMap with counter n, creating it when missing.
func (p *Probe) write(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace(), Name: p.name()},
		Data:       map[string]string{CounterKey: strconv.Itoa(n)},
	}
	cms := p.Client.CoreV1().ConfigMaps(p.namespace())
	_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
	return err
}

// read gets the ConfigMap and checks that it holds counter n.
func (p *Probe) read(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	cm, err := p.Client.CoreV1().ConfigMaps(p.namespace()).Get(ctx, p.name(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got := cm.Data[CounterKey]; got != strconv.Itoa(n) {
		return fmt.Errorf("read counter %s, wrote %d", got, n)
	}
	return nil
}

// Mark records a labelled point now, with text attached when given (its
// parts joined by newlines).
func (p *Probe) Mark(label string, text ...string) {
	now := p.clock().Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	p.marks = append(p.marks, Mark{At: now, Label: label, Text: strings.Join(text, "\n"), seq: p.seq})
}

// Report returns what the probe saw so far.
func (p *Probe) Report() Report {
	now := p.clock().Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := Report{
		Started:  p.started,
		Ended:    p.ended,
		At:       now,
		Rounds:   p.rounds,
		Requests: p.requests,
		Failures: append([]Failure(nil), p.failures...),
		Longest:  p.longest,
		Marks:    append([]Mark(nil), p.marks...),
	}
	if p.down {
		to := now
		if !p.ended.IsZero() {
			to = p.ended
		}
		if w := (Window{From: p.lastOK, To: to, Ongoing: true}); w.Duration() >= r.Longest.Duration() {
			r.Longest = w
		}
	}
	return r
}

// String is the report in one line, e.g. "1520 rounds, 14 failed; longest
// window without the API 3.2s (12:04:10.0–12:04:13.2)".
func (r Report) String() string {
	s := fmt.Sprintf("%d rounds, %d failed; ", r.Rounds, len(r.Failures))
	w := r.Longest
	switch {
	case len(r.Failures) == 0:
		return s + "the API answered every round"
	case w.Ongoing:
		return s + fmt.Sprintf("longest window without the API %s (%s–%s, ongoing)", w.Duration().Round(100*time.Millisecond), clockTime(w.From), clockTime(w.To))
	default:
		return s + fmt.Sprintf("longest window without the API %s (%s–%s)", w.Duration().Round(100*time.Millisecond), clockTime(w.From), clockTime(w.To))
	}
}

// Timeline is String followed by the marks and the failures in the order
// they happened, one per line; failures in a row with the same operation
// and error share a line with their count, and a mark's text follows it,
// indented.
func (r Report) Timeline() string {
	var b strings.Builder
	b.WriteString(r.String())
	b.WriteString("\n")
	fs, ms := r.Failures, r.Marks
	for len(fs) > 0 || len(ms) > 0 {
		if len(ms) > 0 && (len(fs) == 0 || ms[0].seq < fs[0].seq) {
			m := ms[0]
			ms = ms[1:]
			fmt.Fprintf(&b, "%s mark: %s\n", clockTime(m.At), m.Label)
			if m.Text != "" {
				for l := range strings.Lines(m.Text) {
					b.WriteString("    " + strings.TrimSuffix(l, "\n") + "\n")
				}
			}
			continue
		}
		// The failures in a row, before the next mark, alike to the first.
		f, k := fs[0], 1
		for k < len(fs) && fs[k].Op == f.Op && fs[k].Err == f.Err && (len(ms) == 0 || fs[k].seq < ms[0].seq) {
			k++
		}
		if k == 1 {
			fmt.Fprintf(&b, "%s %s failed: %s\n", clockTime(f.At), f.Op, f.Err)
		} else {
			fmt.Fprintf(&b, "%s–%s %s failed %d times: %s\n", clockTime(f.At), clockTime(fs[k-1].At), f.Op, k, f.Err)
		}
		fs = fs[k:]
	}
	return b.String()
}

// clockTime is t's time of day to a tenth of a second.
func clockTime(t time.Time) string { return t.Format("15:04:05.0") }

func (p *Probe) clock() clock.WithTicker {
	if p.Clock == nil {
		return clock.RealClock{}
	}
	return p.Clock
}

func (p *Probe) namespace() string {
	if p.Namespace == "" {
		return DefaultNamespace
	}
	return p.Namespace
}

func (p *Probe) name() string {
	if p.Name == "" {
		return DefaultName
	}
	return p.Name
}

func (p *Probe) interval() time.Duration {
	if p.Interval <= 0 {
		return DefaultInterval
	}
	return p.Interval
}

func (p *Probe) timeout() time.Duration {
	if p.Timeout <= 0 {
		return DefaultTimeout
	}
	return p.Timeout
}
