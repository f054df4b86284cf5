package daemon

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// StartFailed is what liken-node does when it cannot start or stops on an
// error: it returns err on a proven boot (the service manager restarts it)
// and reboots to the proven slot on a trial boot (docs/design/boot.md#what-each-failure-leads-to).
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
