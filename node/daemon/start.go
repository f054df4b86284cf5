package daemon

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// StartFailed is what liken-node does when it cannot start or stops on an
// error (its boot information, kubeconfig, slot store, state file or boot
// loader cannot be read, the state cannot be saved). On a proven boot it
// returns err: the service manager restarts it. On a trial boot it reboots
// at once instead: the boot loader has already cleared the trial flag, so
// the machine returns to its proven slot, which reports the failed trial,
// rather than restart for ever on a slot nothing proved. bi needs only
// Trial; a boot whose command line could not be read is not a trial.
func StartFailed(ctx context.Context, bi BootInfo, r Rebooter, err error) error {
	if err == nil || errors.Is(err, ErrRebooted) || !bi.Trial {
		return err
	}
	klog.FromContext(ctx).Error(err, "liken-node cannot run in this trial boot; rebooting into the proven slot", "slot", bi.Slot, "release", bi.Version)
	rerr := r.Reboot(ctx)
	if errors.Is(rerr, ErrRebooted) {
		return ErrRebooted
	}
	return fmt.Errorf("%w; rebooting into the proven slot failed too: %v", err, rerr)
}
