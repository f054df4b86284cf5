package image

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestParseReleaseFile(t *testing.T) {
	cases := []struct {
		in, want, err string
	}{
		{in: "VERSION=2026.11.01-001\n", want: "2026.11.01-001"},
		{in: "NAME=liken\nLIKEN_VERSION=\"2026.11.01-002\"\n", want: "2026.11.01-002"},
		{in: "# the running image\n2026.11.01-003\n", want: "2026.11.01-003"},
		{in: "VERSION=latest\n", err: `VERSION="latest" is not a release version`},
		{in: "NAME=liken\n", err: "no release version found"},
		{in: "", err: "no release version found"},
	}
	for _, tc := range cases {
		got, err := ParseReleaseFile([]byte(tc.in))
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "input %q", tc.in)
			continue
		}
		assert.NilError(t, err, "input %q", tc.in)
		assert.Equal(t, got, tc.want)
	}
}

func TestReleaseFileContentReadsBack(t *testing.T) {
	got, err := ParseReleaseFile([]byte(ReleaseFileContent("2026.11.01-004")))
	assert.NilError(t, err)
	assert.Equal(t, got, "2026.11.01-004")
}
