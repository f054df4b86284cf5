// Package stuck says where an end-to-end test package is stuck, shortly
// before `go test -timeout` kills it, in the last lines of the log (the
// lines a CI log keeps).
package stuck

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Margin is how long before the -timeout the report is written.
const Margin = time.Minute

// Main runs the package's tests. When they are still running Margin
// before the -timeout, it writes Report to standard error and exits 1,
// so the test binary ends with its own words instead of Go's stack dump
// of every goroutine.
func Main(m *testing.M) {
	flag.Parse()
	var timer *time.Timer
	if d := timeout(); d > 2*Margin {
		timer = time.AfterFunc(d-Margin, func() {
			Report(os.Stderr, d)
			os.Exit(1)
		})
	}
	code := m.Run()
	if timer != nil {
		timer.Stop()
	}
	os.Exit(code)
}

// timeout is the value of -test.timeout (0 when there is none).
func timeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, _ := f.Value.(flag.Getter).Get().(time.Duration)
	return d
}

// Report writes the stacks of the goroutines that run liken's code, then
// one line per such goroutine with the liken frame it is in, then the
// tests still running.
func Report(w io.Writer, limit time.Duration) {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var where, tests []string
	fmt.Fprintf(w, "\n%s before the test binary's %s limit, these goroutines still run liken's code:\n\n", Margin, limit)
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		if !strings.Contains(s, "liken.sh/liken/") || strings.Contains(s, "/e2e/internal/stuck.Report(") || strings.Contains(s, "/e2e/internal/stuck.Main(") {
			continue // this report, or the test binary's main waiting for its tests
		}
		fmt.Fprintf(w, "%s\n\n", s)
		where = append(where, summary(s))
		for _, m := range testFunc.FindAllStringSubmatch(s, -1) {
			if !slices.Contains(tests, m[1]) {
				tests = append(tests, m[1])
			}
		}
	}
	fmt.Fprintln(w, "where they are (goroutine: first liken frame, and the call it waits in):")
	for _, l := range where {
		fmt.Fprintf(w, "  %s\n", l)
	}
	fmt.Fprintf(w, "FAIL: still running %s before the %s limit: %s\n", Margin, limit, strings.Join(tests, ", "))
}

var (
	testFunc = regexp.MustCompile(`liken\.sh/liken/[\w./-]*\.(Test\w+|Benchmark\w+)`)
	frame    = regexp.MustCompile(`(?m)^(\S.*)\(.*\)\n\t(\S+:\d+)`)
)

// summary is "goroutine N [state]: FUNC at FILE:LINE, in CALL" for one
// goroutine's stack: the first frame in liken's code and the top frame.
func summary(stack string) string {
	head, _, _ := strings.Cut(stack, "\n")
	head = strings.TrimSuffix(head, ":")
	frames := frame.FindAllStringSubmatch(stack, -1)
	if len(frames) == 0 {
		return head
	}
	for _, f := range frames {
		if strings.HasPrefix(f[1], "liken.sh/liken/") {
			return fmt.Sprintf("%s: %s at %s, in %s", head, f[1], f[2], frames[0][1])
		}
	}
	return head
}
