package boote2e

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/boot"
)

// TestGrubScriptCheck: GRUB's own parser accepts liken's grub.cfg.
func TestGrubScriptCheck(t *testing.T) {
	t.Parallel()
	k := kit(t)
	cfg := filepath.Join(t.TempDir(), "grub.cfg")
	assert.NilError(t, os.WriteFile(cfg, boot.GrubConfig(), 0o644))
	cmd := exec.Command(k.Tool("grub-script-check"), cfg)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+k.LibraryPath())
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "grub-script-check: %s", out)
}

// TestGrubScriptCheckKernelArgs: GRUB's own parser accepts the arguments
// file the applier writes, with every character an argument may hold, and
// refuses it cut short (which grub.cfg then ignores).
func TestGrubScriptCheckKernelArgs(t *testing.T) {
	t.Parallel()
	k := kit(t)
	staged := stagedArgsFile(t, []string{"mitigations=off", "likentest.punct=!#$%&()+,-./:;<=>@^_`{|}~", "x=${prefix}"})
	check := func(b []byte) error {
		f := filepath.Join(t.TempDir(), "liken-args.cfg")
		assert.NilError(t, os.WriteFile(f, b, 0o644))
		cmd := exec.Command(k.Tool("grub-script-check"), f)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+k.LibraryPath())
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	assert.NilError(t, check(staged))
	assert.Assert(t, check(staged[:len(staged)-3]) != nil, "a file cut short must not parse")
}

// TestEditenvAgrees compares the Go codec with GRUB's grub-editenv (the
// same envblk code as GRUB's load_env and save_env) on blocks with random
// damage: what each lists, and the bytes each writes for set and unset.
func TestEditenvAgrees(t *testing.T) {
	t.Parallel()
	k := kit(t)
	dir := t.TempDir()
	editenv := func(file string, args ...string) (string, error) {
		cmd := exec.Command(k.Tool("grub-editenv"), append([]string{file}, args...)...)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+k.LibraryPath())
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			return stdout.String(), fmt.Errorf("%v: %s", err, stderr.String())
		}
		return stdout.String(), nil
	}

	var seeds [][]byte
	for _, st := range []boot.State{{Proven: boot.SlotA}, {Proven: boot.SlotB, Trial: boot.SlotA}} {
		b, err := boot.Encode(st, []boot.EnvVar{{Name: "saved_entry", Value: "x\\y\nz"}})
		assert.NilError(t, err)
		seeds = append(seeds, b)
	}
	rng := rand.New(rand.NewSource(1))
	alphabet := []byte("=\\\n#\x00liken_trial=1AB")
	const cases = 150
	compared := map[string]int{}
	for i := 0; i < cases; i++ {
		b := bytes.Clone(seeds[rng.Intn(len(seeds))])
		for n := rng.Intn(6); n > 0; n-- {
			// Damage near the entries, where it matters.
			pos := 25 + rng.Intn(120)
			switch rng.Intn(4) {
			case 0:
				b[pos] = alphabet[rng.Intn(len(alphabet))]
			case 1:
				b[pos] = byte(rng.Intn(256))
			case 2:
				b[len(b)-1-rng.Intn(30)] = alphabet[rng.Intn(len(alphabet))]
			case 3:
				if rng.Intn(4) == 0 {
					b[rng.Intn(25)] ^= 0x20 // signature
				}
			}
		}
		file := filepath.Join(dir, fmt.Sprintf("env%03d", i))
		assert.NilError(t, os.WriteFile(file, b, 0o644))

		// list: the variables GRUB reads.
		listed, err := editenv(file, "list")
		vars, gerr := boot.ParseEnvBlock(b)
		if err != nil {
			assert.Assert(t, gerr != nil, "case %d: grub-editenv refused the block (%v), Go read it: %q", i, err, b)
			compared["refused"]++
			continue
		}
		assert.NilError(t, gerr, "case %d", i)
		var goList strings.Builder
		for _, v := range vars {
			fmt.Fprintf(&goList, "%s=%s\n", v.Name, v.Value)
		}
		assert.Equal(t, goList.String(), listed, "case %d: list differs for %q", i, b)
		compared["list"]++

		// set and unset: the bytes GRUB writes back.
		for _, op := range [][]string{{"set", "liken_trial=0"}, {"set", "liken_proven=B"}, {"unset", "liken_trial"}} {
			assert.NilError(t, os.WriteFile(file, b, 0o644))
			_, err := editenv(file, op...)
			want := bytes.Clone(b)
			var gerr error
			if op[0] == "set" {
				name, value, _ := strings.Cut(op[1], "=")
				gerr = boot.SetEnv(want, name, value)
			} else {
				boot.UnsetEnv(want, op[1])
			}
			if err != nil {
				assert.Assert(t, gerr != nil, "case %d: grub-editenv %v failed (%v), Go did not: %q", i, op, err, b)
				compared["set refused"]++
				continue
			}
			assert.NilError(t, gerr, "case %d: grub-editenv %v succeeded, Go did not: %q", i, op, b)
			got, rerr := os.ReadFile(file)
			assert.NilError(t, rerr)
			assert.Assert(t, bytes.Equal(got, want), "case %d: %v on %q\ngrub-editenv: %q\ngo:           %q", i, op, b, got, want)
			compared[op[0]]++
		}
	}
	t.Logf("compared with grub-editenv: %v", compared)
	assert.Assert(t, compared["list"] > cases/2 && compared["set"] > cases/2, "too few valid cases: %v", compared)
}
