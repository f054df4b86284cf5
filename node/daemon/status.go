package daemon

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/rules"
	"liken.sh/liken/node/changes"
)

// phase is the machine's one-word state.
func phase(f *facts, v *view) likenv1.MachinePhase {
	switch {
	case f.Mode == modeTrial:
		return likenv1.MachineUpdating
	case f.Run != nil:
		if f.Run.Release != nil {
			return likenv1.MachineUpdating
		}
		return likenv1.MachineRebooting
	case degraded(f, v) != "":
		return likenv1.MachineDegraded
	case k3sHeld(f) != nil:
		// A RestartK3s turn: k3s restarts in place.
		return likenv1.MachineRebooting
	case v.downloading:
		return likenv1.MachineDownloading
	case v.liveTurn:
		// Its Live turn first, even with a release staged.
		return likenv1.MachineRebootPending
	case v.staged:
		return likenv1.MachineUpdatePending
	case len(v.pending) > 0:
		return likenv1.MachineRebootPending
	case v.target != nil:
		// Waiting to retry a failed download.
		return likenv1.MachineDownloading
	}
	return likenv1.MachineReady
}

// machineStatus is what the machine reports: the status half of the plan.
func machineStatus(f *facts, v *view) likenv1.MachineStatus {
	m := v.m
	st := likenv1.MachineStatus{
		Phase:                 phase(f, v),
		Version:               f.Boot.Version,
		Slot:                  string(f.Boot.Slot),
		ObservedRebootRequest: f.St.ObservedRebootRequest,
		ObservedGeneration:    m.Generation,
		Conditions:            append([]metav1.Condition(nil), m.Status.Conditions...),
	}
	for _, s := range f.Slots {
		st.Slots = append(st.Slots, likenv1.SlotStatus{Name: s.Name, State: s.State, Version: s.Version, Digest: s.Digest})
		if s.Name != st.Slot && s.State == likenv1.SlotStaged {
			st.Staged = s.Version
		}
	}
	if dl := f.Download; dl != nil {
		st.Download = &likenv1.DownloadProgress{Version: dl.Target.Version, BytesDone: dl.Done, BytesTotal: dl.Total}
	}
	switch {
	case f.Mode == modeTrial || f.Run != nil:
		// Keep reporting the change the turn was granted for.
		st.Change = v.change
		if f.Run != nil {
			st.Change = f.Run.Change
		} else if f.St.Turn != nil {
			st.Change = f.St.Turn.Change
		}
		st.Pending = v.pending
	case k3sHeld(f) != nil:
		// Reported until the node is Ready again, whatever else waits.
		st.Change = k3sHeld(f).Change
		st.Pending = v.pending
	case f.Config.Err != nil && f.Config.Turn != "":
		// A Live change failed in its turn: the turn is kept until the
		// value is corrected or its retry succeeds.
		st.Change = f.Config.Turn
		st.Pending = v.pending
	default:
		st.Pending = v.pending
		if asking(f, v) {
			st.Change = v.change
		}
	}
	if f.ObserveErr != nil {
		st.Observed = m.Status.Observed
	} else {
		st.Observed = *f.Observed.DeepCopy()
	}
	st.Observed.BootID = f.Boot.BootID
	if st.Observed.LastBoot == nil && !f.St.BootSeen.IsZero() {
		t := apiTime(f.St.BootSeen)
		st.Observed.LastBoot = &t
	}

	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: m.Generation, LastTransitionTime: apiTime(v.now)})
	}
	// Ready.
	if st.Phase == likenv1.MachineReady {
		set(likenv1.ConditionReady, metav1.ConditionTrue, "Ready", fmt.Sprintf("runs release %s with nothing pending", st.Version))
	} else {
		set(likenv1.ConditionReady, metav1.ConditionFalse, string(st.Phase), phaseMessage(f, v, st))
	}
	// RebootPending.
	switch {
	case k3sHeld(f) != nil:
		set(likenv1.ConditionRebootPending, metav1.ConditionFalse, "TurnTaken", fmt.Sprintf("the machine holds its turn for change %s: k3s restarts in place (no cordon, no drain, no reboot)", st.Change))
	case st.Phase == likenv1.MachineRebootPending && v.liveTurn:
		// No approval: rebootPolicy governs reboots.
		set(likenv1.ConditionRebootPending, metav1.ConditionTrue, likenv1.ReasonAwaitingTurn,
			fmt.Sprintf("change %s (%s) waits for a turn from cluster-operator to apply it in place under the disruption budget (leaders one at a time), so a value that breaks machines reaches no more than maxUnavailable of them; no cordon, no drain, no reboot", st.Change, pendingFields(st.Pending)))
	case st.Phase == likenv1.MachineRebootPending && v.k3sTurn:
		// No approval: rebootPolicy governs reboots, and a k3s restart
		// keeps the pods running.
		set(likenv1.ConditionRebootPending, metav1.ConditionTrue, likenv1.ReasonAwaitingTurn,
			fmt.Sprintf("change %s (%s) waits for a turn from cluster-operator to restart k3s in place under the disruption budget (leaders one at a time, so the datastore keeps its majority); no cordon, no drain, no reboot", st.Change, pendingFields(st.Pending)))
	case st.Phase == likenv1.MachineUpdatePending || st.Phase == likenv1.MachineRebootPending:
		if rules.Cleared(m, st.Change) {
			set(likenv1.ConditionRebootPending, metav1.ConditionTrue, likenv1.ReasonAwaitingTurn,
				fmt.Sprintf("change %s (%s) waits for a reboot turn from cluster-operator under the disruption budget", st.Change, pendingFields(st.Pending)))
		} else {
			msg := fmt.Sprintf("change %s (%s) waits for approval: run `liken approve-reboot %s %s`", st.Change, pendingFields(st.Pending), m.Spec.Cluster, m.Name)
			if e := ledgerEntry(v.c, m.Name); e != nil && e.Change == st.Change {
				msg += "; the Cluster's ledger lists a turn for it, which the machine takes only once approved"
			}
			set(likenv1.ConditionRebootPending, metav1.ConditionTrue, likenv1.ReasonAwaitingApproval, msg)
		}
	case st.Phase == likenv1.MachineUpdating || st.Phase == likenv1.MachineRebooting:
		set(likenv1.ConditionRebootPending, metav1.ConditionFalse, "TurnTaken", fmt.Sprintf("the machine holds its turn for change %s", st.Change))
	case len(st.Pending) > 0:
		set(likenv1.ConditionRebootPending, metav1.ConditionFalse, "NotAsking", fmt.Sprintf("%s wait, but the machine asks for no turn while it is %s", pendingFields(st.Pending), st.Phase))
	default:
		set(likenv1.ConditionRebootPending, metav1.ConditionFalse, "NothingPending", "no change waits for a reboot")
	}
	// TrialFailed.
	if f := v.failedTrial; f != nil {
		set(likenv1.ConditionTrialFailed, metav1.ConditionTrue, likenv1.ReasonTrialFailed,
			fmt.Sprintf("%s. The machine runs its proven slot %s (release %s) and marked slot %s Failed; set the Cluster's spec.version to another release, or resume the rollout (liken rollout resume) to try this one again", f.Reason, st.Slot, st.Version, f.Slot))
	} else {
		set(likenv1.ConditionTrialFailed, metav1.ConditionFalse, "NoFailedTrial", "no trial failure to report")
	}
	// DrainBlocked.
	if r := f.Run; r != nil && r.Blocked != nil {
		b := r.Blocked
		set(likenv1.ConditionDrainBlocked, metav1.ConditionTrue, likenv1.ConditionDrainBlocked, b.Message(m.Name, v.c.Spec.Disruption.DrainTimeoutOrDefault()))
	} else {
		set(likenv1.ConditionDrainBlocked, metav1.ConditionFalse, "NotBlocked", "no drain is blocked")
	}
	// ReleaseVerified.
	switch fl := f.DownloadFailure; {
	case v.failedTrial != nil:
		set(likenv1.ConditionReleaseVerified, metav1.ConditionFalse, likenv1.ReasonTrialFailed,
			fmt.Sprintf("release %s verified, but its trial failed (see TrialFailed); slot %s is marked Failed and nothing is staged", v.failedTrial.Version, v.failedTrial.Slot))
	case v.target != nil && fl != nil && fl.target == *v.target:
		set(likenv1.ConditionReleaseVerified, metav1.ConditionFalse, reasonOf(fl.err),
			fmt.Sprintf("%v; nothing staged, attempt %d, next try at %s", fl.err, fl.attempts, fl.retryAt.UTC().Format("15:04:05")))
	case v.staged:
		set(likenv1.ConditionReleaseVerified, metav1.ConditionTrue, "Verified", fmt.Sprintf("release %s (%s) verified and staged in slot %s", v.target.Version, v.target.Digest, otherSlot(st.Slot)))
	case v.target == nil && v.c.Spec.Version == st.Version:
		set(likenv1.ConditionReleaseVerified, metav1.ConditionTrue, "Running", fmt.Sprintf("runs release %s, the Cluster's version", st.Version))
	case v.downloading:
		set(likenv1.ConditionReleaseVerified, metav1.ConditionUnknown, "Downloading", fmt.Sprintf("downloading release %s", v.target.Version))
	}
	// ControlPlaneReady, on a leader only.
	if f.Leader {
		if err := f.ControlPlaneErr; err != nil {
			set(likenv1.ConditionControlPlaneReady, metav1.ConditionFalse, ReasonControlPlaneNotReady,
				fmt.Sprintf("%v; cluster-operator counts this leader as down, so no other leader takes a turn. Its logs say more: liken logs %s -u etcd -u kube-apiserver", err, m.Name))
		} else {
			set(likenv1.ConditionControlPlaneReady, metav1.ConditionTrue, ReasonControlPlaneReady, "this leader's etcd member votes and is healthy, and its API server is ready")
		}
	}
	// LayerMatches, when the layer's Machine document is known.
	if f.Layer != nil {
		if diff := layerDiff(f.Layer, m); len(diff) > 0 {
			set(likenv1.ConditionLayerMatches, metav1.ConditionFalse, ReasonDiffersFromLayer,
				fmt.Sprintf("the Machine differs from the layer this machine was installed from: %s. At every boot the machine starts with its layer's role and ports, before it reads the Machine: make them agree, by correcting the Machine (kubectl edit machine %s) or by installing the machine again from a layer packed with this Machine", strings.Join(diff, "; "), m.Name))
		} else {
			set(likenv1.ConditionLayerMatches, metav1.ConditionTrue, "SameAsLayer", "the Machine's role and ports are those of the layer this machine was installed from")
		}
	} else {
		// Nothing to compare with: a condition from earlier would be stale.
		meta.RemoveStatusCondition(&st.Conditions, likenv1.ConditionLayerMatches)
	}
	// ConfigApplied.
	if f.Config.Err != nil {
		set(likenv1.ConditionConfigApplied, metav1.ConditionFalse, ReasonApplyFailed, f.Config.Err.Error()+"; correct the value in the Machine or Cluster, liken retries")
	} else if kf := f.St.K3sFailure; kf != nil {
		set(likenv1.ConditionConfigApplied, metav1.ConditionFalse, likenv1.ReasonK3sRestartFailed, kf.message(v.c.Name))
	} else if len(v.live) > 0 {
		msg := fmt.Sprintf("applied, except %s, which wait for this machine's turn to apply them in place (see the RebootPending condition)", strings.Join(changes.Paths(v.live), ", "))
		if !v.liveTurn {
			msg = fmt.Sprintf("applied, except %s, which wait for a turn to apply them in place once the turn under way ends", strings.Join(changes.Paths(v.live), ", "))
		}
		set(likenv1.ConditionConfigApplied, metav1.ConditionTrue, ReasonWaitingForTurn, msg)
	} else if len(v.k3s) > 0 {
		msg := fmt.Sprintf("applied, except %s, which wait for this machine's turn to restart k3s (see the RebootPending condition)", strings.Join(changes.Paths(v.k3s), ", "))
		if !v.k3sTurn {
			msg = fmt.Sprintf("applied, except %s, which wait for a turn to restart k3s after the reboot that waits", strings.Join(changes.Paths(v.k3s), ", "))
		}
		set(likenv1.ConditionConfigApplied, metav1.ConditionTrue, ReasonWaitingForTurn, msg)
	} else if len(v.nextBoot) > 0 {
		set(likenv1.ConditionConfigApplied, metav1.ConditionTrue, "WaitingForNextBoot", fmt.Sprintf("applied; %s take effect at the next boot, whatever causes it", strings.Join(changes.Paths(v.nextBoot), ", ")))
	} else {
		set(likenv1.ConditionConfigApplied, metav1.ConditionTrue, "Applied", "every declared value is in effect or staged for its reboot")
	}
	return st
}

