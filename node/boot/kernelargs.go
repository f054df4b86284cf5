package boot

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"liken.sh/liken/internal/atomicfile"
)

// The extra kernel arguments (the Cluster's settings.kernelArgs) reach the
// kernel through a small GRUB script next to grub.cfg, which grub.cfg
// sources when it exists and puts on the kernel line of whichever slot it
// boots (docs/design/boot.md).
const (
	// KernelArgsFile is the script in the boot directory that sets
	// VarKernelArgs. A missing file means no extra arguments.
	KernelArgsFile = "liken-args.cfg"
	// VarKernelArgs is the GRUB variable KernelArgsFile sets.
	VarKernelArgs = "liken_kernel_args"
	// MaxKernelArgsLen bounds the extra arguments, joined by spaces, so
	// that they and liken's own arguments fit the kernel's 2048-byte
	// command line with room to spare.
	MaxKernelArgsLen = 1024
	// MaxKernelArgs bounds how many extra arguments there are: the kernel
	// hands the ones it does not know to init, and panics at boot when
	// there are more than 32 of one kind.
	MaxKernelArgs = 24
)

// kernelArgsHeader is the first line of KernelArgsFile.
const kernelArgsHeader = "# Written by liken-node from the Cluster's settings.kernelArgs; liken's grub.cfg sources it.\n"

// kernelArgForbidden are the printable characters an argument may not hold:
// GRUB passes a backslash or a quote to the kernel with a backslash in
// front (the kernel does not remove it), a single quote would end the GRUB
// string KernelArgsFile holds, and GRUB may expand * ? [ ] as file names.
const kernelArgForbidden = `"'\*?[]`

// ValidateKernelArgs checks that GRUB passes every argument to the kernel
// unchanged and that none can defeat liken's boot script; the error names
// the argument (docs/design/boot.md#quoting lists what is refused and why).
func ValidateKernelArgs(args []string) error {
	if len(args) > MaxKernelArgs {
		return fmt.Errorf("%d kernel arguments given, more than the %d liken passes: the kernel panics at boot when it has to hand too many unknown arguments to init; shorten settings.kernelArgs", len(args), MaxKernelArgs)
	}
	total := 0
	for i, a := range args {
		if a == "" {
			return fmt.Errorf("kernel argument %d is empty; remove it from settings.kernelArgs", i+1)
		}
		for _, r := range a {
			switch {
			case r == ' ' || r == '\t' || r == '\n' || r == '\r':
				return fmt.Errorf("kernel argument %q holds white space: give each argument as its own list item (a value with spaces cannot be passed)", a)
			case r < 0x21 || r > 0x7e:
				return fmt.Errorf("kernel argument %q holds the character %q: only printable ASCII can be passed through the boot loader", a, r)
			case strings.ContainsRune(kernelArgForbidden, r):
				return fmt.Errorf("kernel argument %q holds the character %q, which the boot loader would change or misread (none of %s can be used)", a, r, strings.Join(strings.Split(kernelArgForbidden, ""), " "))
			}
		}
		if a == "--" {
			return fmt.Errorf("kernel argument %q would pass the arguments after it to init instead of the kernel; remove it", a)
		}
		name, _, _ := strings.Cut(a, "=")
		if strings.HasPrefix(name, "liken.") {
			return fmt.Errorf("kernel argument %q: parameters named liken.* belong to liken's boot script and cannot be set", a)
		}
		if name == "panic" {
			return fmt.Errorf("kernel argument %q: liken's boot script sets panic= so that a kernel that fails reboots into the proven slot; it cannot be changed", a)
		}
		if SetsKernelPanic(name) {
			return fmt.Errorf("kernel argument %q sets the sysctl kernel.panic, which keeps a kernel that fails from rebooting into the proven slot; it cannot be set", a)
		}
		if g, ok := trialGuardOf(name); ok {
			return fmt.Errorf("kernel argument %q: liken's boot script sets %s=1 on a trial boot, so that a release that hangs reboots into the proven slot; it cannot be set in kernelArgs (to have it on every boot, set the sysctl kernel.%s to 1)", a, g, g)
		}
		total += len(a)
		if i > 0 {
			total++
		}
	}
	if total > MaxKernelArgsLen {
		return fmt.Errorf("kernel arguments take %d bytes, more than the %d the boot loader is given for them; shorten settings.kernelArgs", total, MaxKernelArgsLen)
	}
	return nil
}

