package logs

import (
	"bytes"
	"net/url"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
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
		{name: "liken-node when no unit is named", want: url.Values{"query": {"liken-node"}}},
		{name: "units, boot, pattern", opts: Options{Units: []string{"kubelet", "containerd"}, Boot: -1, Grep: "error|fail"},
			want: url.Values{"query": {"kubelet", "containerd"}, "boot": {"-1"}, "pattern": {"error|fail"}}},
		{name: "since, to the second", since: since, want: url.Values{"query": {"liken-node"}, "sinceTime": {"2026-12-07T06:55:01Z"}}},
		{name: "tail in the first round", opts: Options{Tail: 20}, tail: true, want: url.Values{"query": {"liken-node"}, "tailLines": {"20"}}},
		{name: "no tail in later rounds", opts: Options{Tail: 20}, want: url.Values{"query": {"liken-node"}}},
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
		{Options{Units: []string{"a", "b", "c", "d", "e", "f"}}, "6 units given: the kubelet reads at most 5"},
		{Options{Boot: 1}, "--boot 1: give 0 for this boot, -1 for the one before it"},
		{Options{Follow: true, Boot: -1}, "--follow reads this boot's new lines: leave out --boot"},
		{Options{Units: []string{"../etc/shadow"}}, `unit "../etc/shadow" is not a systemd unit name`},
		{Options{Since: -time.Minute}, "must not be negative"},
	} {
		assert.ErrorContains(t, tc.opts.check(), tc.want)
	}
	assert.NilError(t, Options{Units: []string{"kubelet"}, Boot: -2, Since: time.Hour}.check())
}

// TestFollowPrintsEachLineOnce: each round repeats the lines of the second
// the last one printed was in (the kubelet's query is to the second);
// they are printed once, and lines of that second that are new are not
// lost.
func TestFollowPrintsEachLineOnce(t *testing.T) {
	var out bytes.Buffer
	f := follower{out: &out, year: 2026, seen: map[string]bool{}}
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
