package bench

import (
	"slices"
	"testing"
	"time"
)

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of d, or
// 0 when d is empty.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// Median is the 50th percentile of d.
func Median(d []time.Duration) time.Duration { return Percentile(d, 50) }

// MedianFloat is the median of v (the lower middle for an even count).
func MedianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
