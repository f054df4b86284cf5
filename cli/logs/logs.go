// Package logs holds liken logs: a machine's journal read through the API server and the machine's kubelet, with no shell on the machine.
package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/kube"
)

// DefaultUnit is the unit read when none is named: the node daemon.
const DefaultUnit = "liken-node"

// KernelUnit is the image's unit that copies the kernel's messages into
// the journal (the kubelet's query reads units only): --kernel reads it.
const KernelUnit = "liken-kernel-log"

// FollowEvery is how often --follow asks for new lines.
const FollowEvery = 2 * time.Second

// The kubelet's limits on a log query.
const (
	maxUnits = 4
	maxTail  = 100000
)

// Options say what to read.
type Options struct {
	// Machine is the machine (its Node has the same name).
	Machine string
	// Units are the systemd units whose lines are read, without .service;
	// DefaultUnit when empty. At most maxUnits.
	Units []string
	// Since reads only the lines of the last Since; 0 reads them all.
	Since time.Duration
	// Boot is the boot to read: 0 the current one, -1 the one before, and
	// so on.
	Boot int
	// Tail reads only the last Tail lines; 0 reads them all.
	Tail int
	// Grep keeps the lines that match this regular expression.
	Grep string
	// Kernel reads the kernel's messages (KernelUnit) too.
	Kernel bool
	// Follow keeps reading new lines of the current boot until ctx ends.
	Follow bool
	// Clock tells the time of --since and --follow's rounds, and how long
	// an answer took.
	Clock clock.WithTicker
}

