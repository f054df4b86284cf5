package boot

import (
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// block builds an environment block from raw entry text.
func block(entries string) []byte {
	b := []byte(envSignature + entries)
	for len(b) < EnvBlockSize {
		b = append(b, '#')
	}
	return b
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		block   []byte
		want    State
		wantErr string
	}{
		{"proven A", block("liken_proven=A\nliken_trial=0\n"), State{Proven: SlotA}, ""},
		{"proven B, trial armed", block("liken_proven=B\nliken_trial=1\n"), State{Proven: SlotB, Trial: SlotA}, ""},
		{"no trial entry means 0", block("liken_proven=B\n"), State{Proven: SlotB}, ""},
		{"last entry wins", block("liken_proven=A\nliken_trial=1\nliken_proven=B\nliken_trial=0\n"), State{Proven: SlotB}, ""},
		{"NUL cuts the value", block("liken_proven=A\x00B\n"), State{Proven: SlotA}, ""},
		{"other variables ignored", block("saved_entry=0\nliken_proven=A\n"), State{Proven: SlotA}, ""},
		{"not a block", []byte("hello"), State{}, "not a GRUB environment block"},
		{"empty", nil, State{}, "environment block is empty"},
		{"no proven", block("liken_trial=1\n"), State{}, `liken_proven="" is not A or B`},
		{"lower case slot", block("liken_proven=a\n"), State{}, `liken_proven="a" is not A or B`},
		{"slot with space", block("liken_proven=A \n"), State{}, `liken_proven="A " is not A or B`},
		{"bad trial keeps proven", block("liken_proven=B\nliken_trial=yes\n"), State{Proven: SlotB}, `liken_trial="yes" is not 0 or 1`},
		{"empty trial keeps proven", block("liken_proven=B\nliken_trial=\n"), State{Proven: SlotB}, `liken_trial="" is not 0 or 1`},
		{"broken after proven", []byte(envSignature + "liken_proven=A\nliken_trial=1"), State{Proven: SlotA}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.block)
			assert.DeepEqual(t, got, tc.want)
			if tc.wantErr == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
			assert.Assert(t, errors.Is(err, ErrCorrupt))
		})
	}
}

func TestEncode(t *testing.T) {
	for _, st := range []State{{Proven: SlotA}, {Proven: SlotB}, {Proven: SlotA, Trial: SlotB}, {Proven: SlotB, Trial: SlotA}} {
		b, err := Encode(st, []EnvVar{{"keep", "me"}, {VarProven, "junk"}})
		assert.NilError(t, err)
		assert.Equal(t, len(b), EnvBlockSize)
		got, err := Decode(b)
		assert.NilError(t, err)
		assert.Equal(t, got, st)
		vars, err := ParseEnvBlock(b)
		assert.NilError(t, err)
		assert.Equal(t, vars[0], EnvVar{"keep", "me"})
		assert.Equal(t, len(vars), 3)
	}
	for _, st := range []State{{}, {Proven: "C"}, {Proven: SlotA, Trial: SlotA}, {Proven: SlotB, Trial: "x"}} {
		_, err := Encode(st, nil)
		assert.ErrorContains(t, err, "invalid boot state", "state %v", st)
	}
}

func TestKeepVars(t *testing.T) {
	b := block("a=1\nliken_proven=A\nb\\x=2\nx\ny=3\na=4\nc=5\n")
	assert.DeepEqual(t, keepVars(b), []EnvVar{{"a", "4"}, {"c", "5"}})
}

func TestSlot(t *testing.T) {
	assert.Equal(t, SlotA.Other(), SlotB)
	assert.Equal(t, SlotB.Other(), SlotA)
	assert.Equal(t, Slot("C").Other(), Slot(""))
	for _, v := range []string{"A", "B"} {
		s, err := ParseSlot(v)
		assert.NilError(t, err)
		assert.Equal(t, string(s), v)
	}
	for _, v := range []string{"", "a", "b", "C", "AB", " A"} {
		_, err := ParseSlot(v)
		assert.ErrorContains(t, err, "a slot is A or B", "value %q", v)
	}
	assert.Equal(t, State{Proven: SlotA, Trial: SlotB}.String(), "proven=A trial=B")
	assert.Equal(t, State{Proven: SlotB}.String(), "proven=B trial=none")
}

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		cmdline   string
		slot      Slot
		trial     bool
		wantError string
	}{
		{"BOOT_IMAGE=/A/vmlinuz liken.slot=A panic=5 quiet", SlotA, false, ""},
		{"liken.slot=B panic=5 liken.trial=1 console=ttyS0\n", SlotB, true, ""},
		{"liken.trial=0 liken.slot=B", SlotB, false, ""},
		{`foo="a b liken.slot=A" liken.slot=B`, SlotB, false, ""},
		{"liken.slot=B liken.slot=B", SlotB, false, ""},
		{"liken.slot=A -- liken.slot=B", SlotA, false, ""},
		{"quiet", "", false, "no liken.slot=A|B"},
		{"", "", false, "no liken.slot=A|B"},
		{"liken.slot=C", "", false, `invalid boot slot "C"`},
		{"liken.slot=", "", false, `invalid boot slot ""`},
		{"liken.slot=A liken.slot=B", "", false, "sets liken.slot twice"},
		{"liken.slot=A liken.trial=yes", "", false, `liken.trial="yes"; want 0 or 1`},
		{"liken.slot=A liken.trial", "", false, "liken.trial has no value"},
		{"liken.slot=A liken.trial=1 liken.trial=0", "", false, "sets liken.trial twice"},
	}
	for _, tc := range tests {
		t.Run(strings.ReplaceAll(tc.cmdline, " ", "_"), func(t *testing.T) {
			slot, trial, err := ParseCmdline(tc.cmdline)
			if tc.wantError != "" {
				assert.ErrorContains(t, err, tc.wantError)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, slot, tc.slot)
			assert.Equal(t, trial, tc.trial)
		})
	}
}
