package boot

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "editenv", name))
	assert.NilError(t, err)
	return b
}

// TestEditenvGoldens replays the steps hack/boot/grubenv-goldens.sh ran
// with GRUB's grub-editenv and checks every block byte for byte.
func TestEditenvGoldens(t *testing.T) {
	type op struct {
		unset       bool
		name, value string
	}
	steps := []struct {
		golden string
		ops    []op
	}{
		{"02-set-state", []op{{name: "liken_trial", value: "0"}, {name: "liken_proven", value: "A"}}},
		{"03-arm", []op{{name: "liken_trial", value: "1"}}},
		{"04-others", []op{{name: "saved_entry", value: "x"}, {name: "odd", value: "a\\b\nc"}}},
		{"05-clear", []op{{name: "liken_trial", value: "0"}}},
		{"06-commit", []op{{name: "liken_proven", value: "B"}}},
		{"07-grow", []op{{name: "odd", value: "longer\\value"}}},
		{"08-shrink", []op{{name: "odd", value: "s"}}},
		{"09-unset", []op{{unset: true, name: "saved_entry"}}},
	}
	blk, err := NewEnvBlock(nil)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(blk, golden(t, "01-create")), "empty block differs from grub-editenv create")
	for _, s := range steps {
		for _, o := range s.ops {
			if o.unset {
				envDelete(blk, o.name)
			} else {
				assert.Assert(t, envSet(blk, o.name, o.value), "%s: set %s", s.golden, o.name)
			}
		}
		assert.Assert(t, bytes.Equal(blk, golden(t, s.golden)), "%s: block differs from grub-editenv's:\n%q\n%q", s.golden, blk, golden(t, s.golden))
	}

	// A fresh encoding of the same variables equals grub-editenv's blocks
	// built from create plus set in order.
	fresh, err := NewEnvBlock([]EnvVar{{"liken_trial", "1"}, {"liken_proven", "A"}})
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(fresh, golden(t, "03-arm")))

	vars, err := ParseEnvBlock(golden(t, "04-others"))
	assert.NilError(t, err)
	assert.DeepEqual(t, vars, []EnvVar{{"liken_trial", "1"}, {"liken_proven", "A"}, {"saved_entry", "x"}, {"odd", "a\\b\nc"}})
}

func TestParseEnvBlockQuirks(t *testing.T) {
	pad := func(s string) []byte {
		b := []byte(envSignature + s)
		for len(b) < EnvBlockSize {
			b = append(b, '#')
		}
		return b
	}
	tests := []struct {
		name    string
		block   []byte
		want    []EnvVar
		wantErr string
	}{
		{name: "empty", block: nil, wantErr: "environment block is empty"},
		{name: "no signature", block: []byte(strings.Repeat("x", 1024)), wantErr: "not a GRUB environment block"},
		{name: "signature only, too short for GRUB", block: []byte(envSignature), wantErr: "not a GRUB environment block"},
		{name: "signature and one byte", block: []byte(envSignature + "#"), want: nil},
		{name: "comments skipped", block: pad("# c=1\na=1\n"), want: []EnvVar{{"a", "1"}}},
		{name: "duplicates kept in order", block: pad("a=1\na=2\n"), want: []EnvVar{{"a", "1"}, {"a", "2"}}},
		{name: "NUL ends value", block: pad("a=B\x00junk\n"), want: []EnvVar{{"a", "B"}}},
		{name: "NUL ends name", block: pad("a\x00x=B\n"), want: []EnvVar{{"a", "B"}}},
		{name: "name spans a newline", block: pad("x\na=1\n"), want: []EnvVar{{"x\na", "1"}}},
		{name: "escaped newline", block: pad("a=1\\\n2\n"), want: []EnvVar{{"a", "1\n2"}}},
		{name: "no newline at end stops", block: []byte(envSignature + "a=1\nb=2"), want: []EnvVar{{"a", "1"}}},
		{name: "no equals stops", block: []byte(envSignature + "a=1\nbbb"), want: []EnvVar{{"a", "1"}}},
		{name: "trailing backslash stops", block: []byte(envSignature + "a=1\nb=\\"), want: []EnvVar{{"a", "1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnvBlock(tc.block)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestNewEnvBlockRefuses(t *testing.T) {
	tests := []struct {
		name    string
		vars    []EnvVar
		wantErr string
	}{
		{"bad name", []EnvVar{{"a=b", "1"}}, `name "a=b" is not a plain name`},
		{"newline in name", []EnvVar{{"a\nb", "1"}}, "is not a plain name"},
		{"twice", []EnvVar{{"a", "1"}, {"a", "2"}}, "a is given twice"},
		{"NUL", []EnvVar{{"a", "1\x00"}}, "NUL byte"},
		{"too big", []EnvVar{{"a", strings.Repeat("v", 1000)}}, "more than the 1024-byte block"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewEnvBlock(tc.vars)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestEnvSetLimits(t *testing.T) {
	blk, err := NewEnvBlock([]EnvVar{{"a", strings.Repeat("v", 900)}})
	assert.NilError(t, err)
	before := bytes.Clone(blk)
	assert.Check(t, !envSet(blk, "b", strings.Repeat("w", 100)), "no room")
	assert.Check(t, is.DeepEqual(blk, before))

	broken := bytes.Clone(before)
	broken[EnvBlockSize-1] = 'x' // the padding no longer ends a line
	assert.Check(t, !envSet(broken, "a", "1"))
	assert.Check(t, !envSet([]byte("garbage"), "a", "1"))
}