// NewCommand returns liken logs.
func NewCommand(flags *kube.Flags) *cobra.Command {
	opts := Options{Clock: clock.RealClock{}}
	cmd := &cobra.Command{
		Use:   "logs MACHINE",
		Short: "Print a machine's logs (its journal), read through the API server",
		Long: `Print the journal of a machine: the lines of its services (liken-node when
no --unit is given) or of its kernel (--kernel), of this boot or of an
earlier one, read through the
API server from the machine's kubelet (the Kubernetes node log query), so
no shell on the machine is needed. The journal is kept on the machine's
slot store (at most 128 MiB), so the lines of earlier boots are there
too: after a failed trial, --boot -1 reads the trial's boot, or, when the
trial's kernel or init failed before its journal started, the boot that
took the turn.

It needs the permission to get nodes/proxy on the machine's Node (the
cluster's RBAC), and a machine whose kubelet runs: for a machine that does
not join at all, read its console. The kubelet answers within 30 seconds:
narrow a large query with --since or --tail.`,
		Example: `  # The node daemon's lines of this boot on node-4
  liken logs node-4

  # The kubelet and containerd of the last 10 minutes
  liken logs node-4 -u kubelet -u containerd --since 10m

  # liken-node in the boot before this one (a trial that failed)
  liken logs node-4 --boot -1

  # The kernel's messages of the boot before this one
  liken logs node-4 --kernel --boot -1

  # Follow liken-node's new lines
  liken logs node-4 -f`,
		Args: cmdutil.ExactArgs("MACHINE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Machine = args[0]
			cfg, err := flags.RESTConfig()
			if err != nil {
				return err
			}
			kc, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			return Print(cmd.Context(), kc.CoreV1().RESTClient(), opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringArrayVarP(&opts.Units, "unit", "u", nil, "A systemd unit to read, named without .service, such as kubelet or containerd (repeat for more, at most 4); liken-node when none is given.")
	cmd.Flags().DurationVar(&opts.Since, "since", 0, "Only the lines of the last DURATION, such as 10m or 2h.")
	cmd.Flags().IntVar(&opts.Boot, "boot", 0, "Which boot: 0 this one, -1 the one before it (such as a trial that failed), -2 the one before that...")
	cmd.Flags().IntVar(&opts.Tail, "tail", 0, "Only the last lines, this many (at most 100000); 0 prints them all.")
	cmd.Flags().StringVar(&opts.Grep, "grep", "", "Only the lines that match this regular expression.")
	cmd.Flags().BoolVar(&opts.Kernel, "kernel", false, "The kernel's messages (alone, or with the units -u names).")
	cmd.Flags().BoolVarP(&opts.Follow, "follow", "f", false, "Keep printing new lines of this boot until interrupted.")
	return cmd
}

// check says what is wrong with o, or nil.
func (o Options) check() error {
	switch {
	case len(o.units()) > maxUnits:
		return fmt.Errorf("%d units given (--kernel counts as one): the kubelet reads at most %d at a time", len(o.units()), maxUnits)
	case o.Boot > 0:
		return fmt.Errorf("--boot %d: give 0 for this boot, -1 for the one before it, and so on", o.Boot)
	case o.Follow && o.Boot != 0:
		return errors.New("--follow reads this boot's new lines: leave out --boot")
	case o.Since < 0 || o.Tail < 0:
		return errors.New("--since and --tail must not be negative")
	case o.Tail > maxTail:
		return fmt.Errorf("--tail %d: the kubelet returns at most %d lines", o.Tail, maxTail)
	}
	if o.Grep != "" {
		if _, err := syntax.Parse(o.Grep, syntax.Perl); err != nil {
			return fmt.Errorf("--grep %q is not a regular expression the kubelet takes: %v", o.Grep, err)
		}
	}
	for _, u := range o.Units {
		if !unitName.MatchString(u) {
			return fmt.Errorf("unit %q is not a systemd unit name (such as kubelet or liken-node)", u)
		}
	}
	return nil
}

// unitName is what the kubelet's log query takes for a unit.
var unitName = regexp.MustCompile(`^[a-zA-Z0-9_.:@-]+$`)

// units are the units o reads, as the kubelet names them: without
// .service.
func (o Options) units() []string {
	var out []string
	for _, u := range o.Units {
		out = append(out, strings.TrimSuffix(u, ".service"))
	}
	if o.Kernel {
		out = append(out, KernelUnit)
	}
	if len(out) == 0 {
		return []string{DefaultUnit}
	}
	return out
}

// query is the kubelet's node log query for o, reading from since when it
// is not zero.
func (o Options) query(since time.Time, tail bool) url.Values {
	q := url.Values{}
	for _, u := range o.units() {
		q.Add("query", u)
	}
	if !since.IsZero() {
		q.Set("sinceTime", since.UTC().Format(time.RFC3339))
	}
	// Always one boot: without it journalctl reads every boot kept.
	q.Set("boot", strconv.Itoa(o.Boot))
	if tail && o.Tail > 0 {
		q.Set("tailLines", strconv.Itoa(o.Tail))
	}
	if o.Grep != "" {
		q.Set("pattern", o.Grep)
	}
	return q
}

// Print reads the logs o names through client (the core API's REST
// client) and writes them to out; with o.Follow it goes on until ctx ends.
func Print(ctx context.Context, client rest.Interface, o Options, out io.Writer) error {
	if err := o.check(); err != nil {
		return err
	}
	var since time.Time
	if o.Since > 0 {
		since = o.Clock.Now().Add(-o.Since)
	}
	body, err := read(ctx, client, o, since, true)
	if !o.Follow || err != nil {
		if _, werr := out.Write(body); werr != nil {
			return werr
		}
		return err
	}
	f := follower{out: out, clock: o.Clock, seen: map[string]bool{}}
	f.add(body)
	t := o.Clock.NewTicker(FollowEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		from := since
		if !f.last.IsZero() {
			from = f.last
		}
		body, err := read(ctx, client, o, from, false)
		f.add(body)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// read asks the machine's kubelet for the lines, through the API server.
// It returns the lines without the kubelet's and journalctl's notes, and
// an error that says what those notes mean.
func read(ctx context.Context, client rest.Interface, o Options, since time.Time, tail bool) ([]byte, error) {
	req := client.Get().Resource("nodes").Name(o.Machine).SubResource("proxy").Suffix("logs/")
	for k, vs := range o.query(since, tail) {
		for _, v := range vs {
			req = req.Param(k, v)
		}
	}
	start := o.Clock.Now()
	body, err := req.DoRaw(ctx)
	if err != nil {
		return nil, explain(err, o.Machine)
	}
	return notes(body, o, o.Clock.Since(start))
}

// kubeletCut is how long an answer may take before it may have been cut:
// the kubelet stops journalctl 30 s after the query began, and then says
// nothing.
const kubeletCut = 29 * time.Second

// explain says what to do about a failed read.
func explain(err error, machine string) error {
	var st apierrors.APIStatus
	details := errors.As(err, &st) && st.Status().Details != nil && st.Status().Details.Kind == "nodes"
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("reading the logs of machine %s needs the permission to get nodes/proxy on its Node, which the API server refused to the user of your kubeconfig (%v): ask your cluster's admin for a role that grants it (docs/reference/security.md shows one)", machine, err)
	case apierrors.IsNotFound(err) && details:
		return fmt.Errorf("machine %s has no Node: it has not joined the cluster, or the name is wrong (kubectl get machines lists them)", machine)
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return fmt.Errorf("the API server could not reach the kubelet of machine %s (%v): the machine is down, rebooting or not joined; kubectl describe machine %s says what it last reported", machine, err, machine)
	case apierrors.IsBadRequest(err), apierrors.IsNotAcceptable(err):
		return fmt.Errorf("the kubelet of machine %s refused the query: %v", machine, err)
	}
	return kube.Explain(err, "the logs of machine "+machine)
}

// notes takes the kubelet's and journalctl's notes out of an answer that
// took the time took, and says what they mean; the rest is the lines.
func notes(body []byte, o Options, took time.Duration) ([]byte, error) {
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("<pre>")) {
		// A kubelet without the node log query lists /var/log instead.
		return nil, fmt.Errorf("the kubelet of machine %s does not serve its journal: the machine runs a release older than liken logs; upgrade it, or read its console", o.Machine)
	}
	var lines bytes.Buffer
	var errs []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "log not found for "), strings.HasPrefix(line, "options present and query resolved to log files"):
			errs = append(errs, fmt.Sprintf("machine %s's journal has never had a unit named %s, in any boot it keeps: name units as systemd does, without .service (liken-node, kubelet, containerd, etcd, kube-apiserver...)", o.Machine, unknownUnits(line, o)))
		case line == "try without specifying options":
		case strings.HasPrefix(line, "Data from the specified boot"), strings.HasPrefix(line, "No journal files were found"),
			strings.HasPrefix(line, "Specifying boot ID or boot offset has no effect"):
			errs = append(errs, fmt.Sprintf("machine %s's journal holds no boot %d (%s): it keeps the boots that fit in 128 MiB, and a boot that ended before its journal started (a kernel or init that failed) left none", o.Machine, o.Boot, line))
		case strings.HasPrefix(line, "context error: "):
			errs = append(errs, fmt.Sprintf("the kubelet of machine %s stopped after 30 s (%s): narrow the query with --since or --tail", o.Machine, line))
		case strings.HasPrefix(line, "error: journal output not available"), strings.HasPrefix(line, "failed to get logging cmd"), strings.HasPrefix(line, "error getting log for "):
			errs = append(errs, fmt.Sprintf("the kubelet of machine %s could not read its journal: %s", o.Machine, line))
		default:
			lines.WriteString(line)
			lines.WriteByte('\n')
			continue
		}
		// The kubelet puts a blank line before its notes.
		if b := lines.Bytes(); bytes.HasSuffix(b, []byte("\n\n")) || string(b) == "\n" {
			lines.Truncate(len(b) - 1)
		}
	}
	if took >= kubeletCut && !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, "stopped after 30 s") }) {
		errs = append(errs, fmt.Sprintf("the kubelet of machine %s stops journalctl 30 s after a query begins, and this answer took %s: its newest lines may be missing; narrow the query with --since or --tail", o.Machine, took.Round(time.Second)))
	}
	out := lines.Bytes()
	if len(errs) > 0 {
		return out, errors.New(strings.Join(slices.Compact(errs), "; "))
	}
	return out, nil
}