func otherSlot(s string) string {
	if s == "A" {
		return "B"
	}
	return "A"
}

func pendingFields(p []likenv1.PendingChange) string {
	var f []string
	for _, c := range p {
		f = append(f, c.Field)
	}
	return strings.Join(f, ", ")
}

func phaseMessage(f *facts, v *view, st likenv1.MachineStatus) string {
	switch st.Phase {
	case likenv1.MachineDegraded:
		return degraded(f, v)
	case likenv1.MachineDownloading:
		if st.Download != nil {
			return fmt.Sprintf("downloading release %s into slot %s; status.download has the progress", st.Download.Version, otherSlot(st.Slot))
		}
		return fmt.Sprintf("release %s is not staged yet; see the ReleaseVerified condition", v.target.Version)
	case likenv1.MachineUpdatePending, likenv1.MachineRebootPending:
		if v.liveTurn {
			return "a change waits for a turn to apply it in place; see the RebootPending condition"
		}
		if v.k3sTurn {
			return "a change waits for a turn to restart k3s; see the RebootPending condition"
		}
		return "a change waits for a reboot; see the RebootPending condition"
	case likenv1.MachineUpdating:
		if f.Mode == modeTrial {
			return fmt.Sprintf("trial boot of slot %s: not committed yet, because %s", st.Slot, v.trialWaitsFor)
		}
		if f.DownWaitingFor != "" {
			return "drained; the reboot into the new release waits, because " + f.DownWaitingFor
		}
		return "cordon, drain and reboot into the new release"
	case likenv1.MachineRebooting:
		if t := k3sHeld(f); t != nil {
			switch {
			case t.RestartedAt.IsZero() && f.DownWaitingFor != "":
				return "the restart of k3s in its turn waits, because " + f.DownWaitingFor
			case t.RestartedAt.IsZero():
				return "restarting k3s in place in its turn (no cordon, no drain, no reboot)"
			}
			return fmt.Sprintf("restarted k3s in place in its turn; the turn ends once the node is Ready again (k3s restarts with the configuration it ran before at %s): %s",
				t.RestartedAt.Add(v.c.Spec.Disruption.TrialTimeoutOrDefault()).UTC().Format("15:04:05"), v.k3sWaitsFor)
		}
		if f.DownWaitingFor != "" {
			return "drained; the reboot waits, because " + f.DownWaitingFor
		}
		return "cordon, drain and reboot"
	}
	return string(st.Phase)
}

