package clip

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestTo(t *testing.T) {
	cases := []struct {
		name, s string
		n       int
		want    string
	}{
		{name: "short enough", s: "node-1 waits", n: 12, want: "node-1 waits"},
		{name: "cut with an ellipsis within n", s: "node-1 waits for its pods", n: 10, want: "node-1 ..."},
		{name: "never inside a character", s: "zone Europe/Zürich", n: 16, want: "zone Europe/Z..."},
		{name: "a character across the cut is left out", s: "zone Europe/Zürich", n: 17, want: "zone Europe/Z..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := To(tc.s, tc.n)
			assert.Equal(t, got, tc.want)
			assert.Assert(t, len(got) <= tc.n)
		})
	}
}
