package boot

import (
	"errors"
	"fmt"
)

// The environment variables that hold liken's boot state.
const (
	// VarProven holds the proven slot: A or B.
	VarProven = "liken_proven"
	// VarTrial is the one-shot trial flag: 1 makes the next boot try the
	// slot other than the proven one, once; 0 (or no entry) boots the proven
	// slot. The boot script sets it back to 0 before it loads the trial kernel.
	VarTrial = "liken_trial"
)

// ErrCorrupt marks an environment block whose boot state is not usable as a
// whole. The error may still come with a proven slot (see Decode).
var ErrCorrupt = errors.New("boot state is corrupt")

// view is what liken's boot script holds after load_env of one block:
// the raw values of the two variables (liken_trial defaults to "0").
type view struct {
	proven, trial string
}

func readView(b []byte) view {
	v := view{trial: "0"}
	for _, e := range envIterate(b) {
		switch e.Name {
		case VarProven:
			v.proven = e.Value
		case VarTrial:
			v.trial = e.Value
		}
	}
	return v
}

// provenSlot is the proven slot the block names, or "".
func (v view) provenSlot() Slot {
	if s := Slot(v.proven); s.Valid() {
		return s
	}
	return ""
}

// valid reports whether both values are whitelisted.
func (v view) valid() bool {
	return v.provenSlot() != "" && (v.trial == "0" || v.trial == "1")
}

func (v view) state() State {
	st := State{Proven: v.provenSlot()}
	if v.valid() && v.trial == "1" {
		st.Trial = st.Proven.Other()
	}
	return st
}

// Decode reads the boot state from one environment block with the rules of
// liken's boot script. It never fails to return something safe:
//   - nil error: the block is valid, and the state is whitelisted (Proven is
//     A or B, Trial is "" or the other slot);
//   - an error wrapping ErrCorrupt: the block is not usable as a whole;
//     State.Trial is "" and State.Proven is the proven slot the block still
//     names, or "" when it names none.
func Decode(b []byte) (State, error) {
	if !envOpen(b) {
		return State{}, fmt.Errorf("%w: %w", ErrCorrupt, errNoSignature(b))
	}
	v := readView(b)
	switch {
	case v.provenSlot() == "":
		return State{}, fmt.Errorf("%w: %s=%q is not A or B", ErrCorrupt, VarProven, v.proven)
	case !v.valid():
		return State{Proven: v.provenSlot()}, fmt.Errorf("%w: %s=%q is not 0 or 1", ErrCorrupt, VarTrial, v.trial)
	}
	return v.state(), nil
}

// Encode returns a fresh 1024-byte environment block holding st: the
// variables of extra first (others to keep; liken's own are dropped), then
// liken_trial, then liken_proven.
func Encode(st State, extra []EnvVar) ([]byte, error) {
	if err := st.Validate(); err != nil {
		return nil, err
	}
	var vars []EnvVar
	for _, e := range extra {
		if e.Name != VarProven && e.Name != VarTrial {
			vars = append(vars, e)
		}
	}
	trial := "0"
	if st.Trial != "" {
		trial = "1"
	}
	// The flag goes before the proven slot: a write torn between the two
	// (new bytes first, old after) can then only pair the new flag with the
	// old proven slot, and both writes that change the proven slot clear
	// the flag, so a torn write never arms a trial that was not asked for.
	vars = append(vars, EnvVar{VarTrial, trial}, EnvVar{VarProven, string(st.Proven)})
	b, err := NewEnvBlock(vars)
	if err != nil {
		return nil, err
	}
	if got, err := Decode(b); err != nil || got != st {
		// Cannot happen for a valid state; guards the writer against itself.
		return nil, fmt.Errorf("encoding boot state %s produced a block that reads back as %s (%v)", st, got, err)
	}
	return b, nil
}

// keepVars returns the variables of b worth keeping when liken rewrites the
// block: each plain-named variable once (its last value), in first-seen order.
func keepVars(b []byte) []EnvVar {
	var order []string
	last := map[string]string{}
	for _, e := range envIterate(b) {
		if e.Name == VarProven || e.Name == VarTrial || !envNameRE.MatchString(e.Name) {
			continue
		}
		if _, ok := last[e.Name]; !ok {
			order = append(order, e.Name)
		}
		last[e.Name] = e.Value
	}
	out := make([]EnvVar, 0, len(order))
	for _, n := range order {
		out = append(out, EnvVar{n, last[n]})
	}
	return out
}