// SetsKernelPanic tells whether the kernel parameter name sets the sysctl
// kernel.panic at boot: the kernel reads sysctl.<path>=<value>, with '.'
// or '/' between the parts of the path (and repeated separators ignored),
// as a write to /proc/sys/<path>. kernel.panic=0 would leave a kernel that
// panics in a trial hanging instead of rebooting into the proven slot.
func SetsKernelPanic(name string) bool {
	rest, ok := strings.CutPrefix(name, "sysctl")
	if !ok || rest == "" || (rest[0] != '.' && rest[0] != '/') {
		return false
	}
	return IsKernelPanicSysctl(rest)
}

// TrialGuardArgs are the kernel parameters grub.cfg adds to a trial boot's
// command line (liken_trial_guard): the trial panics, and reboots into the
// proven slot, when a CPU is stuck in the kernel (soft lockup), a task
// hangs in it for hung_task_timeout_secs, or the kernel oopses.
var TrialGuardArgs = []string{"softlockup_panic=1", "hung_task_panic=1", "panic_on_oops=1"}

// trialGuardOf is the parameter of TrialGuardArgs that the kernel
// parameter name sets, directly or as sysctl.kernel.<name>.
func trialGuardOf(name string) (string, bool) {
	if rest, ok := strings.CutPrefix(name, "sysctl"); ok && rest != "" && (rest[0] == '.' || rest[0] == '/') {
		return TrialGuardSysctl(rest)
	}
	for _, g := range TrialGuardArgs {
		if p, _, _ := strings.Cut(g, "="); name == p {
			return p, true
		}
	}
	return "", false
}

// TrialGuardSysctl tells whether a sysctl name (kernel.panic_on_oops,
// kernel/panic_on_oops, with any repetition of the separators) sets one
// of TrialGuardArgs, and which; settings.sysctls may set it to 1 only, so
// that a trial keeps rebooting into the proven slot when it hangs.
func TrialGuardSysctl(name string) (string, bool) {
	parts := strings.FieldsFunc(name, func(r rune) bool { return r == '.' || r == '/' })
	if len(parts) != 2 || parts[0] != "kernel" {
		return "", false
	}
	for _, g := range TrialGuardArgs {
		if p, _, _ := strings.Cut(g, "="); parts[1] == p {
			return p, true
		}
	}
	return "", false
}

// IsKernelPanicSysctl tells whether a sysctl name (kernel.panic,
// kernel/panic, with any repetition of the separators) names kernel.panic,
// the seconds before a kernel that panics reboots. liken sets it (panic=5
// on the kernel command line) and never lets configuration change it.
func IsKernelPanicSysctl(name string) bool {
	parts := strings.FieldsFunc(name, func(r rune) bool { return r == '.' || r == '/' })
	return len(parts) == 2 && parts[0] == "kernel" && parts[1] == "panic"
}

// KernelArgsConfig returns the contents of KernelArgsFile for args: a
// comment line and `set liken_kernel_args='...'`. The value is in single
// quotes, which GRUB takes literally, and ends the file: a file cut short
// anywhere lacks the closing quote, GRUB refuses the whole line, and the
// slot boots with no extra arguments rather than with some of them.
func KernelArgsConfig(args []string) ([]byte, error) {
	if err := ValidateKernelArgs(args); err != nil {
		return nil, err
	}
	return []byte(kernelArgsHeader + "set " + VarKernelArgs + "='" + strings.Join(args, " ") + "'\n"), nil
}

// ParseKernelArgsConfig reads back what KernelArgsConfig writes; anything
// else (a file cut short, a hand edit) is an error.
func ParseKernelArgsConfig(b []byte) ([]string, error) {
	rest, ok := bytes.CutPrefix(b, []byte(kernelArgsHeader))
	if !ok {
		return nil, fmt.Errorf("%s does not start with liken's header line", KernelArgsFile)
	}
	prefix := "set " + VarKernelArgs + "='"
	line, ok := bytes.CutPrefix(rest, []byte(prefix))
	if !ok || !bytes.HasSuffix(line, []byte("'\n")) || bytes.Count(line, []byte("'")) != 1 || bytes.Count(line, []byte("\n")) != 1 {
		return nil, fmt.Errorf("%s: want one line %s...' after the header, have %q", KernelArgsFile, prefix, rest)
	}
	args := strings.Fields(string(line[:len(line)-2]))
	if err := ValidateKernelArgs(args); err != nil {
		return nil, fmt.Errorf("%s: %w", KernelArgsFile, err)
	}
	return args, nil
}

// WriteKernelArgs validates args and replaces dir/KernelArgsFile with
// them atomically: a temporary file in dir is written and synced, renamed
// over the old one, and dir is synced, so a power cut leaves the old file
// or the new one, never a mix.
func WriteKernelArgs(dir string, args []string) error {
	b, err := KernelArgsConfig(args)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, KernelArgsFile), b, 0o644); err != nil {
		return fmt.Errorf("writing the kernel arguments for the next boot: %w", err)
	}
	return nil
}
