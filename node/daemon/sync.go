package daemon

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/node/changes"
)

// Event reasons of the node daemon.
const (
	ReasonConfigApplied     = "ConfigApplied"
	ReasonK3sRestarted      = "K3sRestarted"
	ReasonK3sBack           = "K3sBack"
	ReasonApplyFailed       = "ApplyFailed"
	ReasonDownloadStarted   = "DownloadStarted"
	ReasonReleaseStaged     = "ReleaseStaged"
	ReasonReleaseFailed     = "ReleaseVerificationFailed"
	ReasonReleaseWithdrawn  = "ReleaseWithdrawn"
	ReasonTurnStarted       = "TurnStarted"
	ReasonTurnTakenBack     = "TurnTakenBack"
	ReasonTurnResumed       = "TurnResumed"
	ReasonDrainBlocked      = likenv1.ConditionDrainBlocked
	ReasonDrained           = "Drained"
	ReasonSlotRecheckFailed = "SlotRecheckFailed"
	// ReasonSlotStoreRepaired: the slot store disagreed with the boot
	// loader at start, and was made to agree.
	ReasonSlotStoreRepaired = "SlotStoreRepaired"
	ReasonTrialArmed        = "TrialArmed"
	ReasonRebooting         = "Rebooting"
	ReasonTrialSucceeded    = "TrialSucceeded"
	ReasonTrialFailed       = likenv1.ReasonTrialFailed
	// ReasonWaitingForDatastore: a leader holds its turn but does not go
	// down yet, because the datastore would lose its majority.
	ReasonWaitingForDatastore = "WaitingForDatastore"
	// ReasonWaitingForTurn on ConfigApplied: RestartK3s changes wait for
	// the machine's turn to restart k3s.
	ReasonWaitingForTurn = "WaitingForTurn"
)

// ReasonDiffersFromLayer on LayerMatches: the Machine's role or ports are
// not those of the layer the machine was installed from.
const ReasonDiffersFromLayer = "DiffersFromLayer"

// Reasons of a leader's ControlPlaneReady condition.
const (
	ReasonControlPlaneReady    = "Healthy"
	ReasonControlPlaneNotReady = "NotHealthy"
)

// maxSteps bounds the actions of one reconcile: each action changes what
// decide sees, so a reconcile that has not settled after this many has a
// rule that keeps picking the same action.
const maxSteps = 64

// sync is one reconcile: it observes, decides the next action (decide,
// plan.go), takes it, and observes again, until nothing is left to do but
// wait; it returns when to look again without news.
func (d *Daemon) sync(ctx context.Context) (time.Duration, error) {
	log := klog.FromContext(ctx)
	var cp *error // a leader's own control plane, checked once per reconcile
	// What the machine observes of itself, read again only after an
	// action that changes the machine.
	var self *observed
	for range maxSteps {
		f, err := d.observe(ctx)
		if err != nil {
			return 0, err
		}
		if f.M != nil && f.C != nil && !f.Rebooting {
			if self == nil {
				self = d.observeSelf(ctx, f)
			}
			f.Observed, f.ObserveErr = self.state, self.err
		}
		if f.M != nil && f.C != nil {
			// ControlPlaneReady, the trial's commit and the end of a
			// RestartK3s turn all read this one answer; a restart of k3s
			// asks again.
			if cp == nil {
				err := d.controlPlaneHealthy(ctx)
				cp = &err
			}
			f.ControlPlaneErr = *cp
		}
		p := decide(f)
		if p.TrialWaitsFor != "" {
			d.mu.Lock()
			d.trialWaitingFor = p.TrialWaitsFor
			d.mu.Unlock()
		}
		if p.Do == nil {
			switch {
			case f.Rebooting:
			case f.M == nil:
				log.Info("Machine does not exist yet; waiting for it")
			case f.C == nil:
				log.Info("Cluster does not exist yet; waiting for it", "cluster", f.M.Spec.Cluster)
			}
			return p.After, nil
		}
		log.V(4).Info("Next action", "action", p.Do.String())
		p.Do.do(ctx, d, f)
		switch p.Do.(type) {
		case restartK3s, rollBackK3s:
			// A leader's control plane restarted with k3s: only a check
			// made after the restart can end the turn.
			self, cp = nil, nil
		case applyFirst, applyAtBoot, applyLive:
			self = nil
		}
		if ctx.Err() != nil {
			return 0, nil
		}
	}
	log.Error(nil, "A reconcile took more actions than it may; looking again shortly", "actions", maxSteps)
	return d.t.APIRetry, nil
}