// unknownUnits names the units of a kubelet's note that the machine's
// journal never had: "log not found for UNIT", or "options present and
// query resolved to log files for [UNIT ...]"; all of o's when the note
// names none.
func unknownUnits(note string, o Options) string {
	if u, ok := strings.CutPrefix(note, "log not found for "); ok && u != "" {
		return u
	}
	if i, j := strings.Index(note, "["), strings.LastIndex(note, "]"); i >= 0 && j > i+1 {
		return strings.Join(strings.Fields(note[i+1:j]), ", ")
	}
	return strings.Join(o.units(), ", ")
}

// follower prints the lines of each round that the rounds before did not:
// a round asks from the second of the last line printed, so it repeats
// the lines of that second, which it skips.
type follower struct {
	out   io.Writer
	clock clock.Clock
	// rounds counts the answers added.
	rounds int
	// last is the time of the last line printed; seen the lines printed
	// in its second.
	last time.Time
	seen map[string]bool
}

func (f *follower) add(body []byte) {
	f.rounds++
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		at, ok := lineTime(line, f.clock.Now())
		if !ok {
			// journalctl's own notes ("-- No entries --") once, at the start.
			if f.rounds == 1 {
				fmt.Fprintln(f.out, line)
			}
			continue
		}
		second, lastSecond := at.Truncate(time.Second), f.last.Truncate(time.Second)
		switch {
		case second.Before(lastSecond), second.Equal(lastSecond) && f.seen[line]:
			continue
		case second.After(lastSecond):
			f.seen = map[string]bool{}
		}
		f.seen[line] = true
		f.last = at
		fmt.Fprintln(f.out, line)
	}
}

// lineTime reads the time at the start of a journalctl line in the
// kubelet's format (--utc --output=short-precise: "Dec 07 06:55:01.123456
// host unit[pid]: ..."), which has no year: now's, or the year before for
// a time more than a day after now (December's lines read in January).
func lineTime(line string, now time.Time) (time.Time, bool) {
	const layout = "Jan 02 15:04:05.000000"
	if len(line) < len(layout) {
		return time.Time{}, false
	}
	t, err := time.Parse(layout, line[:len(layout)])
	if err != nil {
		return time.Time{}, false
	}
	now = now.UTC()
	t = t.AddDate(now.Year(), 0, 0)
	if t.After(now.Add(24 * time.Hour)) {
		t = t.AddDate(-1, 0, 0)
	}
	return t, true
}
