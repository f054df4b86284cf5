package boot

import (
	"bytes"
	"errors"
	"io/fs"
	"strings"
	"testing"
)

// memFiles is a boot folder in memory.
type memFiles map[string][]byte

func (m memFiles) read(name string) ([]byte, error) {
	b, ok := m[name]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return bytes.Clone(b), nil
}

func (m memFiles) rewrite(name string, b []byte) error {
	if _, ok := m[name]; !ok {
		return fs.ErrNotExist
	}
	m[name] = bytes.Clone(b)
	return nil
}

func seedBlocks() [][]byte {
	var seeds [][]byte
	for _, st := range []State{{Proven: SlotA}, {Proven: SlotB, Trial: SlotA}} {
		b, _ := Encode(st, []EnvVar{{"saved_entry", "a\\b\nc"}})
		seeds = append(seeds, b)
	}
	return append(seeds,
		nil,
		[]byte(envSignature),
		[]byte(envSignature+"liken_proven=B\nliken_trial=1"),
		block("liken_proven=A\x00\nliken_trial=1\nliken_trial=1\n"),
		block("x\nliken_proven=B\nliken_trial=\\\n1\n"),
	)
}

// FuzzDecode: any bytes decode to a whitelisted state, or to an error with
// at most a proven slot and never a trial.
func FuzzDecode(f *testing.F) {
	for _, s := range seedBlocks() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Decode(b)
		if err == nil {
			if verr := st.Validate(); verr != nil {
				t.Fatalf("decoded an invalid state without error: %v", verr)
			}
			return
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error does not wrap ErrCorrupt: %v", err)
		}
		if st.Trial != "" || (st.Proven != "" && !st.Proven.Valid()) {
			t.Fatalf("corrupt block decoded to %s", st)
		}
		// The decision from this copy alone, whatever the other holds.
		d := decide(b, nil)
		if !d.state.Proven.Valid() || d.state.Trial != "" {
			t.Fatalf("corrupt primary led to %s", d.state)
		}
	})
}

// FuzzSelectBoot: for any two copies, the firmware boots A or B, tries a
// slot only when a valid copy armed it, and never twice in a row.
func FuzzSelectBoot(f *testing.F) {
	seeds := seedBlocks()
	for i, s := range seeds {
		f.Add(s, seeds[(i+1)%len(seeds)])
	}
	f.Fuzz(func(t *testing.T, primary, backup []byte) {
		files := memFiles{EnvFile: bytes.Clone(primary), BackupFile: bytes.Clone(backup)}
		want := decide(primary, backup)
		sel := selectBoot(files)
		if !sel.Slot.Valid() {
			t.Fatalf("booted slot %q", sel.Slot)
		}
		if sel.Trial && sel.Slot != want.state.Trial {
			t.Fatalf("trial of %s, but the copies arm %s", sel.Slot, want.state)
		}
		if !sel.Trial && sel.Slot != want.state.Proven {
			t.Fatalf("booted %s, proven is %s", sel.Slot, want.state.Proven)
		}
		if len(files[EnvFile]) != len(primary) || len(files[BackupFile]) != len(backup) {
			t.Fatal("a copy changed size")
		}
		again := selectBoot(files)
		if again.Trial {
			t.Fatalf("second power-on tried %s again", again.Slot)
		}
		if sel.Trial && again.Slot != want.state.Proven {
			t.Fatalf("after a trial of %s the next boot is %s, not the proven %s", sel.Slot, again.Slot, want.state.Proven)
		}
	})
}

// FuzzEnvSet: GRUB's in-place edit never changes the block's size, and
// when it succeeds on a block whose only entry of that name is at a line
// start, load_env reads the new value.
func FuzzEnvSet(f *testing.F) {
	for _, s := range seedBlocks() {
		f.Add(s, "liken_trial", "0")
	}
	f.Fuzz(func(t *testing.T, b []byte, name, value string) {
		nb := bytes.Clone(b)
		ok := envSet(nb, name, value)
		if len(nb) != len(b) {
			t.Fatal("size changed")
		}
		if !ok && !bytes.Equal(nb, b) {
			t.Fatal("failed set changed the block")
		}
		envDelete(nb, name)
		if len(nb) != len(b) {
			t.Fatal("delete changed the size")
		}
	})
}

// FuzzEncode: every valid state with any other variables encodes to a
// block that decodes to the same state, or is refused.
func FuzzEncode(f *testing.F) {
	f.Add("A", false, "saved_entry", "x")
	f.Add("B", true, "a", "\\\n")
	f.Fuzz(func(t *testing.T, proven string, trial bool, name, value string) {
		st := State{Proven: Slot(proven)}
		if trial {
			st.Trial = st.Proven.Other()
		}
		b, err := Encode(st, []EnvVar{{name, value}})
		if err != nil {
			return
		}
		got, err := Decode(b)
		if err != nil || got != st {
			t.Fatalf("encoded %s, decoded %s (%v)", st, got, err)
		}
		vars, _ := ParseEnvBlock(b)
		if name != VarProven && name != VarTrial && (len(vars) != 3 || vars[0] != (EnvVar{name, value})) {
			t.Fatalf("other variable not kept: %q", vars)
		}
	})
}

// FuzzKernelArgsConfig: any list of arguments (split on "|" from the input)
// is either refused, or written as one single-quoted GRUB string that holds
// nothing GRUB would read as anything else, and reads back the same.
func FuzzKernelArgsConfig(f *testing.F) {
	for _, s := range []string{"", "quiet", "a=1|b=$x", "a'b", `a"b`, "a b", "liken.slot=B", "--", "panic=0", "x=${y};reboot", "a=\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var args []string
		if s != "" {
			args = strings.Split(s, "|")
		}
		b, err := KernelArgsConfig(args)
		if err != nil {
			return
		}
		line, ok := bytes.CutPrefix(b, []byte(kernelArgsHeader+"set "+VarKernelArgs+"='"))
		if !ok || bytes.Count(line, []byte("'")) != 1 || !bytes.HasSuffix(line, []byte("'\n")) {
			t.Fatalf("args %q: not one single-quoted value: %q", args, b)
		}
		if bytes.ContainsAny(line[:len(line)-2], "\"\\*?[]\n\r\t\x00") {
			t.Fatalf("args %q: the value holds a character GRUB would alter: %q", args, b)
		}
		got, err := ParseKernelArgsConfig(b)
		if err != nil {
			t.Fatalf("args %q: written, but not read back: %v", args, err)
		}
		if strings.Join(got, "|") != s {
			t.Fatalf("args %q read back as %q", args, got)
		}
		for _, a := range got {
			if a == "--" || strings.HasPrefix(a, "liken.") || strings.HasPrefix(a, "panic=") || a == "panic" {
				t.Fatalf("args %q: %q must be refused", args, a)
			}
		}
	})
}
