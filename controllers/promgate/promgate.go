// Package promgate reads the firing alerts of the Prometheus servers that Clusters' prometheus gates name, for the turn controller.
package promgate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/clip"
	"liken.sh/liken/internal/trust"
)

// Interval is how often a gate's server is read.
const Interval = 15 * time.Second

// maxAnswer bounds what is read of a server's answer.
const maxAnswer = 4 << 20

// Closed is a prometheus gate that holds every turn.
type Closed struct {
	// Gate is the gate's index in spec.disruption.gates.
	Gate int
	// Why says what shuts it: the alerts that fire, or the server that did
	// not answer.
	Why string
}

// state is the last read of one gate.
type state struct {
	closed bool
	why    string
	at     time.Time
}

// Prober reads, every Interval, the firing alerts of every prometheus
// gate of every Cluster, and keeps what it read for Closed.
type Prober struct {
	clusters likenlisters.ClusterLister
	http     *http.Client
	clock    clock.WithTicker
	// changed is called with a Cluster's name when a gate of it opens or
	// shuts, or why it is shut changes.
	changed func(cluster string)

	mu     sync.Mutex
	states map[string]state // by gateKey
}

// New returns a Prober over the Clusters of lister. changed is called
// when what a gate says changes.
func New(lister likenlisters.ClusterLister, client *http.Client, clk clock.WithTicker, changed func(cluster string)) *Prober {
	if client == nil {
		client = &http.Client{}
	}
	return &Prober{clusters: lister, http: client, clock: clk, changed: changed, states: map[string]state{}}
}

// gateKey names a gate by its Cluster, index and what it reads, so that an
// edited gate is read anew rather than judged by the old one's answer.
func gateKey(cluster string, i int, g *likenv1.PrometheusGate) string {
	return fmt.Sprintf("%s/%d/%s/%s", cluster, i, g.URL, g.Alerts)
}

// Closed lists the prometheus gates of c that hold every turn now: those
// whose last read found a matching alert firing or could not read the
// server, that have not been read yet, or whose last read is older than
// two intervals and the longest timeout (the prober is stuck).
func (p *Prober) Closed(c *likenv1.Cluster) []Closed {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Closed
	for i, g := range c.Spec.Disruption.Gates {
		if g.Prometheus == nil {
			continue
		}
		st, ok := p.states[gateKey(c.Name, i, g.Prometheus)]
		switch {
		case !ok:
			out = append(out, Closed{Gate: i, Why: fmt.Sprintf("cluster-operator has not read %s yet", g.Prometheus.URL)})
		case st.closed:
			out = append(out, Closed{Gate: i, Why: st.why})
		case now.Sub(st.at) > 2*Interval+time.Minute:
			out = append(out, Closed{Gate: i, Why: fmt.Sprintf("cluster-operator last read %s at %s", g.Prometheus.URL, st.at.UTC().Format(time.RFC3339))})
		}
	}
	return out
}

// Run reads every gate now and then every Interval, until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	t := p.clock.NewTicker(Interval)
	defer t.Stop()
	for {
		p.ProbeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// ProbeAll reads every prometheus gate of every Cluster once, and forgets
// the gates that are gone.
func (p *Prober) ProbeAll(ctx context.Context) {
	clusters, err := p.clusters.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing Clusters for their prometheus gates")
		return
	}
	seen := map[string]bool{}
	for _, c := range clusters {
		for i, g := range c.Spec.Disruption.Gates {
			if g.Prometheus == nil {
				continue
			}
			key := gateKey(c.Name, i, g.Prometheus)
			seen[key] = true
			st := p.probe(ctx, g.Prometheus, c.Spec.Settings.CABundle)
			p.mu.Lock()
			was, ok := p.states[key]
			p.states[key] = st
			p.mu.Unlock()
			if !ok || was.closed != st.closed || was.why != st.why {
				klog.FromContext(ctx).Info("A prometheus gate changed", "cluster", klog.KObj(c), "gate", i, "closed", st.closed, "why", st.why)
				if p.changed != nil {
					p.changed(c.Name)
				}
			}
		}
	}
	p.mu.Lock()
	for key := range p.states {
		if !seen[key] {
			delete(p.states, key)
		}
	}
	p.mu.Unlock()
}

// answer is what Prometheus's /api/v1/alerts returns.
type answer struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	} `json:"data"`
}

// probe reads the firing alerts of gate g's server once.
func (p *Prober) probe(ctx context.Context, g *likenv1.PrometheusGate, caBundle string) state {
	now := p.clock.Now()
	shut := func(format string, args ...any) state {
		return state{closed: true, why: fmt.Sprintf(format, args...), at: now}
	}
	pattern := g.Alerts
	if pattern == "" {
		pattern = ".*" // every alert
	}
	re, err := regexp.Compile(`^(?:` + pattern + `)$`)
	if err != nil {
		return shut("its alerts pattern %q is not a regular expression: %v", g.Alerts, err)
	}
	u, err := url.Parse(g.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return shut("its url %q is not an http or https URL", g.URL)
	}
	endpoint := u.JoinPath("api", "v1", "alerts").String()
	timeout := 10 * time.Second
	if g.Timeout != nil && g.Timeout.Duration > 0 {
		timeout = g.Timeout.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := p.http
	if caBundle != "" {
		base, _ := client.Transport.(*http.Transport)
		tr, err := trust.WithBundle(base, caBundle)
		if err != nil {
			return shut("cannot trust spec.settings.caBundle to read %s: %v", endpoint, err)
		}
		defer tr.CloseIdleConnections()
		cp := *client
		cp.Transport = tr
		client = &cp
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return shut("cannot ask %s: %v", endpoint, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return shut("Prometheus did not answer at %s within %s: %v", endpoint, timeout, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return shut("reading the answer of %s: %v", endpoint, err)
	}
	if len(body) > maxAnswer {
		return shut("the answer of %s is larger than %d bytes", endpoint, maxAnswer)
	}
	var a answer
	if err := json.Unmarshal(body, &a); err != nil || resp.StatusCode != http.StatusOK || a.Status != "success" {
		detail := a.Error
		if err != nil {
			detail = err.Error()
		}
		return shut("%s answered %s, not Prometheus's list of alerts: %s", endpoint, resp.Status, clip.To(detail, 200))
	}
	var firing []string
	for _, al := range a.Data.Alerts {
		name := al.Labels["alertname"]
		if al.State == "firing" && re.MatchString(name) && !slices.Contains(firing, name) {
			firing = append(firing, name)
		}
	}
	if len(firing) == 0 {
		return state{at: now}
	}
	slices.Sort(firing)
	if len(firing) > 10 {
		firing = append(firing[:10], fmt.Sprintf("and %d more", len(firing)-10))
	}
	return shut("alerts fire on %s: %s", g.URL, strings.Join(firing, ", "))
}
