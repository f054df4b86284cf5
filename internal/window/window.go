// Package window reads a Cluster's maintenance windows
// (spec.disruption.windows) and says, for a moment, whether a window is
// open and when the next one opens. cluster-operator grants turns by it
// and the liken command explains waits by it: the rule is written once,
// here.
//
// A window opens on each of its days the first moment the clock of its
// time zone reads its start time or later, and closes the first moment
// that clock reads its start plus its duration or later. So a window
// always ends at the same time on its clock: on the nights the clocks
// change it is open an hour more or less of real time; a start the clocks
// skip opens the window when they skip it; a time the clocks pass twice
// counts the first time.
package window

import (
	"fmt"
	"strings"
	"sync"
	"time"
	// Every program that reads windows carries the time zone database:
	// cluster-operator's container and some hosts the liken command runs
	// on have no /usr/share/zoneinfo, and a zone that loads on one side
	// but not the other would make them disagree about the windows.
	_ "time/tzdata"

	"k8s.io/apimachinery/pkg/util/validation/field"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// MaxDuration is the longest a window may stay open.
const MaxDuration = 7 * 24 * time.Hour

// MaxWindows is how many windows a Cluster may declare.
const MaxWindows = 32

// Days are the names of the days of the week a window may open on, in the
// order of time.Weekday (Sunday first).
var Days = [7]string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

// week lists the day names Monday first, as messages list them.
var week = []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}

// Window is one maintenance window, read.
type Window struct {
	// Index is the window's place in spec.disruption.windows.
	Index int
	// Days says, by time.Weekday, which days the window opens on.
	Days [7]bool
	// Hour and Minute are the start time on the window's clock.
	Hour, Minute int
	// Duration is how long it stays open on its clock.
	Duration time.Duration
	// Location is its time zone.
	Location *time.Location
}

// Schedule is a Cluster's maintenance windows, read. The zero Schedule has
// none: turns may be granted at any time.
type Schedule struct {
	windows []Window
}

// Windows are the windows of the schedule, in the order declared.
func (s Schedule) Windows() []Window { return s.windows }

// Path is the field that holds the windows, for messages.
var Path = field.NewPath("spec", "disruption", "windows")

// Parse reads spec.disruption.windows, naming each problem's field as the
// API server does; it checks again what the schema refuses, so that a
// Cluster that somehow carries one is never read as something else.
func Parse(windows []likenv1.MaintenanceWindow) (Schedule, field.ErrorList) {
	var errs field.ErrorList
	if len(windows) > MaxWindows {
		errs = append(errs, field.TooMany(Path, len(windows), MaxWindows))
	}
	out := make([]Window, 0, len(windows))
	for i, w := range windows {
		p := Path.Index(i)
		win := Window{Index: i, Duration: w.Duration.Duration}
		if len(w.Days) == 0 {
			errs = append(errs, field.Required(p.Child("days"), "name at least one day: any of Mon, Tue, Wed, Thu, Fri, Sat and Sun"))
		}
		for j, d := range w.Days {
			wd, ok := weekday(d)
			switch {
			case !ok:
				errs = append(errs, field.NotSupported(p.Child("days").Index(j), d, week))
			case win.Days[wd]:
				errs = append(errs, field.Duplicate(p.Child("days").Index(j), d))
			default:
				win.Days[wd] = true
			}
		}
		h, m, ok := parseStart(w.Start)
		if !ok {
			errs = append(errs, field.Invalid(p.Child("start"), w.Start, "start must be a time of day HH:MM on a 24-hour clock, from 00:00 to 23:59, such as 22:00"))
		}
		win.Hour, win.Minute = h, m
		if d := w.Duration.Duration; d <= 0 || d > MaxDuration {
			errs = append(errs, field.Invalid(p.Child("duration"), w.Duration.Duration.String(),
				"duration must be more than 0 and at most 7 days, written with h, m or s, such as 4h, 90m or 168h (a day is 24h)"))
		}
		loc, err := Location(w.TimeZone)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("timeZone"), w.TimeZone, err.Error()))
		}
		win.Location = loc
		out = append(out, win)
	}
	if len(errs) > 0 {
		return Schedule{}, errs
	}
	return Schedule{windows: out}, nil
}

