package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/release"
)

// StateFile is where the daemon keeps what must survive a restart or a
// reboot, relative to --root.
const StateFile = "state/daemon.json"

// stateFormat is the format the daemon writes. Daemons of every release
// read each other's state: a newer daemon only adds fields (an older one
// ignores them, and a newer one reads their absence as the old behaviour),
// never renames a field or gives it a new meaning, and reads any format
// version as this one.
const (
	stateFormat   = 1
	maxStateBytes = 4 << 20
)

// diskState is everything the daemon must remember across restarts and
// reboots. It is written atomically (temporary file, fsync, rename, fsync
// of the folder) on every change.
type diskState struct {
	FormatVersion int `json:"formatVersion"`
	// BootID is the boot this state was last brought up to date in.
	BootID string `json:"bootID,omitempty"`
	// BootSeen is when the daemon first ran in that boot.
	BootSeen time.Time `json:"bootSeen,omitempty"`
	// Applied is the configuration in effect; nil before the first boot
	// that had a Machine and a Cluster to read.
	Applied *changes.Config `json:"applied,omitempty"`
	// NextBoot is what the next boot applies (its NextBoot and Reboot
	// fields are what counts).
	NextBoot *changes.Config `json:"nextBoot,omitempty"`
	// PendingSince remembers when each waiting change (field path, plus
	// its value) was first seen, for status.pending[].since.
	PendingSince map[string]Since `json:"pendingSince,omitempty"`
	// ObservedRebootRequest is the last liken.sh/request-reboot value
	// honoured with a reboot.
	ObservedRebootRequest string `json:"observedRebootRequest,omitempty"`
	// Turn is the turn under way, if any.
	Turn *turnRecord `json:"turn,omitempty"`
	// Trial is the trial armed or under way, if any.
	Trial *trialRecord `json:"trial,omitempty"`
	// TrialFailure is the last trial that failed, while it still matters.
	TrialFailure *trialFailure `json:"trialFailure,omitempty"`
	// K3sRestartDue: a RestartK3s turn ended before its restart was
	// recorded, so what k3s runs is unknown and the machine asks for a turn
	// again (docs/design/protocol.md#a-machine-restarts-k3s-in-its-turn); older daemons ignore it.
	K3sRestartDue bool `json:"k3sRestartDue,omitempty"`
	// K3sFailure is the last restart of k3s that was rolled back, while
	// the declared value is the one that failed.
	K3sFailure *k3sFailure `json:"k3sFailure,omitempty"`
}

// Since is when a pending change was first seen, for one value.
type Since struct {
	Value string    `json:"value"`
	Since time.Time `json:"since"`
}

// turnRecord is a turn the machine started.
type turnRecord struct {
	// Change is the status.change the turn was granted for.
	Change string `json:"change"`
	// Release is the staged release the turn reboots into, if any.
	Release *release.Target `json:"release,omitempty"`
	// Slot is the slot that holds Release.
	Slot string `json:"slot,omitempty"`
	// RebootRequest is the liken.sh/request-reboot value the turn honours.
	RebootRequest string `json:"rebootRequest,omitempty"`
	// BootID is the boot in which the turn started.
	BootID string `json:"bootID"`
	// StartedAt is when the machine started the turn.
	StartedAt time.Time `json:"startedAt"`
	// Rebooted is set right before the reboot.
	Rebooted bool `json:"rebooted,omitempty"`
	// K3s is set for a RestartK3s turn: the configuration k3s restarts
	// with, on trial until the Node is Ready again (Applied keeps the
	// configuration k3s ran before until then). Such a turn has no
	// cordon, drain or reboot; a boot that finds it from an earlier boot
	// drops it like any turn (the boot starts k3s with Applied, and the
	// change asks again).
	K3s *changes.Config `json:"k3s,omitempty"`
	// RestartedAt is, for a RestartK3s turn, when the restart of k3s
	// began, written once the restart succeeded (once the restart back
	// to Applied succeeded, when RolledBack). The turn ends once the Node
	// of this boot is Ready with a heartbeat in a later second.
	RestartedAt time.Time `json:"restartedAt,omitempty"`
	// RolledBack is set, for a RestartK3s turn whose restart did not
	// bring the Node back Ready within the trial timeout, once k3s was
	// restarted again with Applied (K3sFailure says why).
	RolledBack bool `json:"rolledBack,omitempty"`
}

// k3sFailure is a restart of k3s that did not bring the Node back Ready
// in time, reported until the declared value changes or a person resumes
// the rollout.
type k3sFailure struct {
	// Change is the turn's change; Fields the paths it restarted k3s for.
	Change string   `json:"change"`
	Fields []string `json:"fields"`
	// K3s is the configuration that failed.
	K3s changes.Config `json:"k3s"`
	// Reason is what the Node showed when the time was up.
	Reason string `json:"reason"`
	// Timeout is the trial timeout the restart had.
	Timeout Duration  `json:"timeout"`
	At      time.Time `json:"at"`
	// Resume is the Cluster's liken.sh/resume-rollout value at the
	// failure; a new value lets the machine try the same value again.
	Resume string `json:"resume,omitempty"`
}