// apiTime is t as the API server keeps a metav1.Time: to the second, in UTC.
func apiTime(t time.Time) metav1.Time {
	return metav1.NewTime(t.UTC().Truncate(time.Second))
}

// apiPrecision returns st as the API server stores it: its JSON form read
// back, so every metav1.Time is cut to the second (and a MicroTime to the
// microsecond). writeStatus compares this with the cached status, so a time
// taken with more precision, in any field, cannot make every sync write an
// unchanged status.
func apiPrecision(st likenv1.MachineStatus) (likenv1.MachineStatus, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return st, fmt.Errorf("encoding the Machine's status: %w", err)
	}
	var out likenv1.MachineStatus
	if err := json.Unmarshal(b, &out); err != nil {
		return st, fmt.Errorf("decoding the Machine's status: %w", err)
	}
	return out, nil
}

// layerDiff lists how m's fields that take effect at boot, before
// liken-node reads the API (its role and its ports), differ from the
// layer's Machine document.
func layerDiff(layer, m *likenv1.Machine) []string {
	var out []string
	role := func(r likenv1.MachineRole) likenv1.MachineRole {
		if r == "" {
			return likenv1.RoleWorker
		}
		return r
	}
	if a, b := role(m.Spec.Role), role(layer.Spec.Role); a != b {
		out = append(out, fmt.Sprintf("spec.role is %s, the layer's %s", a, b))
	}
	if !equality.Semantic.DeepEqual(m.Spec.Ports, layer.Spec.Ports) && (len(m.Spec.Ports) > 0 || len(layer.Spec.Ports) > 0) {
		out = append(out, fmt.Sprintf("spec.ports are %s, the layer's %s", portNames(m.Spec.Ports), portNames(layer.Spec.Ports)))
	}
	return out
}

// portNames names ports with their addresses, for a message.
func portNames(ps []likenv1.Port) string {
	if len(ps) == 0 {
		return "none"
	}
	var s []string
	for _, p := range ps {
		switch {
		case p.DHCP:
			s = append(s, p.Name+" (DHCP)")
		case len(p.Addresses) > 0:
			s = append(s, p.Name+" ("+strings.Join(p.Addresses, ", ")+")")
		default:
			s = append(s, p.Name)
		}
	}
	return strings.Join(s, ", ")
}
