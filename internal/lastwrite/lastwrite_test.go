package lastwrite

import (
	"testing"

	"gotest.tools/v3/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// obj is a version of the object; its name says where it came from.
func obj(from, rv string) *metav1.ObjectMeta {
	return &metav1.ObjectMeta{Name: from, ResourceVersion: rv}
}

func TestLatest(t *testing.T) {
	type write struct{ from, out string }
	type check struct {
		key    string // "m" unless set
		cached string
		// want is "cache" or the resourceVersion of the write returned.
		want string
	}
	for _, tc := range []struct {
		name   string
		writes []write
		forget bool
		checks []check
	}{{
		name:   "nothing written: the cache",
		checks: []check{{cached: "1", want: "cache"}},
	}, {
		name:   "the cache still shows the version the write replaced: the write",
		writes: []write{{"1", "2"}},
		checks: []check{{cached: "1", want: "2"}, {cached: "1", want: "2"}},
	}, {
		name:   "the cache caught up: the cache, and the write is forgotten",
		writes: []write{{"1", "2"}},
		checks: []check{{cached: "2", want: "cache"}, {cached: "1", want: "cache"}},
	}, {
		name:   "another writer moved the object on: the cache",
		writes: []write{{"1", "2"}},
		checks: []check{{cached: "3", want: "cache"}, {cached: "1", want: "cache"}},
	}, {
		name:   "writes in a row: the last one while the cache shows any version they replaced",
		writes: []write{{"1", "2"}, {"2", "3"}},
		checks: []check{{cached: "1", want: "3"}, {cached: "2", want: "3"}, {cached: "3", want: "cache"}},
	}, {
		name:   "a write that changed nothing kept its version: the cache",
		writes: []write{{"1", "1"}},
		checks: []check{{cached: "1", want: "cache"}},
	}, {
		name:   "forgotten after a failed write: the cache",
		writes: []write{{"1", "2"}},
		forget: true,
		checks: []check{{cached: "1", want: "cache"}},
	}, {
		name:   "a write returned without a resourceVersion cannot be matched: the cache",
		writes: []write{{"1", "2"}, {"2", ""}},
		checks: []check{{cached: "1", want: "cache"}},
	}, {
		name:   "each key on its own",
		writes: []write{{"1", "2"}},
		checks: []check{{key: "other", cached: "1", want: "cache"}, {cached: "1", want: "2"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var w Writes[*metav1.ObjectMeta]
			for _, wr := range tc.writes {
				w.Wrote("m", wr.from, obj("write", wr.out))
			}
			if tc.forget {
				w.Forget("m")
			}
			for _, c := range tc.checks {
				key := c.key
				if key == "" {
					key = "m"
				}
				got := w.Latest(key, obj("cache", c.cached))
				if c.want == "cache" {
					assert.DeepEqual(t, got, obj("cache", c.cached))
				} else {
					assert.DeepEqual(t, got, obj("write", c.want))
				}
			}
		})
	}
}
