package stuck

import (
	"bytes"
	"regexp"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestReportNamesTheStuckTestAndItsLine: a test blocked on a channel is
// named on the last line, and its goroutine's summary gives the liken
// frame it waits in.
func TestReportNamesTheStuckTestAndItsLine(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(1)
	go blockedHelper(&started, release)
	started.Wait()
	defer close(release)

	var out bytes.Buffer
	Report(&out, 40*time.Minute)
	s := out.String()
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	assert.Check(t, is.Equal(string(lines[len(lines)-1]), "FAIL: still running 1m0s before the 40m0s limit: TestReportNamesTheStuckTestAndItsLine"))
	assert.Check(t, is.Regexp(regexp.MustCompile(`(?m)^  goroutine \d+ \[chan receive\]: liken\.sh/liken/e2e/internal/stuck\.blockedHelper at \S+/stuck_test\.go:\d+, in liken\.sh/liken/e2e/internal/stuck\.blockedHelper$`), s))
	assert.Check(t, !bytes.Contains(out.Bytes(), []byte("stuck.Report(")), "the report lists its own goroutine:\n%s", s)
}

// blockedHelper waits on release, as a test waits on a process that never
// answers.
func blockedHelper(started *sync.WaitGroup, release chan struct{}) {
	started.Done()
	<-release
}

func TestMain(m *testing.M) { Main(m) }
