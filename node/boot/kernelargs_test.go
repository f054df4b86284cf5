package boot

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	goldenfile "gotest.tools/v3/golden"
)

func TestValidateKernelArgs(t *testing.T) {
	long := strings.Repeat("x", MaxKernelArgsLen/2)
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{"none", nil, ""},
		{"common arguments", []string{"mitigations=off", "intel_iommu=on", "isolcpus=1-3", "hugepages=16", "rd.break", "systemd.unified_cgroup_hierarchy=1"}, ""},
		{"punctuation GRUB passes unchanged", []string{"memmap=4G$16G", "acpi_osi=!Linux", "vfio-pci.ids=10de:1b80,10de:10f0", "video=HDMI-A-1:1920x1080@60", "x=#%&(){}<>|;^~`+"}, ""},
		{"exactly the limit", []string{long, long[1:]}, ""},
		{"empty argument", []string{"quiet", ""}, "kernel argument 2 is empty"},
		{"space inside", []string{"acpi_osi=!Windows 2012"}, `kernel argument "acpi_osi=!Windows 2012" holds white space`},
		{"newline", []string{"a\nb"}, "holds white space"},
		{"double quote", []string{`init="/bin/sh"`}, `kernel argument "init=\"/bin/sh\"" holds the character '"'`},
		{"single quote ends the GRUB string", []string{"a='; reboot; '"}, `holds the character '\''`},
		{"backslash", []string{`a=\x`}, `holds the character '\\'`},
		{"wildcard", []string{"a=*"}, `holds the character '*'`},
		{"bracket", []string{"a=[1]"}, `holds the character '['`},
		{"control character", []string{"a=\x01"}, "only printable ASCII"},
		{"not ASCII", []string{"a=é"}, "only printable ASCII"},
		{"end of kernel arguments", []string{"--", "x"}, `kernel argument "--" would pass the arguments after it to init`},
		{"panic timeout", []string{"panic=0"}, `kernel argument "panic=0": liken's boot script sets panic=`},
		{"a trial's guard off", []string{"softlockup_panic=0"}, `kernel argument "softlockup_panic=0": liken's boot script sets softlockup_panic=1 on a trial boot`},
		{"a trial's guard, even on", []string{"panic_on_oops=1"}, "sets panic_on_oops=1 on a trial boot"},
		{"a trial's guard as a sysctl", []string{"sysctl.kernel/hung_task_panic=0"}, "sets hung_task_panic=1 on a trial boot"},
		{"another panic parameter", []string{"panic_print=1"}, ""},
		{"sysctl kernel.panic", []string{"sysctl.kernel.panic=0"}, `kernel argument "sysctl.kernel.panic=0" sets the sysctl kernel.panic`},
		{"sysctl kernel/panic", []string{"sysctl.kernel/panic=0"}, "sets the sysctl kernel.panic"},
		{"sysctl with slashes only", []string{"sysctl/kernel/panic=0"}, "sets the sysctl kernel.panic"},
		{"sysctl with repeated separators", []string{"sysctl..kernel//panic=0"}, "sets the sysctl kernel.panic"},
		{"sysctl kernel.panic without a value", []string{"sysctl.kernel.panic"}, "sets the sysctl kernel.panic"},
		{"other kernel sysctls", []string{"sysctl.kernel.panic_on_warn=1", "sysctl.kernel.panicx=1", "sysctl.vm.swappiness=10", "sysctlkernel.panic=0"}, ""},
		{"most arguments", strings.Fields(strings.Repeat("a ", MaxKernelArgs)), ""},
		{"too many arguments", strings.Fields(strings.Repeat("a ", MaxKernelArgs+1)), "25 kernel arguments given, more than the 24"},
		{"liken's slot", []string{"liken.slot=B"}, `kernel argument "liken.slot=B": parameters named liken.* belong to liken's boot script`},
		{"liken's trial flag without a value", []string{"liken.trial"}, "belong to liken's boot script"},
		{"one byte too long", []string{long, long}, "kernel arguments take 1025 bytes, more than the 1024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateKernelArgs(tc.args)
			if tc.err == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

func TestKernelArgsConfig(t *testing.T) {
	b, err := KernelArgsConfig([]string{"mitigations=off", "memmap=4G$16G", "acpi_osi=!Linux"})
	assert.NilError(t, err)
	goldenfile.Assert(t, string(b), "liken-args.cfg")

	b, err = KernelArgsConfig(nil)
	assert.NilError(t, err)
	assert.Assert(t, bytes.HasSuffix(b, []byte("\nset liken_kernel_args=''\n")), "%q", b)

	_, err = KernelArgsConfig([]string{"ok", "a='b'"})
	assert.ErrorContains(t, err, `kernel argument "a='b'"`)
}

func TestKernelArgsConfigRoundTrip(t *testing.T) {
	for _, args := range [][]string{nil, {"quiet"}, {"a=1", "b=$x", "c=${y}", "d=#e"}} {
		b, err := KernelArgsConfig(args)
		assert.NilError(t, err)
		got, err := ParseKernelArgsConfig(b)
		assert.NilError(t, err)
		if len(args) == 0 {
			assert.Equal(t, len(got), 0)
			continue
		}
		assert.DeepEqual(t, got, args)
	}
}

// TestKernelArgsConfigCutShort: a file cut at any byte never holds a
// complete assignment (GRUB refuses the line: no extra arguments), and the
// Go reader refuses it too.
func TestKernelArgsConfigCutShort(t *testing.T) {
	b, err := KernelArgsConfig([]string{"mitigations=off", "isolcpus=1-3"})
	assert.NilError(t, err)
	for n := 0; n < len(b)-1; n++ {
		cut := b[:n]
		i := bytes.Index(cut, []byte("set "+VarKernelArgs+"='"))
		if i >= 0 {
			assert.Assert(t, !bytes.Contains(cut[i+len("set "+VarKernelArgs+"='"):], []byte("'")),
				"cut at %d: the value is already closed: %q", n, cut)
		}
		_, err := ParseKernelArgsConfig(cut)
		assert.Assert(t, err != nil, "cut at %d read as complete: %q", n, cut)
	}
	// The last byte is the newline: without it GRUB still reads the line.
	assert.Equal(t, string(b[len(b)-2:]), "'\n")
}

func TestParseKernelArgsConfigRefuses(t *testing.T) {
	for name, b := range map[string]string{
		"empty":        "",
		"no header":    "set liken_kernel_args='a'\n",
		"two lines":    kernelArgsHeader + "set liken_kernel_args='a'\nreboot\n",
		"other var":    kernelArgsHeader + "set other='a'\n",
		"double quote": kernelArgsHeader + "set liken_kernel_args=\"a\"\n",
		"bad argument": kernelArgsHeader + "set liken_kernel_args='liken.slot=B'\n",
	} {
		_, err := ParseKernelArgsConfig([]byte(b))
		assert.Assert(t, err != nil, name)
	}
}

func TestWriteKernelArgs(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, WriteKernelArgs(dir, []string{"quiet"}))
	assert.NilError(t, WriteKernelArgs(dir, []string{"mitigations=off", "hugepages=16"}))
	b, err := os.ReadFile(filepath.Join(dir, KernelArgsFile))
	assert.NilError(t, err)
	args, err := ParseKernelArgsConfig(b)
	assert.NilError(t, err)
	assert.DeepEqual(t, args, []string{"mitigations=off", "hugepages=16"})

	// Refused arguments leave the file as it was.
	assert.ErrorContains(t, WriteKernelArgs(dir, []string{"a b"}), `kernel argument "a b" holds white space`)
	b2, err := os.ReadFile(filepath.Join(dir, KernelArgsFile))
	assert.NilError(t, err)
	assert.DeepEqual(t, b2, b)

	// No temporary file is left behind.
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 1, "%v", ents)

	// A folder that cannot be written is an error, not a silent skip.
	assert.ErrorContains(t, WriteKernelArgs(filepath.Join(dir, "missing"), nil), "writing the kernel arguments for the next boot")
}
