package changes

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Applier changes the machine itself. The daemon calls it with the whole
// Config each time, and the list of fields that changed.
type Applier interface {
	// ApplyLive applies the Live fields of cfg now, with no restart.
	ApplyLive(ctx context.Context, cfg Config, changed []Change) error
	// RestartK3s writes k3s's configuration from cfg and restarts k3s in
	// place; pods keep running.
	RestartK3s(ctx context.Context, cfg Config, changed []Change) error
	// StageBoot checks the NextBoot and Reboot fields of cfg before the
	// daemon records them for the next boot.
	StageBoot(ctx context.Context, cfg Config, changed []Change) error
	// Boot applies the whole of cfg at the start of a boot, before k3s
	// starts: disks, ports, modules, banner, then the Live and k3s fields.
	Boot(ctx context.Context, cfg Config) error
}

// Observer reports what the machine sees of itself.
type Observer interface {
	// Observe returns the disks, ports and loaded modules the machine
	// finds, and when it booted if it knows. applied is the Config in
	// effect (recording observers report from it).
	Observe(ctx context.Context, applied Config) (likenv1.ObservedState, error)
}

// Record is one entry of a Recorder's log.
type Record struct {
	// Time is when the applier ran.
	Time time.Time `json:"time"`
	// Op is live, restart-k3s, stage-boot or boot.
	Op string `json:"op"`
	// Fields are the changed fields (empty for boot).
	Fields []string `json:"fields,omitempty"`
	// Config is the Config the applier was given.
	Config Config `json:"config"`
}

// Recorder operations.
const (
	OpLive       = "live"
	OpRestartK3s = "restart-k3s"
	OpStageBoot  = "stage-boot"
	OpBoot       = "boot"
)

// LabRefusedArg is the settings.k3sArgs value the lab's simulated
// kubelet refuses, as a real kubelet refuses a flag it does not know: its
// Node turns NotReady after the restart of k3s, and stays so while the
// argument is in effect (docs/guides/lab.md).
const LabRefusedArg = "--liken-lab-kubelet-refuses"

// LabRefusedLabel marks the Node of a lab machine whose kubelet refused
// its arguments: the lab's kwok stages post no Ready for it
// (cli/lab/controlplane/stages.yaml).
const LabRefusedLabel = "liken.sh/lab-kubelet"

// Recorder is the lab's Applier and Observer: it changes nothing on the
// host, appends every call to a JSON-lines log, and reports the applied
// Config as what it observes.
type Recorder struct {
	// Path is the log file; empty keeps the log in memory only.
	Path string
	// Now is the clock of the records; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	records []Record
}

// NewRecorder returns a Recorder that logs to path (appending).
func NewRecorder(path string) *Recorder { return &Recorder{Path: path} }

// Records are the calls made so far by this process.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.records...)
}

// Count is how many calls of op this process made.
func (r *Recorder) Count(op string) int {
	n := 0
	for _, rec := range r.Records() {
		if rec.Op == op {
			n++
		}
	}
	return n
}

func (r *Recorder) record(op string, cfg Config, changed []Change) error {
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	rec := Record{Time: now().UTC(), Op: op, Fields: Paths(changed), Config: *cfg.DeepCopy()}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec)
	if r.Path == "" {
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.Path), 0o755); err != nil {
		return fmt.Errorf("recording %s: %w", op, err)
	}
	f, err := os.OpenFile(r.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("recording %s: %w", op, err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("recording %s in %s: %w", op, r.Path, err)
	}
	return f.Close()
}

// ApplyLive records the call.
func (r *Recorder) ApplyLive(_ context.Context, cfg Config, changed []Change) error {
	return r.record(OpLive, cfg, changed)
}

// RestartK3s records the call.
func (r *Recorder) RestartK3s(_ context.Context, cfg Config, changed []Change) error {
	return r.record(OpRestartK3s, cfg, changed)
}

// StageBoot records the call.
func (r *Recorder) StageBoot(_ context.Context, cfg Config, changed []Change) error {
	return r.record(OpStageBoot, cfg, changed)
}

// Boot records the call.
func (r *Recorder) Boot(_ context.Context, cfg Config) error {
	return r.record(OpBoot, cfg, nil)
}

// Observe reports the applied Config as the machine's hardware: every
// declared disk (mounted where declared), every declared port (up, with
// its static addresses) and every declared module loaded.
func (r *Recorder) Observe(_ context.Context, applied Config) (likenv1.ObservedState, error) {
	var o likenv1.ObservedState
	for _, d := range applied.Disks {
		o.Disks = append(o.Disks, likenv1.ObservedDisk{Device: d.Device, MountPoint: d.MountPoint})
	}
	for _, p := range applied.Ports {
		o.Ports = append(o.Ports, likenv1.ObservedPort{Name: p.Name, MAC: p.MAC, Addresses: append([]string(nil), p.Addresses...), Up: true})
	}
	for _, m := range applied.KernelModules {
		o.Modules = append(o.Modules, m.Name)
	}
	return o, nil
}