func weekday(name string) (time.Weekday, bool) {
	for i, d := range Days {
		if d == name {
			return time.Weekday(i), true
		}
	}
	return 0, false
}

// parseStart reads "HH:MM", 00:00 to 23:59.
func parseStart(s string) (hour, minute int, ok bool) {
	if len(s) != 5 || s[2] != ':' {
		return 0, 0, false
	}
	digit := func(b byte) (int, bool) { return int(b - '0'), b >= '0' && b <= '9' }
	h1, ok1 := digit(s[0])
	h2, ok2 := digit(s[1])
	m1, ok3 := digit(s[3])
	m2, ok4 := digit(s[4])
	hour, minute = h1*10+h2, m1*10+m2
	if !ok1 || !ok2 || !ok3 || !ok4 || hour > 23 || minute > 59 {
		return 0, 0, false
	}
	return hour, minute, true
}

// locations caches the time zones loaded, by name: loading one reads and
// parses its tzdata. Only names that loaded are kept, so the cache holds at
// most the few hundred zones there are.
var locations sync.Map

// Location loads the IANA time zone name. It refuses an empty name,
// "Local" (the zone of whatever machine reads the window) and anything
// that is not a zone name, with an error that says what to write instead.
func Location(name string) (*time.Location, error) {
	if l, ok := locations.Load(name); ok {
		return l.(*time.Location), nil
	}
	const want = "use the IANA name of a time zone, such as Europe/Berlin, America/New_York or UTC"
	switch {
	case name == "":
		return nil, fmt.Errorf("no time zone: %s", want)
	case name == "Local":
		return nil, fmt.Errorf("Local would be the zone of whichever machine reads the window: %s", want)
	case strings.ContainsAny(name, ":\\") || strings.HasPrefix(name, "/") || strings.Contains(name, ".."):
		return nil, fmt.Errorf("not a time zone name: %s", want)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone (names are case-sensitive): %s", want)
	}
	locations.Store(name, loc)
	return loc, nil
}

// State is where a moment stands against a schedule.
type State struct {
	// Always is true for a schedule without windows: turns may be granted
	// at any time.
	Always bool
	// Open is true when a window is open (or Always).
	Open bool
	// Window is, when Open, the open window that closes last; otherwise
	// the window that opens next.
	Window Window
	// Closes is, when Open and not Always, when the windows open now
	// close: the end of the open window that closes last, or of the
	// windows that overlap or follow it without a gap. It is zero when
	// they stay open for more than a week from now.
	Closes time.Time
	// Opens is, when not Open, when the next window opens.
	Opens time.Time
}

// interval is one opening of a window: [open, close).
type interval struct {
	open, close time.Time
	w           *Window
}

// How many days around a moment At looks at, on each window's calendar: a
// window that opened up to 7 days before may still be open, every window
// opens again within 7 days, and At follows windows that keep one another
// open for 7 days at most. One more day each way covers a clock change.
const (
	daysBefore = 8
	daysAfter  = 8
)

// At says whether a window is open at now and, if not, when the next one
// opens; if so, when the open ones close.
func (s Schedule) At(now time.Time) State {
	if len(s.windows) == 0 {
		return State{Always: true, Open: true}
	}
	var all []interval
	for i := range s.windows {
		all = s.windows[i].intervals(now, all)
	}
	var st State
	for _, iv := range all {
		if !iv.open.After(now) && now.Before(iv.close) {
			if !st.Open || iv.close.After(st.Closes) {
				st.Open, st.Closes, st.Window = true, iv.close, *iv.w
			}
		}
	}
	if st.Open {
		// Windows that overlap or follow without a gap keep it open.
		horizon := now.Add(MaxDuration)
		for extended := true; extended && !st.Closes.After(horizon); {
			extended = false
			for _, iv := range all {
				if !iv.open.After(st.Closes) && iv.close.After(st.Closes) {
					st.Closes, extended = iv.close, true
				}
			}
		}
		if st.Closes.After(horizon) {
			st.Closes = time.Time{}
		}
		return st
	}
	for _, iv := range all {
		if iv.open.After(now) && (st.Opens.IsZero() || iv.open.Before(st.Opens)) {
			st.Opens, st.Window = iv.open, *iv.w
		}
	}
	return st
}

