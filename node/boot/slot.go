// Package boot keeps liken's boot state (the proven slot and the one-shot trial) in GRUB's environment block, and ships the grub.cfg that acts on it.
package boot

import (
	"fmt"
	"strings"
)

// Slot names one of the two boot slots.
type Slot string

// The two boot slots. Installation writes A; upgrades alternate.
const (
	SlotA Slot = "A"
	SlotB Slot = "B"
)

// Other returns the slot that is not s, or "" when s is not a valid slot.
func (s Slot) Other() Slot {
	switch s {
	case SlotA:
		return SlotB
	case SlotB:
		return SlotA
	}
	return ""
}

// Valid reports whether s is A or B.
func (s Slot) Valid() bool { return s == SlotA || s == SlotB }

// ParseSlot accepts exactly "A" or "B".
func ParseSlot(v string) (Slot, error) {
	s := Slot(v)
	if !s.Valid() {
		return "", fmt.Errorf("invalid boot slot %q: a slot is A or B", v)
	}
	return s, nil
}

// State is the persistent boot state.
type State struct {
	// Proven is the slot the machine boots when no trial is armed or a trial fails.
	Proven Slot
	// Trial is the slot the next boot tries once, or "" when no trial is armed.
	Trial Slot
}

// Validate checks that Proven is a slot and that Trial is empty or the other slot.
func (s State) Validate() error {
	if !s.Proven.Valid() {
		return fmt.Errorf("invalid boot state: proven slot %q is not A or B", s.Proven)
	}
	if s.Trial != "" && s.Trial != s.Proven.Other() {
		return fmt.Errorf("invalid boot state: trial slot %q must be the slot other than the proven slot %s", s.Trial, s.Proven)
	}
	return nil
}

// String renders the state for logs, e.g. "proven=A trial=B".
func (s State) String() string {
	t := string(s.Trial)
	if t == "" {
		t = "none"
	}
	return fmt.Sprintf("proven=%s trial=%s", s.Proven, t)
}

// Kernel command-line parameters that liken's grub.cfg passes.
const (
	// CmdlineSlot carries the slot that booted: liken.slot=A or liken.slot=B.
	CmdlineSlot = "liken.slot"
	// CmdlineTrial is liken.trial=1 on a trial boot.
	CmdlineTrial = "liken.trial"
)

// ParseCmdline reads liken.slot=A|B and liken.trial=1 from a kernel command
// line (the contents of /proc/cmdline). liken.slot is required; liken.trial
// is 0 or 1 and defaults to 0. A parameter given twice with different values
// is refused.
func ParseCmdline(cmdline string) (slot Slot, trial bool, err error) {
	var slotVal, trialVal string
	var haveSlot, haveTrial bool
	for _, f := range splitCmdline(cmdline) {
		if f == "--" {
			break // the rest belongs to init
		}
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case CmdlineSlot:
			if haveSlot && v != slotVal {
				return "", false, fmt.Errorf("kernel command line sets %s twice (%q and %q); the boot script passes it once", CmdlineSlot, slotVal, v)
			}
			slotVal, haveSlot = v, true
		case CmdlineTrial:
			if haveTrial && v != trialVal {
				return "", false, fmt.Errorf("kernel command line sets %s twice (%q and %q); the boot script passes it once", CmdlineTrial, trialVal, v)
			}
			trialVal, haveTrial = v, true
		}
	}
	if !haveSlot {
		return "", false, fmt.Errorf("kernel command line has no %s=A|B: this system was not started by liken's boot script", CmdlineSlot)
	}
	slot, err = ParseSlot(slotVal)
	if err != nil {
		return "", false, fmt.Errorf("kernel command line: %s: %w", CmdlineSlot, err)
	}
	switch trialVal {
	case "", "0":
		if haveTrial && trialVal == "" {
			return "", false, fmt.Errorf("kernel command line: %s has no value; want 0 or 1", CmdlineTrial)
		}
	case "1":
		trial = true
	default:
		return "", false, fmt.Errorf("kernel command line: %s=%q; want 0 or 1", CmdlineTrial, trialVal)
	}
	return slot, trial, nil
}

// splitCmdline splits a kernel command line on white space outside double
// quotes and removes the quotes, as the kernel does.
func splitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, inField := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inField = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n' || r == '\r'):
			if inField {
				out = append(out, cur.String())
				cur.Reset()
				inField = false
			}
		default:
			cur.WriteRune(r)
			inField = true
		}
	}
	if inField {
		out = append(out, cur.String())
	}
	return out
}

// Persistent are the folders of a booted root kept on the slot store
// (mounted at /var/lib/liken), so that they survive a reboot: the node
// agent's state and identity, a leader's etcd member, and the journal
// (liken logs reads earlier boots). The key is the folder in the root, the
// value its place in the slot store.
var Persistent = map[string]string{
	"/var/lib/kubelet":    "machine/kubelet",
	"/var/lib/containerd": "machine/containerd",
	"/var/lib/etcd":       "machine/etcd",
	"/var/log/journal":    "machine/journal",
}
