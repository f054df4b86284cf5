package window

import (
	"fmt"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

func win(days []string, start, duration, zone string) likenv1.MaintenanceWindow {
	d, err := time.ParseDuration(duration)
	if err != nil {
		panic(err)
	}
	return likenv1.MaintenanceWindow{Days: days, Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: zone}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

var (
	weekend     = []string{"Sat", "Sun"}
	saturday    = []string{"Sat"}
	sunday      = []string{"Sun"}
	weekdays    = []string{"Mon", "Tue", "Wed", "Thu", "Fri"}
	everyDay    = []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	berlin      = "Europe/Berlin"
	newYork     = "America/New_York"
	saturday22h = win(saturday, "22:00", "4h", berlin)
)

// The clock changes used below: Europe/Berlin goes to summer time on
// 2027-03-28 at 01:00 UTC (02:00 becomes 03:00) and back on 2026-10-25 at
// 01:00 UTC (03:00 becomes 02:00); America/New_York on 2027-03-14 at 07:00
// UTC (02:00 becomes 03:00) and back on 2026-11-01 at 06:00 UTC (02:00
// becomes 01:00).
func TestAt(t *testing.T) {
	cases := []struct {
		name    string
		windows []likenv1.MaintenanceWindow
		now     string
		open    bool
		closes  string // when open; "" for not within a week
		opens   string // when closed
		window  int    // the index of State.Window
	}{
		{name: "Saturday before the window", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2026-12-05T20:59:59Z", opens: "2026-12-05T21:00:00Z"},
		{name: "the opening minute is inside", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2026-12-05T21:00:00Z", open: true, closes: "2026-12-06T01:00:00Z"},
		{name: "a window that crosses midnight is open on Sunday at 01:00", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2026-12-06T00:00:00Z", open: true, closes: "2026-12-06T01:00:00Z"},
		{name: "the closing moment is outside", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2026-12-06T01:00:00Z", opens: "2026-12-12T21:00:00Z"},
		{name: "midweek the next window is Saturday's", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2026-12-02T02:35:00Z", opens: "2026-12-05T21:00:00Z"},
		{name: "summer time: the same window opens an hour earlier in UTC", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2027-06-05T19:00:00Z", opens: "2027-06-05T20:00:00Z"},

		// Berlin, clocks forward: 2027-03-28, 02:00 CET becomes 03:00 CEST.
		{name: "spring forward: a window closing at the skipped 02:00 closes when the clocks skip", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2027-03-28T00:59:59Z", open: true, closes: "2027-03-28T01:00:00Z"},
		{name: "spring forward: a window closing at the skipped 02:00 is closed after the skip", windows: []likenv1.MaintenanceWindow{saturday22h},
			now: "2027-03-28T01:00:00Z", opens: "2027-04-03T20:00:00Z"},
		{name: "spring forward: a window 00:00 for 4h lasts 3 hours and closes at 04:00 CEST",
			windows: []likenv1.MaintenanceWindow{win(sunday, "00:00", "4h", berlin)},
			now:     "2027-03-28T01:30:00Z", open: true, closes: "2027-03-28T02:00:00Z"},
		{name: "spring forward: a skipped start opens when the clocks skip it", windows: []likenv1.MaintenanceWindow{win(sunday, "02:30", "1h", berlin)},
			now: "2027-03-28T00:59:00Z", opens: "2027-03-28T01:00:00Z"},
		{name: "spring forward: a skipped start is open from the skip to its end on the clock", windows: []likenv1.MaintenanceWindow{win(sunday, "02:30", "1h", berlin)},
			now: "2027-03-28T01:00:00Z", open: true, closes: "2027-03-28T01:30:00Z"},
		{name: "spring forward, New York: a skipped start opens when the clocks skip it",
			windows: []likenv1.MaintenanceWindow{win(sunday, "02:30", "1h", newYork)},
			now:     "2027-03-14T06:59:00Z", opens: "2027-03-14T07:00:00Z"},

		// Berlin, clocks back: 2026-10-25, 03:00 CEST becomes 02:00 CET.
		{name: "fall back: a window 00:00 for 4h lasts 5 hours and closes at 04:00 CET",
			windows: []likenv1.MaintenanceWindow{win(sunday, "00:00", "4h", berlin)},
			now:     "2026-10-25T02:30:00Z", open: true, closes: "2026-10-25T03:00:00Z"},
		{name: "fall back: it opened at 00:00 CEST", windows: []likenv1.MaintenanceWindow{win(sunday, "00:00", "4h", berlin)},
			now: "2026-10-24T21:59:00Z", opens: "2026-10-24T22:00:00Z"},
		{name: "fall back: a start passed twice opens the first time", windows: []likenv1.MaintenanceWindow{win(sunday, "02:30", "1h", berlin)},
			now: "2026-10-25T00:00:00Z", opens: "2026-10-25T00:30:00Z"},
		{name: "fall back: and closes at 03:30 on the clock, which comes only once", windows: []likenv1.MaintenanceWindow{win(sunday, "02:30", "1h", berlin)},
			now: "2026-10-25T01:45:00Z", open: true, closes: "2026-10-25T02:30:00Z"},
		{name: "fall back, New York: a start passed twice opens the first time",
			windows: []likenv1.MaintenanceWindow{win(sunday, "01:30", "30m", newYork)},
			now:     "2026-11-01T05:00:00Z", opens: "2026-11-01T05:30:00Z"},

		{name: "a 7-day window is open all week", windows: []likenv1.MaintenanceWindow{win([]string{"Mon"}, "00:00", "168h", berlin)},
			now: "2026-12-06T22:59:59Z", open: true, closes: ""},
		{name: "a 7-day window is open across a clock change", windows: []likenv1.MaintenanceWindow{win([]string{"Wed"}, "12:00", "168h", berlin)},
			now: "2027-03-28T01:00:00Z", open: true, closes: ""},
		{name: "a 6-day window leaves a day closed", windows: []likenv1.MaintenanceWindow{win([]string{"Mon"}, "00:00", "144h", "UTC")},
			now: "2026-12-06T12:00:00Z", opens: "2026-12-07T00:00:00Z"},
		{name: "windows every night of the week", windows: []likenv1.MaintenanceWindow{win(everyDay, "01:00", "2h", "UTC")},
			now: "2026-12-02T03:00:00Z", opens: "2026-12-03T01:00:00Z"},

		{name: "overlapping windows: the later one keeps it open",
			windows: []likenv1.MaintenanceWindow{win(weekdays, "20:00", "4h", "UTC"), win([]string{"Tue"}, "23:00", "3h", "UTC")},
			now:     "2026-12-01T21:00:00Z", open: true, closes: "2026-12-02T02:00:00Z"},
		{name: "overlapping windows: inside both",
			windows: []likenv1.MaintenanceWindow{win(weekdays, "20:00", "4h", "UTC"), win([]string{"Tue"}, "23:00", "3h", "UTC")},
			now:     "2026-12-01T23:30:00Z", open: true, closes: "2026-12-02T02:00:00Z", window: 1},
		{name: "overlapping windows: inside the second only",
			windows: []likenv1.MaintenanceWindow{win(weekdays, "20:00", "4h", "UTC"), win([]string{"Tue"}, "23:00", "3h", "UTC")},
			now:     "2026-12-02T01:00:00Z", open: true, closes: "2026-12-02T02:00:00Z", window: 1},
		{name: "windows that follow without a gap",
			windows: []likenv1.MaintenanceWindow{win(saturday, "22:00", "2h", "UTC"), win(sunday, "00:00", "2h", "UTC")},
			now:     "2026-12-05T23:00:00Z", open: true, closes: "2026-12-06T02:00:00Z"},
		{name: "the next of windows in two zones is the earliest",
			windows: []likenv1.MaintenanceWindow{win(weekend, "02:00", "2h", newYork), win(weekend, "02:00", "2h", berlin)},
			now:     "2026-12-04T12:00:00Z", opens: "2026-12-05T01:00:00Z", window: 1},
		{name: "the next of windows in two zones, the other one",
			windows: []likenv1.MaintenanceWindow{win(weekend, "02:00", "2h", newYork), win(weekend, "02:00", "2h", berlin)},
			now:     "2026-12-05T03:00:00Z", opens: "2026-12-05T07:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, errs := Parse(tc.windows)
			assert.Assert(t, len(errs) == 0, "%v", errs)
			st := s.At(utc(tc.now))
			assert.Equal(t, st.Always, false)
			assert.Equal(t, st.Open, tc.open)
			assert.Equal(t, st.Window.Index, tc.window)
			if tc.open {
				assert.Assert(t, st.Opens.IsZero())
				if tc.closes == "" {
					assert.Assert(t, st.Closes.IsZero(), "closes %s", st.Closes.UTC())
				} else {
					assert.Equal(t, st.Closes.UTC(), utc(tc.closes))
				}
				return
			}
			assert.Assert(t, st.Closes.IsZero())
			assert.Equal(t, st.Opens.UTC(), utc(tc.opens))
			// The moment it opens, it is open.
			assert.Assert(t, s.At(st.Opens).Open)
		})
	}
}

func TestNoWindowsIsAlways(t *testing.T) {
	s, errs := Parse(nil)
	assert.Assert(t, len(errs) == 0)
	st := s.At(utc("2026-12-02T02:35:00Z"))
	assert.DeepEqual(t, st, State{Always: true, Open: true})
	var zero Schedule
	assert.DeepEqual(t, zero.At(utc("2026-12-02T02:35:00Z")), State{Always: true, Open: true})
}

// Every seven minutes of a year, the window is open exactly when the clock
// of its zone reads a time inside it, on the nights the clocks change too
// (2026-03-29 and 2026-10-25 are Sundays its Saturday window runs into).
func TestAtAgreesWithTheClock(t *testing.T) {
	s, errs := Parse([]likenv1.MaintenanceWindow{win([]string{"Tue", "Sat"}, "22:30", "5h", berlin)})
	assert.Assert(t, len(errs) == 0)
	loc, _ := time.LoadLocation(berlin)
	for now := utc("2026-01-01T00:00:00Z"); now.Before(utc("2027-01-01T00:00:00Z")); now = now.Add(7 * time.Minute) {
		l := now.In(loc)
		minutes := l.Hour()*60 + l.Minute()
		var want bool
		switch l.Weekday() {
		case time.Tuesday, time.Saturday:
			want = minutes >= 22*60+30
		case time.Wednesday, time.Sunday:
			want = minutes < 3*60+30
		}
		st := s.At(now)
		assert.Equal(t, st.Open, want, "at %s (%s)", now.UTC().Format(time.RFC3339), l.Format(time.RFC1123))
		if !st.Open {
			assert.Assert(t, st.Opens.After(now) && st.Opens.Sub(now) <= 7*24*time.Hour, "at %s: opens %s", now, st.Opens)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	cases := []struct {
		name   string
		window likenv1.MaintenanceWindow
		want   string
	}{
		{"unknown day", win([]string{"Sat", "Mo"}, "22:00", "4h", berlin),
			`spec.disruption.windows[0].days[1]: Unsupported value: "Mo": supported values: "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"`},
		{"day twice", win([]string{"Sat", "Sat"}, "22:00", "4h", berlin), `spec.disruption.windows[0].days[1]: Duplicate value: "Sat"`},
		{"no day", win(nil, "22:00", "4h", berlin), "spec.disruption.windows[0].days: Required value"},
		{"hour 24", win(saturday, "24:00", "4h", berlin), `spec.disruption.windows[0].start: Invalid value: "24:00": start must be a time of day HH:MM`},
		{"one digit", win(saturday, "7:00", "4h", berlin), `spec.disruption.windows[0].start: Invalid value: "7:00"`},
		{"minute 60", win(saturday, "22:60", "4h", berlin), `spec.disruption.windows[0].start: Invalid value: "22:60"`},
		{"seconds", win(saturday, "22:00:00", "4h", berlin), `spec.disruption.windows[0].start: Invalid value: "22:00:00"`},
		{"zero duration", win(saturday, "22:00", "0s", berlin), `spec.disruption.windows[0].duration: Invalid value: "0s": duration must be more than 0 and at most 7 days`},
		{"over 7 days", win(saturday, "22:00", "168h1m", berlin), `spec.disruption.windows[0].duration: Invalid value: "168h1m0s"`},
		{"unknown zone", win(saturday, "22:00", "4h", "Europe/Berln"),
			`spec.disruption.windows[0].timeZone: Invalid value: "Europe/Berln": unknown time zone (names are case-sensitive): use the IANA name of a time zone, such as Europe/Berlin`},
		{"lower case", win(saturday, "22:00", "4h", "europe/berlin"), `spec.disruption.windows[0].timeZone: Invalid value: "europe/berlin": unknown time zone`},
		{"Local", win(saturday, "22:00", "4h", "Local"), `spec.disruption.windows[0].timeZone: Invalid value: "Local": Local would be the zone of whichever machine reads the window`},
		{"empty", win(saturday, "22:00", "4h", ""), `spec.disruption.windows[0].timeZone: Invalid value: "": no time zone`},
		{"offset", win(saturday, "22:00", "4h", "+01:00"), `spec.disruption.windows[0].timeZone: Invalid value: "+01:00": not a time zone name`},
		{"path", win(saturday, "22:00", "4h", "../../etc/passwd"), `not a time zone name`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, errs := Parse([]likenv1.MaintenanceWindow{tc.window})
			assert.Assert(t, is.Len(errs, 1))
			assert.Assert(t, is.Contains(errs[0].Error(), tc.want))
			assert.Assert(t, is.Len(s.Windows(), 0))
		})
	}
	var many []likenv1.MaintenanceWindow
	for range MaxWindows + 1 {
		many = append(many, saturday22h)
	}
	_, errs := Parse(many)
	assert.ErrorContains(t, errs.ToAggregate(), "spec.disruption.windows: Too many: 33: must have at most 32 items")
}

func TestFormat(t *testing.T) {
	loc, err := Location(berlin)
	assert.NilError(t, err)
	ny, err := Location(newYork)
	assert.NilError(t, err)
	assert.Equal(t, Format(utc("2026-12-05T21:00:00Z"), loc), "Sat 2026-12-05 22:00 Europe/Berlin (21:00 UTC)")
	assert.Equal(t, Format(utc("2026-12-05T23:30:00Z"), loc), "Sun 2026-12-06 00:30 Europe/Berlin (Sat 23:30 UTC)")
	assert.Equal(t, Format(utc("2026-12-06T03:00:00Z"), ny), "Sat 2026-12-05 22:00 America/New_York (Sun 03:00 UTC)")
	assert.Equal(t, Format(utc("2026-12-05T21:00:30Z"), time.UTC), "Sat 2026-12-05 21:00:30 UTC")
}

func TestUntil(t *testing.T) {
	now := utc("2026-12-05T17:48:00Z")
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(3*time.Hour + 12*time.Minute), "3h12m"},
		{now.Add(3*time.Hour + 11*time.Minute + time.Second), "3h12m"},
		{now.Add(2 * time.Hour), "2h"},
		{now.Add(5 * time.Minute), "5m"},
		{now.Add(30 * time.Second), "under a minute"},
		{now.Add(23*time.Hour + 59*time.Minute), "23h59m"},
		{now.Add(24 * time.Hour), "1d"},
		{now.Add(6*24*time.Hour + 30*time.Minute), "6d"},
		{now.Add(5*24*time.Hour + 11*time.Hour), "5d11h"},
	} {
		assert.Equal(t, Until(tc.at, now), tc.want)
	}
}

func TestDescribe(t *testing.T) {
	s, errs := Parse([]likenv1.MaintenanceWindow{win([]string{"Sun", "Sat", "Mon"}, "22:00", "1h30m", berlin), win(everyDay, "01:05", "168h", "UTC")})
	assert.Assert(t, len(errs) == 0)
	assert.Equal(t, s.Windows()[0].Describe(), "Mon,Sat,Sun 22:00 for 1h30m Europe/Berlin")
	assert.Equal(t, s.Windows()[1].Describe(), "Mon,Tue,Wed,Thu,Fri,Sat,Sun 01:05 for 168h UTC")
}

// BenchmarkAt reads one window, and the most a Cluster may declare (32, in
// 8 time zones), at a moment when none is open.
func BenchmarkAt(b *testing.B) {
	zones := []string{"UTC", berlin, newYork, "Asia/Kolkata", "Australia/Sydney", "America/Sao_Paulo", "Asia/Tokyo", "Africa/Cairo"}
	var many []likenv1.MaintenanceWindow
	for i := range MaxWindows {
		many = append(many, win([]string{"Tue", "Thu", "Sat"}, fmt.Sprintf("%02d:%02d", i%24, i), "90m", zones[i%len(zones)]))
	}
	now := utc("2026-11-30T11:00:00Z") // a Monday
	for _, tc := range []struct {
		name    string
		windows []likenv1.MaintenanceWindow
	}{{"windows=1", many[:1]}, {"windows=32", many}} {
		b.Run(tc.name, func(b *testing.B) {
			s, errs := Parse(tc.windows)
			if len(errs) > 0 {
				b.Fatal(errs)
			}
			b.ReportAllocs()
			for b.Loop() {
				if s.At(now).Open {
					b.Fatal("open on a Monday")
				}
			}
		})
	}
}
