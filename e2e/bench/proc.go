package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture liken runs on).
const clockTicks = 100

// ProcSample is what /proc says of a process at one moment.
type ProcSample struct {
	// At is when the sample was read.
	At time.Time
	// CPU is the user plus system time the process used since it started.
	CPU time.Duration
	// RSS is its resident memory in bytes.
	RSS int64
}

// ReadProc reads a process's CPU time and resident memory.
func ReadProc(pid int) (ProcSample, error) {
	s := ProcSample{At: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("reading the CPU time of process %d: %w", pid, err)
	}
	// The fields after the command name (in parentheses, which may hold
	// spaces): state is field 3, utime 14 and stime 15.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: unexpected format %q", pid, stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: only %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("/proc/%d/stat: bad utime/stime %q %q", pid, f[11], f[12])
	}
	s.CPU = time.Duration(utime+stime) * time.Second / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return s, fmt.Errorf("/proc/%d/status: bad VmRSS %q", pid, rest)
			}
			s.RSS = kb << 10
		}
	}
	return s, nil
}

// Children are the processes whose parent is pid and whose command name
// (as /proc/<pid>/comm shows it, at most 15 bytes) is comm.
func Children(pid int, comm string) ([]int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, d := range dirs {
		p, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		open, close := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || close < open {
			continue
		}
		name := string(stat[open+1 : close])
		f := strings.Fields(string(stat[close+1:]))
		if len(f) < 2 || name != comm {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			out = append(out, p)
		}
	}
	return out, nil
}

// Sampler reads a process every interval until Stop.
type Sampler struct {
	pid     int
	mu      sync.Mutex
	samples []ProcSample
	err     error
	stop    chan struct{}
	done    chan struct{}
}

// StartSampler starts sampling pid now and every interval.
func StartSampler(pid int, interval time.Duration) *Sampler {
	s := &Sampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	s.sample()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *Sampler) sample() {
	p, err := ReadProc(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.samples = append(s.samples, p)
}

// Samples is how many samples were taken so far.
func (s *Sampler) Samples() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.samples)
}

// Stop takes a last sample and returns what was seen.
func (s *Sampler) Stop() (Usage, error) {
	close(s.stop)
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return Usage{}, s.err
	}
	return UsageOf(s.samples), nil
}

// Usage sums up a process over a window.
type Usage struct {
	// Wall is the window's length; CPU the time the process used in it.
	Wall, CPU time.Duration
	// RSSMedian and RSSMax are over the samples.
	RSSMedian, RSSMax int64
	// Samples is the number of samples.
	Samples int
}

// UsageOf sums up samples taken in order.
func UsageOf(samples []ProcSample) Usage {
	if len(samples) == 0 {
		return Usage{}
	}
	first, last := samples[0], samples[len(samples)-1]
	u := Usage{Wall: last.At.Sub(first.At), CPU: last.CPU - first.CPU, Samples: len(samples)}
	rss := make([]int64, 0, len(samples))
	for _, s := range samples {
		rss = append(rss, s.RSS)
	}
	slices.Sort(rss)
	u.RSSMedian, u.RSSMax = rss[len(rss)/2], rss[len(rss)-1]
	return u
}

// Cores is the CPU used per second of the window (1 is one whole core).
func (u Usage) Cores() float64 {
	if u.Wall <= 0 {
		return 0
	}
	return u.CPU.Seconds() / u.Wall.Seconds()
}

// MiB converts bytes to MiB.
func MiB(b int64) float64 { return float64(b) / (1 << 20) }
