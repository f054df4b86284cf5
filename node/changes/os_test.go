package changes

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

type cmdLog struct{ cmds []string }

func (l *cmdLog) run(_ context.Context, name string, args ...string) error {
	l.cmds = append(l.cmds, strings.Join(append([]string{name}, args...), " "))
	return nil
}

func TestOSApplier(t *testing.T) {
	root := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "proc/sys/vm"), 0o755))
	var log cmdLog
	o := &OS{Root: root, Run: log.run}
	cfg := base()
	ctx := context.Background()

	assert.NilError(t, o.ApplyLive(ctx, cfg, []Change{{Field: FieldNTPServers}}))
	b, err := os.ReadFile(filepath.Join(root, "proc/sys/vm/max_map_count"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "262144\n")
	b, err = os.ReadFile(filepath.Join(root, TimesyncdDropIn))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "NTP=time.example.com"))

	assert.NilError(t, o.RestartK3s(ctx, cfg, nil))
	b, err = os.ReadFile(filepath.Join(root, K3sRegistries))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), `"docker.io":`))

	assert.NilError(t, o.Boot(ctx, cfg))
	b, err = os.ReadFile(filepath.Join(root, NetworkdDir, "50-liken-eth0.network"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), "Address=10.0.0.11/24"))
	assert.DeepEqual(t, log.cmds, []string{
		"systemctl try-restart systemd-timesyncd.service",
		"systemctl restart k3s-agent.service",
		"modprobe vfio enable_unsafe_noiommu_mode=1",
		"networkctl reload",
		"blkid -p /dev/vdb",
		"mount -t ext4 /dev/vdb /var/lib/data",
	})
}

func TestOSApplierRefusesBadValues(t *testing.T) {
	o := &OS{Root: t.TempDir(), Run: (&cmdLog{}).run}
	ctx := context.Background()
	cfg := base()
	cfg.Settings.Sysctls = map[string]string{"../../etc/passwd": "x"}
	assert.ErrorContains(t, o.ApplyLive(ctx, cfg, nil), `sysctl "../../etc/passwd" is not a kernel parameter name`)
	cfg = base()
	cfg.Disks[0].MountPoint = "/etc"
	assert.ErrorContains(t, o.Boot(ctx, cfg), "must be a folder under /var")
	cfg = base()
	cfg.Settings.KernelArgs = []string{`init="/bin/sh"`}
	assert.ErrorContains(t, o.StageBoot(ctx, cfg, nil), "kernel argument")
}

func TestRecorderObservesTheAppliedConfig(t *testing.T) {
	r := NewRecorder(filepath.Join(t.TempDir(), "applier.log"))
	cfg := base()
	assert.NilError(t, r.Boot(context.Background(), cfg))
	assert.Equal(t, r.Count(OpBoot), 1)
	o, err := r.Observe(context.Background(), cfg)
	assert.NilError(t, err)
	assert.DeepEqual(t, o.Modules, []string{"vfio"})
	assert.DeepEqual(t, o.Ports, []likenv1.ObservedPort{{Name: "eth0", Addresses: []string{"10.0.0.11/24"}, Up: true}})
	b, err := os.ReadFile(r.Path)
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), `"op":"boot"`))
}
