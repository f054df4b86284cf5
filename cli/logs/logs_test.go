package logs

import (
	"bytes"
	"net/url"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestQuery(t *testing.T) {
	since := time.Date(2026, 12, 7, 6, 55, 1, 500, time.UTC)
	for _, tc := range []struct {
		name  string
		opts  Options
		since time.Time
		tail  bool
		want  url.Values
	}{
		{name: "liken-node of this boot when nothing is named", want: url.Values{"query": {"liken-node"}, "boot": {"0"}}},
		{name: "units without .service, boot, pattern", opts: Options{Units: []string{"kubelet.service", "containerd"}, Boot: -1, Grep: "error|fail"},
			want: url.Values{"query": {"kubelet", "containerd"}, "boot": {"-1"}, "pattern": {"error|fail"}}},
		{name: "since, to the second", since: since, want: url.Values{"query": {"liken-node"}, "boot": {"0"}, "sinceTime": {"2026-12-07T06:55:01Z"}}},
		{name: "tail in the first round", opts: Options{Tail: 20}, tail: true, want: url.Values{"query": {"liken-node"}, "boot": {"0"}, "tailLines": {"20"}}},
		{name: "no tail in later rounds", opts: Options{Tail: 20}, want: url.Values{"query": {"liken-node"}, "boot": {"0"}}},
		{name: "the kernel alone", opts: Options{Kernel: true}, want: url.Values{"query": {"liken-kernel-log"}, "boot": {"0"}}},
		{name: "the kernel and a unit", opts: Options{Kernel: true, Units: []string{"kubelet"}}, want: url.Values{"query": {"kubelet", "liken-kernel-log"}, "boot": {"0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.DeepEqual(t, tc.opts.query(tc.since, tc.tail), tc.want)
		})
	}
}

func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Units: []string{"a", "b", "c", "d", "e"}}, "5 units given (--kernel counts as one): the kubelet reads at most 4"},
		{Options{Units: []string{"a", "b", "c", "d"}, Kernel: true}, "5 units given"},
		{Options{Boot: 1}, "--boot 1: give 0 for this boot, -1 for the one before it"},
		{Options{Follow: true, Boot: -1}, "--follow reads this boot's new lines: leave out --boot"},
		{Options{Units: []string{"../etc/shadow"}}, `unit "../etc/shadow" is not a systemd unit name`},
		{Options{Since: -time.Minute}, "must not be negative"},
		{Options{Tail: 100001}, "--tail 100001: the kubelet returns at most 100000 lines"},
		{Options{Grep: "a(?=b)"}, `--grep "a(?=b)" is not a regular expression the kubelet takes`},
	} {
		assert.ErrorContains(t, tc.opts.check(), tc.want)
	}
	assert.NilError(t, Options{Units: []string{"kubelet"}, Boot: -2, Since: time.Hour, Grep: `Turn granted|\bfail`}.check())
}

// TestNotes: the kubelet's and journalctl's notes in an answer become an
// error that says what they mean, and the lines around them are kept.
func TestNotes(t *testing.T) {
	o := Options{Machine: "node-4", Units: []string{"kubelet", "bogus"}, Boot: -1}
	line := "Dec 07 06:55:01.100000 node-4 kubelet[12]: a\n"
	for _, tc := range []struct {
		name, body, lines, err string
		took                   time.Duration
	}{
		{name: "lines only", body: line, lines: line},
		{name: "journalctl's no entries is no error", body: "-- No entries --\n", lines: "-- No entries --\n"},
		{name: "a unit with no lines", body: line + "\nlog not found for bogus\n", lines: line,
			err: "machine node-4's journal has never had a unit named bogus, in any boot it keeps: name units as systemd does, without .service"},
		{name: "a unit with no lines, with options", body: "\noptions present and query resolved to log files for [bogus]\ntry without specifying options\n",
			err: "machine node-4's journal has never had a unit named bogus, in any"},
		{name: "no such boot", body: "Data from the specified boot (-1) is not available: No such boot ID in journal\n",
			err: "machine node-4's journal holds no boot -1 (Data from the specified boot (-1) is not available: No such boot ID in journal): it keeps the boots that fit in 128 MiB"},
		{name: "the kubelet's 30 s", body: line + "\ncontext error: context deadline exceeded\n", lines: line,
			err: "stopped after 30 s (context error: context deadline exceeded): narrow the query with --since or --tail"},
		{name: "an answer that took the kubelet's 30 s", body: line, lines: line, took: 30 * time.Second,
			err: "the kubelet of machine node-4 stops journalctl 30 s after a query begins, and this answer took 30s: its newest lines may be missing; narrow the query with --since or --tail"},
		{name: "an answer within the kubelet's time", body: line, lines: line, took: 28 * time.Second},
		{name: "a release without the log query", body: "<pre>\n<a href=\"dpkg.log\">dpkg.log</a>\n</pre>\n",
			err: "the kubelet of machine node-4 does not serve its journal: the machine runs a release older than liken logs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines, err := notes([]byte(tc.body), o, tc.took)
			assert.Equal(t, string(lines), tc.lines)
			if tc.err == "" {
				assert.NilError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.err)
			}
		})
	}
}

// TestFollowPrintsEachLineOnce: each round repeats the lines of the second
// the last one printed was in (the kubelet's query is to the second);
// they are printed once, and lines of that second that are new are not
// lost.
func TestFollowPrintsEachLineOnce(t *testing.T) {
	var out bytes.Buffer
	f := follower{out: &out, clock: clocktesting.NewFakeClock(time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)), seen: map[string]bool{}}
	f.add([]byte("-- No entries --\n"))
	f.add([]byte("Dec 07 06:55:01.100000 node-4 liken-node[12]: a\nDec 07 06:55:01.900000 node-4 liken-node[12]: b\n"))
	f.add([]byte("Dec 07 06:55:01.100000 node-4 liken-node[12]: a\nDec 07 06:55:01.900000 node-4 liken-node[12]: b\n" +
		"Dec 07 06:55:01.950000 node-4 liken-node[12]: c\nDec 07 06:55:02.000001 node-4 liken-node[12]: d\n"))
	f.add([]byte("-- No entries --\nDec 07 06:55:02.000001 node-4 liken-node[12]: d\n"))
	assert.Equal(t, out.String(), "-- No entries --\n"+
		"Dec 07 06:55:01.100000 node-4 liken-node[12]: a\nDec 07 06:55:01.900000 node-4 liken-node[12]: b\n"+
		"Dec 07 06:55:01.950000 node-4 liken-node[12]: c\nDec 07 06:55:02.000001 node-4 liken-node[12]: d\n")
	assert.Check(t, is.Equal(f.last, time.Date(2026, 12, 7, 6, 55, 2, 1000, time.UTC)))
}

// TestLineTimeAcrossNewYear: December's lines read in January are of the
// year before.
func TestLineTimeAcrossNewYear(t *testing.T) {
	jan := time.Date(2027, 1, 1, 0, 0, 5, 0, time.UTC)
	dec, ok := lineTime("Dec 31 23:59:59.000000 node-4 liken-node[12]: a", jan)
	assert.Assert(t, ok)
	assert.Equal(t, dec, time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC))
	newYear, ok := lineTime("Jan 01 00:00:01.000000 node-4 liken-node[12]: b", jan)
	assert.Assert(t, ok)
	assert.Assert(t, newYear.After(dec))
	_, ok = lineTime("-- No entries --", jan)
	assert.Assert(t, !ok)
}
