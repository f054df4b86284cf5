package watchdog

import (
	"encoding/json"
	"fmt"
	"time"
)

// Timeouts of a trial boot's watchdog, armed by the init.
const (
	// InitTimeout is armed first, before the init can read the trial
	// record: it ends a hang while the disk is found and mounted. It is
	// also what stays armed when the record cannot be read.
	InitTimeout = 180 * time.Second
	// MinTrialTimeout is the least the init re-arms with: even a trial
	// whose time is nearly spent gets this long to reach liken-node,
	// which then ends it at its deadline and reboots into the proven slot.
	MinTrialTimeout = 60 * time.Second
)

// trialState is the part of liken-node's state file (node/daemon's
// StateFile, under the slot store) the init reads: the trial record's
// timeout and when it was armed.
type trialState struct {
	Trial *struct {
		Timeout string    `json:"timeout"`
		ArmedAt time.Time `json:"armedAt"`
	} `json:"trial"`
}

// ForTrial returns the timeout the init arms a trial boot's watchdog with
// (what is left of the trial timeout, docs/design/boot.md#the-trial-watchdog)
// and, for the console, where the figure came from.
func ForTrial(state []byte, now time.Time) (time.Duration, string) {
	var st trialState
	if err := json.Unmarshal(state, &st); err != nil {
		return InitTimeout, fmt.Sprintf("liken-node's state cannot be read (%v); keeping %s", err, InitTimeout)
	}
	if st.Trial == nil {
		return InitTimeout, fmt.Sprintf("liken-node's state holds no trial record; keeping %s", InitTimeout)
	}
	total, err := time.ParseDuration(st.Trial.Timeout)
	if err != nil || total <= 0 {
		return InitTimeout, fmt.Sprintf("the trial record's timeout %q is not a duration; keeping %s", st.Trial.Timeout, InitTimeout)
	}
	left := total
	if a := st.Trial.ArmedAt; !a.IsZero() && !a.After(now) {
		left = a.Add(total).Sub(now)
	}
	left = left.Round(time.Second)
	switch {
	case left > total:
		left = total
	case left < MinTrialTimeout:
		return MinTrialTimeout, fmt.Sprintf("the trial timeout of %s is nearly spent; giving liken-node %s to end the trial", total, MinTrialTimeout)
	}
	return left, fmt.Sprintf("what is left of the trial timeout of %s", total)
}