// intervals appends the openings of w from daysBefore days before now to
// daysAfter days after, on w's calendar.
func (w *Window) intervals(now time.Time, out []interval) []interval {
	local := now.In(w.Location)
	y, m, d := local.Date()
	for k := -daysBefore; k <= daysAfter; k++ {
		// The civil date and time of the start, kept in UTC: it has no
		// clock changes, so adding the duration there adds it on the
		// window's clock.
		start := time.Date(y, m, d+k, w.Hour, w.Minute, 0, 0, time.UTC)
		if !w.Days[start.Weekday()] {
			continue
		}
		open := firstReading(start, w.Location)
		closes := firstReading(start.Add(w.Duration), w.Location)
		if closes.After(open) {
			out = append(out, interval{open: open, close: closes, w: w})
		}
	}
	return out
}

// wall is the civil date and time t shows on its clock, as a UTC time.
func wall(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// firstReading is the first moment the clock of loc reads the civil time
// civil (given as a UTC time) or later: the moment the clocks skip it when
// they skip it, the first of the two when they pass it twice.
func firstReading(civil time.Time, loc *time.Location) time.Time {
	t := time.Date(civil.Year(), civil.Month(), civil.Day(), civil.Hour(), civil.Minute(), civil.Second(), civil.Nanosecond(), loc)
	switch shown := wall(t); {
	case shown.Before(civil):
		// The clocks skip civil, and t is before the skip: the skip is
		// the end of t's zone period.
		_, end := t.ZoneBounds()
		return end
	case shown.After(civil):
		// The clocks skip civil, and t is after the skip.
		start, _ := t.ZoneBounds()
		return start
	}
	// The clock may have read civil once already, before it was set back
	// at the start of t's zone period.
	start, _ := t.ZoneBounds()
	if start.IsZero() {
		return t
	}
	_, offBefore := start.Add(-time.Nanosecond).Zone()
	_, off := t.Zone()
	if offBefore <= off {
		return t
	}
	earlier := t.Add(-time.Duration(offBefore-off) * time.Second)
	if earlier.Before(start) && wall(earlier).Equal(civil) {
		return earlier
	}
	return t
}

// Format writes t as a person reads it in loc: weekday, date, time and
// zone name, then the same moment in UTC, such as
// "Sat 2026-12-05 22:00 Europe/Berlin (21:00 UTC)". The UTC part names its
// own day when it differs.
func Format(t time.Time, loc *time.Location) string {
	local, utc := t.In(loc), t.UTC()
	layout := "15:04"
	if t.Second() != 0 {
		layout = "15:04:05"
	}
	s := local.Format("Mon 2006-01-02 " + layout)
	if loc == time.UTC {
		return s + " UTC"
	}
	s += " " + loc.String()
	if local.YearDay() != utc.YearDay() || local.Year() != utc.Year() {
		return s + " (" + utc.Format("Mon "+layout) + " UTC)"
	}
	return s + " (" + utc.Format(layout) + " UTC)"
}

// Until says how long from now to t, rounded up to the minute: in hours
// and minutes such as "3h12m", from a day on in days and hours such as
// "5d11h", and "under a minute" when less.
func Until(t, now time.Time) string {
	d := t.Sub(now)
	if d < time.Minute {
		return "under a minute"
	}
	d = (d + time.Minute - 1).Truncate(time.Minute)
	h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
	switch {
	case h >= 24 && h%24 == 0:
		return fmt.Sprintf("%dd", h/24)
	case h >= 24:
		return fmt.Sprintf("%dd%dh", h/24, h%24)
	case h == 0:
		return fmt.Sprintf("%dm", m)
	case m == 0:
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh%dm", h, m)
}

// Describe says in words what w is, such as "Sat,Sun 22:00 for 4h
// Europe/Berlin".
func (w Window) Describe() string {
	var days []string
	for _, name := range week {
		if wd, _ := weekday(name); w.Days[wd] {
			days = append(days, name)
		}
	}
	return fmt.Sprintf("%s %02d:%02d for %s %s", strings.Join(days, ","), w.Hour, w.Minute, shortDuration(w.Duration), w.Location)
}

// shortDuration prints d without zero units: 4h, 90m as 1h30m, 168h.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
