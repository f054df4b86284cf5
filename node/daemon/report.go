package daemon

import (
	"time"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/changes"
	"liken.sh/liken/node/slots"
)

// Simulated is a machine that plays the node daemon's side of the turn
// protocol without running it (the simulated machines of liken's
// end-to-end tests and benchmarks): what it holds, for Report. Its
// configuration is applied, and its staged release verified.
type Simulated struct {
	Machine *likenv1.Machine
	Cluster *likenv1.Cluster
	// Slot, BootID and Version are the running boot's.
	Slot, BootID, Version string
	// Staged is the version staged in the other slot, or "".
	Staged string
	// RebootRequest is a reboot asked for besides the Machine's
	// liken.sh/request-reboot; ObservedRebootRequest the last one
	// honoured with a reboot.
	RebootRequest, ObservedRebootRequest string
	// InTurn: the machine runs the turn the ledger grants for its change.
	InTurn bool
}

// Report is the status the node daemon reports for a machine in s's state
// at now (its phase, change, pending changes and conditions), made by the
// daemon's own rules: the status half of its plan.
func Report(s Simulated, now time.Time) likenv1.MachineStatus {
	m := s.Machine
	if s.RebootRequest != "" {
		m = m.DeepCopy()
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[likenv1.AnnotationRequestReboot] = s.RebootRequest
	}
	applied := changes.Desired(m, s.Cluster)
	other := slots.Other(s.Slot)
	staged := slots.Info{Name: other, State: likenv1.SlotEmpty}
	if s.Staged != "" {
		staged = slots.Info{Name: other, State: likenv1.SlotStaged, Version: s.Staged}
		for _, e := range s.Cluster.Spec.Releases.Catalog {
			if e.Version == s.Staged {
				staged.Digest = e.Digest
			}
		}
	}
	f := &facts{
		Now: now, Machine: m.Name, Mode: modeNormal, M: m, C: s.Cluster,
		Boot: BootInfo{Slot: boot.Slot(s.Slot), BootID: s.BootID, Version: s.Version, BootedAt: now},
		St:   &diskState{FormatVersion: stateFormat, BootID: s.BootID, Applied: &applied, NextBoot: &applied, ObservedRebootRequest: s.ObservedRebootRequest},
		Slots: []slots.Info{
			{Name: s.Slot, State: likenv1.SlotActive, Version: s.Version},
			staged,
		},
		Other: other,
	}
	f.Timing.defaults()
	v := &view{m: m, c: s.Cluster, now: now}
	for _, step := range []func(*facts, *view) action{decideConfig, decideRelease, decidePending} {
		step(f, v)
	}
	if s.InTurn && v.change != "" {
		f.Run = &turnRun{Change: v.change}
		if v.staged {
			t := *v.target
			f.Run.Release = &t
		}
	}
	return machineStatus(f, v)
}