// message says what failed and what to do, for the Machine's
// ConfigApplied condition and the event.
func (f *k3sFailure) message(cluster string) string {
	what := fieldsOrConfig(f.Fields)
	return fmt.Sprintf("the restart of k3s for %s (change %s) did not bring the node back Ready within %s (%s); liken restarted k3s with the configuration it ran before, and no other machine restarts k3s for this change. Correct %s in the Machine or Cluster %s, or run `liken rollout resume %s` to try the same value again",
		what, f.Change, time.Duration(f.Timeout), f.Reason, what, cluster, cluster)
}

// fieldsOrConfig names the fields a restart of k3s is for. A restart
// with no field that differs from Applied (k3s restarted again because a
// turn was given back before its restart was confirmed) names the
// declared configuration.
func fieldsOrConfig(fields []string) string {
	if len(fields) == 0 {
		return "the declared configuration"
	}
	return strings.Join(fields, ", ")
}

// trialRecord is a trial boot armed by the turn.
type trialRecord struct {
	// Slot is the slot on trial; Version and Digest the release in it.
	Slot    string `json:"slot"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Timeout is the Cluster's trialTimeout when it was armed.
	Timeout Duration `json:"timeout"`
	// ArmedAt is when the trial was armed; ArmedBootID the boot that armed it.
	ArmedAt     time.Time `json:"armedAt"`
	ArmedBootID string    `json:"armedBootID"`
	// Arming is set while the boot loader's flag is being armed: the
	// record is written first, then the flag, then Arming is cleared. A
	// boot of the proven slot that finds it set knows the trial was never
	// armed (the power failed in between): no trial failed. (Written only
	// as true, so a record of an older daemon reads as armed.)
	Arming bool `json:"arming,omitempty"`
	// StartedAt is when the daemon first ran in the trial boot.
	StartedAt time.Time `json:"startedAt,omitempty"`
	// Failure is why the trial boot gave up, written by the trial boot
	// itself before it rebooted to the proven slot.
	Failure string `json:"failure,omitempty"`
	// Resume is the Cluster's liken.sh/resume-rollout value when the trial
	// was armed. The failure record does not hold the release back on it:
	// it takes the value the Cluster has when the failure is first seen
	// (see trialFailure.ResumeUnseen); older daemons compare with this one.
	Resume string `json:"resume,omitempty"`
}

// trialFailure is a failed trial the machine reports until a new version
// is set or a person resumes the rollout.
type trialFailure struct {
	Slot    string    `json:"slot"`
	Version string    `json:"version"`
	Digest  string    `json:"digest"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	// Resume is the Cluster's liken.sh/resume-rollout value when the
	// failure was first reported; a new value retries the release.
	Resume string `json:"resume,omitempty"`
	// ResumeUnseen is set while no Cluster has been read since the
	// failure: Resume still holds the value from arming time (what an
	// older daemon, which ignores this field, compares with), and the
	// first sync replaces it with the Cluster's value then, so a resume
	// given between arming and the failure does not clear it unreported.
	// (Written only as true: a record of an older daemon reads as seen.)
	ResumeUnseen bool `json:"resumeUnseen,omitempty"`
}

// Duration is a time.Duration that reads and writes as "10m0s".
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// writeFile replaces a file atomically; a test makes it fail, as a disk
// that refuses writes does (which a process running as root cannot be
// made to see otherwise).
var writeFile = atomicfile.Write

// loadState reads the state under root; a missing file is an empty state.
func loadState(root string) (*diskState, error) {
	p := filepath.Join(root, StateFile)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return &diskState{FormatVersion: stateFormat}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the daemon state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the daemon state %s: %w", p, err)
	}
	if len(b) > maxStateBytes {
		return nil, fmt.Errorf("the daemon state %s is larger than %d bytes; it is not liken's", p, maxStateBytes)
	}
	// Not strict: a state written by a newer liken-node (the trial boot of
	// a newer release, whose trial may fail and leave this file to the
	// proven slot's older daemon) may hold fields this one does not know.
	st := &diskState{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("the daemon state %s is unreadable (%v): move it away to start over from the Machine and Cluster (a trial under way is then forgotten and the machine stays on its proven slot)", p, err)
	}
	if st.FormatVersion < 1 {
		return nil, fmt.Errorf("the daemon state %s has no format version; it is not liken's: move it away to start over from the Machine and Cluster", p)
	}
	st.FormatVersion = stateFormat
	return st, nil
}

// save writes st under root atomically.
func (st *diskState) save(root string) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(root, StateFile)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("saving the daemon state: %w", err)
	}
	if err := writeFile(p, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("saving the daemon state %s: %w", p, err)
	}
	return nil
}

// clone deep-copies st through JSON.
func (st *diskState) clone() *diskState {
	b, err := json.Marshal(st)
	if err != nil {
		panic(err)
	}
	out := &diskState{}
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}