// observe gathers the facts decide reads: the caches, then, under the
// lock, what the actors and the last actions reported.
func (d *Daemon) observe(ctx context.Context) (*facts, error) {
	f := &facts{Now: d.clock.Now(), Timing: d.t, Machine: d.o.Machine, Boot: d.o.Boot, Leader: d.o.ControlPlane != nil, Layer: d.o.Layer}
	m, err := d.machines.Get(d.o.Machine)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	default:
		// Work from the daemon's own last status write until the informer
		// delivers it: a reconcile that worked from the cached copy would
		// write the same status again and be refused as a conflict.
		f.M = d.written.Latest(key, m)
	}
	if f.M != nil {
		c, err := d.clusters.Get(f.M.Spec.Cluster)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		default:
			f.C = c
		}
	}
	node, err := d.nodes.Get(d.o.Machine)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	default:
		f.Node = node
	}
	d.mu.Lock()
	f.Mode, f.Confusion, f.Rebooting = d.mode, d.confusion, d.rebooting
	f.St = d.st
	if dl := d.dl; dl != nil {
		f.Download = &downloadFacts{Target: dl.target, Slot: dl.slot, Done: dl.done, Total: dl.total}
	}
	if fl := d.dlFailure; fl != nil {
		c := *fl
		f.DownloadFailure = &c
	}
	if d.run != nil {
		r := *d.run
		f.Run = &r
	}
	f.ActorsStopping = d.actors
	f.StaleLedger, f.DownWaitingFor = d.staleLedger, d.downWaitingFor
	f.Config, f.BootErr, f.SlotErr = d.config, d.bootErr, d.slotErr
	f.PendingEvents = append([]pendingEvent(nil), d.pendingEvents...)
	if len(d.retry) > 0 {
		f.Retry = make(map[string]time.Time, len(d.retry))
		for k, at := range d.retry {
			f.Retry[k] = at
		}
	}
	f.Uncordoned = d.uncordoned
	f.StatusWrittenInBoot, f.LastStatusErr, f.LastProgressWrite, f.StatusRefusedAt = d.statusWrittenInBoot, d.lastStatusErr, d.lastProgressWrite, d.statusRefusedAt
	f.LastSent, f.LastSentVersion = d.lastSent, d.lastSentVersion
	d.mu.Unlock()
	// The slot store after the download's facts: a download that staged
	// its slot in between shows as staged, never as a download to start.
	f.Slots, f.Other = d.slots.Slots(), d.slots.Other()
	return f, nil
}

// observed is what the machine observes of itself.
type observed struct {
	state likenv1.ObservedState
	err   error
}

// observeSelf asks the Observer what the machine observes of itself.
func (d *Daemon) observeSelf(ctx context.Context, f *facts) *observed {
	applied := changes.Config{}
	if f.St.Applied != nil {
		applied = *f.St.Applied
	}
	o := &observed{}
	o.state, o.err = d.o.Observer.Observe(ctx, applied)
	if o.err != nil {
		klog.FromContext(ctx).Error(o.err, "Observing the machine failed")
	}
	return o
}

// controlPlaneHealthy checks a leader's own control plane; nil on a
// machine that runs none.
func (d *Daemon) controlPlaneHealthy(ctx context.Context) error {
	if d.o.ControlPlane == nil {
		return nil
	}
	return d.o.ControlPlane.Check(ctx)
}
