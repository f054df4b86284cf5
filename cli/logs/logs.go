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

// FollowEvery is how often --follow asks for new lines.
const FollowEvery = 2 * time.Second

// Options say what to read.
type Options struct {
	// Machine is the machine (its Node has the same name).
	Machine string
	// Units are the systemd units whose lines are read; DefaultUnit when
	// empty. At most 5 (the kubelet's limit).
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
	// Follow keeps reading new lines of the current boot until ctx ends.
	Follow bool
	// Clock tells the time of --since and --follow's rounds.
	Clock clock.WithTicker
}

// NewCommand returns liken logs.
func NewCommand(flags *kube.Flags) *cobra.Command {
	opts := Options{Clock: clock.RealClock{}}
	cmd := &cobra.Command{
		Use:   "logs MACHINE",
		Short: "Print a machine's logs (its journal), read through the API server",
		Long: `Print the journal of a machine: the lines of its services (liken-node when
no --unit is given), of this boot or of an earlier one, read through the
API server from the machine's kubelet (the Kubernetes node log query), so
no shell on the machine is needed. The journal is kept on the machine's
slot store, so the lines of earlier boots are there too: after a failed
trial, --boot -1 reads the boot that failed.

It needs the permission to get nodes/proxy on the machine's Node (the
cluster's RBAC), and a machine whose kubelet runs: for a machine that does
not join at all, read its console.`,
		Example: `  # The node daemon's lines of this boot on node-4
  liken logs node-4

  # The kubelet and containerd of the last 10 minutes
  liken logs node-4 -u kubelet -u containerd --since 10m

  # liken-node in the boot before this one (a trial that failed)
  liken logs node-4 --boot -1

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
	cmd.Flags().StringArrayVarP(&opts.Units, "unit", "u", nil, "A systemd unit to read, such as kubelet or containerd (repeat for more, at most 5); liken-node when none is given.")
	cmd.Flags().DurationVar(&opts.Since, "since", 0, "Only the lines of this last while, such as 10m or 2h.")
	cmd.Flags().IntVar(&opts.Boot, "boot", 0, "Which boot: 0 this one, -1 the one before it (such as a trial that failed), -2 the one before that...")
	cmd.Flags().IntVar(&opts.Tail, "tail", 0, "Only the last lines, this many; 0 prints them all.")
	cmd.Flags().StringVar(&opts.Grep, "grep", "", "Only the lines that match this regular expression.")
	cmd.Flags().BoolVarP(&opts.Follow, "follow", "f", false, "Keep printing new lines of this boot until interrupted.")
	return cmd
}

// check says what is wrong with o, or nil.
func (o Options) check() error {
	switch {
	case len(o.Units) > 5:
		return fmt.Errorf("%d units given: the kubelet reads at most 5 at a time", len(o.Units))
	case o.Boot > 0:
		return fmt.Errorf("--boot %d: give 0 for this boot, -1 for the one before it, and so on", o.Boot)
	case o.Follow && o.Boot != 0:
		return errors.New("--follow reads this boot's new lines: leave out --boot")
	case o.Since < 0 || o.Tail < 0:
		return errors.New("--since and --tail must not be negative")
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

// query is the kubelet's node log query for o, reading from since when it
// is not zero.
func (o Options) query(since time.Time, tail bool) url.Values {
	q := url.Values{}
	units := o.Units
	if len(units) == 0 {
		units = []string{DefaultUnit}
	}
	for _, u := range units {
		q.Add("query", u)
	}
	if !since.IsZero() {
		q.Set("sinceTime", since.UTC().Format(time.RFC3339))
	}
	if o.Boot != 0 {
		q.Set("boot", strconv.Itoa(o.Boot))
	}
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
	if err != nil {
		return err
	}
	if !o.Follow {
		_, err := out.Write(body)
		return err
	}
	f := follower{out: out, year: o.Clock.Now().UTC().Year(), seen: map[string]bool{}}
	f.add(body)
	if f.last.IsZero() {
		// Nothing printed yet: new lines are those from now on (this
		// computer's clock, to the second).
		f.last = o.Clock.Now()
	}
	t := o.Clock.NewTicker(FollowEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		body, err := read(ctx, client, o, f.last, false)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		f.add(body)
	}
}

// read asks the machine's kubelet for the lines, through the API server.
func read(ctx context.Context, client rest.Interface, o Options, since time.Time, tail bool) ([]byte, error) {
	req := client.Get().Resource("nodes").Name(o.Machine).SubResource("proxy").Suffix("logs/")
	for k, vs := range o.query(since, tail) {
		for _, v := range vs {
			req = req.Param(k, v)
		}
	}
	body, err := req.DoRaw(ctx)
	if err != nil {
		return nil, explain(err, o.Machine)
	}
	return body, nil
}

// explain says what to do about a failed read.
func explain(err error, machine string) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("reading the logs of machine %s needs the permission to get nodes/proxy on its Node, which the API server refused: %v (ask your cluster's admin for a role that grants it; docs/reference/security.md shows one)", machine, apierrors.ReasonForError(err))
	case apierrors.IsNotFound(err) && strings.Contains(err.Error(), "nodes"):
		return fmt.Errorf("machine %s has no Node: it has not joined the cluster, or the name is wrong (kubectl get machines lists them)", machine)
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return fmt.Errorf("the API server could not reach the kubelet of machine %s (%v): the machine is down, rebooting or not joined; kubectl describe machine %s says what it last reported", machine, err, machine)
	case apierrors.IsBadRequest(err):
		return fmt.Errorf("the kubelet of machine %s refused the query: %v", machine, err)
	}
	return kube.Explain(err, "the logs of machine "+machine)
}

// follower prints the lines of each round that the rounds before did not:
// a round asks from the second of the last line printed, so it repeats
// the lines of that second, which it skips.
type follower struct {
	out  io.Writer
	year int
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
		at, ok := lineTime(line, f.year)
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
// host unit[pid]: ..."), which has no year: year is taken.
func lineTime(line string, year int) (time.Time, bool) {
	const layout = "Jan 02 15:04:05.000000"
	if len(line) < len(layout) {
		return time.Time{}, false
	}
	t, err := time.Parse(layout, line[:len(layout)])
	if err != nil {
		return time.Time{}, false
	}
	return t.AddDate(year, 0, 0), true
}
