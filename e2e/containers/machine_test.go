// Package containers tests lab machines whose OS runs in Linux namespaces
// (cli/lab/nsmachine): liken's real OS image, its systemd as PID 1,
// sharing the host's kernel and nothing else of the host's.
//
// The liken binary comes from $LIKEN_BIN (default: _output/bin of the
// source tree) and the OS image from make image (_output/image).
package containers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/lab/nsmachine"
	"liken.sh/liken/cli/layer"
	clirelease "liken.sh/liken/cli/release"
	"liken.sh/liken/image"
	"liken.sh/liken/internal/srctree"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/slots"
	"liken.sh/liken/release"
)

// newMachine installs liken's OS image into a machine folder, as liken
// install does for a disk, for a worker named name. The release stays in
// the returned folder for the test's end.
func newMachine(t *testing.T, name string) (*nsmachine.Machine, *clirelease.Result) {
	t.Helper()
	repo, err := srctree.Find()
	assert.NilError(t, err)
	img := filepath.Join(repo, "_output", "image")
	for _, f := range image.Files {
		if _, err := os.Stat(filepath.Join(img, f)); err != nil {
			t.Fatalf("the OS image is not built (%v): run make image, which make test runs first", err)
		}
	}
	liken, err := srctree.Binary("liken")
	assert.NilError(t, err)
	dir := t.TempDir()
	rootfs := filepath.Join(img, image.RootFS)
	relFile, err := exec.Command("unsquashfs", "-cat", rootfs, image.ReleaseFile).Output()
	assert.NilError(t, err)
	version, err := image.ParseReleaseFile(relFile)
	assert.NilError(t, err)
	rel, err := clirelease.Build(clirelease.BuildOptions{Image: rootfs, Channel: filepath.Join(dir, "channel"), Version: version},
		clocktesting.NewFakePassiveClock(time.Now()))
	assert.NilError(t, err)

	docs := fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata: {name: ns}
spec:
  version: %q
  releases:
    source: http://channel.invalid
    catalog: [{version: %q, digest: %q}]
  network: {endpoint: "https://10.0.0.10:6443"}
---
apiVersion: liken.sh/v1alpha1
kind: Machine
metadata: {name: ns-0}
spec: {cluster: ns, role: Leader, rebootPolicy: Auto}
---
apiVersion: liken.sh/v1alpha1
kind: Machine
metadata: {name: %s}
spec: {cluster: ns, role: Worker, rebootPolicy: Auto}
`, rel.Version, rel.Version, rel.Digest, name)
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(t, len(errs) == 0, "%v", errs)
	cluster, machines, errs := layer.CheckFleet(parsed)
	assert.Assert(t, len(errs) == 0, "%v", errs)
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: "ns"})
	assert.NilError(t, err)
	tokens, err := layer.MachineTokens(machines, time.Now().Add(layer.DefaultJoinTokenTTL), nil)
	assert.NilError(t, err)
	layerFile := filepath.Join(dir, "layer.tgz")
	assert.NilError(t, (&layer.Layer{Cluster: cluster, Machines: machines, Identity: id, Tokens: tokens}).WriteFile(layerFile, false))
	folder := filepath.Join(dir, name)
	_, err = install.Install(context.Background(), install.Options{Folder: folder, Release: rel.Dir, Layer: layerFile, Machine: name, TempDir: dir})
	assert.NilError(t, err)

	m := &nsmachine.Machine{
		Name: name, Dir: folder, Cgroup: fmt.Sprintf("liken-test/%s-%d", name, os.Getpid()),
		Init: []string{liken, "lab", "ns-init"}, Console: &console{t: t, name: name},
	}
	t.Cleanup(func() {
		// A machine its test could not power off (a failed assertion)
		// must not outlive the test: kill what is left in its cgroup.
		procs, err := m.CgroupProcs()
		assert.Check(t, err)
		for _, pid := range procs {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		assert.Check(t, m.RemoveCgroup(time.Minute))
	})
	return m, rel
}

// start powers the machine on; the test's end pulls its power.
func start(t *testing.T, m *nsmachine.Machine) *nsmachine.Boot {
	t.Helper()
	b, err := m.Start()
	assert.NilError(t, err)
	t.Cleanup(func() {
		_ = b.Kill()
		_, _ = b.Wait()
	})
	return b
}

// console writes a machine's console to the test's log.
type console struct {
	t    *testing.T
	name string
}

func (c *console) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		c.t.Logf("%s console: %s", c.name, line)
	}
	return len(b), nil
}

// in runs a command inside the machine whose init is b: its namespaces
// and its root.
func in(b interface{ PID() int }, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"-t", fmt.Sprint(b.PID()), "-a", "-r", "-w"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// booted polls until the machine's systemd has named the machine from its
// layer (liken-machine.service, the image's first unit of its own).
func booted(t *testing.T, b *nsmachine.Boot) {
	t.Helper()
	bootedPID(t, b, b.Ended())
}

// bootedPID is booted for a machine whose init is b, whose boot ends when
// ended closes.
func bootedPID(t *testing.T, b interface{ PID() int }, ended <-chan struct{}) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-ended:
			return poll.Error(fmt.Errorf("the machine's boot ended"))
		default:
		}
		out, _ := in(b, "systemctl", "is-active", "liken-machine.service")
		switch out {
		case "active":
			return poll.Success()
		case "failed":
			log, _ := in(b, "journalctl", "--no-pager", "-u", "liken-machine.service")
			return poll.Error(fmt.Errorf("liken-machine.service failed:\n%s", log))
		}
		return poll.Continue("liken-machine.service is %q", out)
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(500*time.Millisecond))
}

// TestMachineInNamespaces boots liken's OS image in namespaces: the
// image's systemd runs the image's units as on a real machine; the
// machine sees its own kernel command line and boot ID and cannot change
// the host's kernel settings; a reboot from inside boots again the slot
// the boot state picks, a power-off ends the boot, and pulling the power
// ends every process.
func TestMachineInNamespaces(t *testing.T) {
	m, _ := newMachine(t, "ns-1")
	hostPanic, err := os.ReadFile("/proc/sys/kernel/panic")
	assert.NilError(t, err)

	powerOn := time.Now()
	b := start(t, m)
	assert.Check(t, is.Equal(b.Slot, boot.SlotA))
	booted(t, b)
	t.Logf("ns-1: systemd named the machine %s after power-on", time.Since(powerOn).Round(time.Millisecond))

	pid1, err := in(b, "cat", "/proc/1/comm")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(pid1, "systemd"), "the image's init is the machine's PID 1")
	host, err := in(b, "hostname")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(host, "ns-1"))
	cmdline, err := in(b, "cat", "/proc/cmdline")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cmdline, "BOOT_IMAGE=/A/vmlinuz liken.slot=A"))
	bootID, err := in(b, "cat", "/proc/sys/kernel/random/boot_id")
	assert.NilError(t, err)
	hostBootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	assert.NilError(t, err)
	assert.Check(t, bootID != strings.TrimSpace(string(hostBootID)), "the machine's boot ID is the host's")

	// The host's kernel: the kubelet's settings read as it wants them,
	// and no write reaches the host.
	kpanic, err := in(b, "cat", "/proc/sys/kernel/panic")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(kpanic, nsmachine.KernelDefaults["kernel/panic"]))
	// (Each write puts back the value read: were it to succeed, the host
	// would be left as it was.)
	for _, file := range []string{"/proc/sys/kernel/panic", "/proc/sys/kernel/pid_max", "/proc/sys/vm/swappiness"} {
		out, err := in(b, "sh", "-c", "v=$(cat "+file+") && echo $v > "+file)
		assert.Check(t, err != nil, "writing %s from the machine: %s", file, out)
	}
	after, err := os.ReadFile("/proc/sys/kernel/panic")
	assert.NilError(t, err)
	assert.Check(t, bytes.Equal(after, hostPanic), "the machine changed the host's kernel.panic")
	// Its own network namespace's settings are its own to change.
	for _, file := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/hostname"} {
		out, err := in(b, "sh", "-c", "v=$(cat "+file+") && echo $v > "+file)
		assert.Check(t, err, "writing %s from the machine: %s", file, out)
	}

	// The journal, kept on the slot store under the machine's own ID: the
	// kernel's messages' unit (liken logs --kernel) has started.
	machineID, err := in(b, "cat", "/etc/machine-id")
	assert.NilError(t, err)
	journal := func(b interface{ PID() int }, boot string) func(poll.LogT) poll.Result {
		return func(poll.LogT) poll.Result {
			out, err := in(b, "journalctl", "--boot", boot, "--unit", "liken-kernel-log", "--no-pager")
			if err != nil || !strings.Contains(out, "Copying the kernel messages of this boot") {
				return poll.Continue("journalctl --boot %s --unit liken-kernel-log: %v %s", boot, err, out)
			}
			return poll.Success()
		}
	}
	poll.WaitOn(t, journal(b, "0"), poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))

	// A reboot from inside, as liken-node asks for one.
	_, _ = in(b, "systemctl", "reboot")
	end, err := b.Wait()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(end, nsmachine.Rebooted))
	b2 := start(t, m)
	booted(t, b2)
	again, err := in(b2, "cat", "/proc/sys/kernel/random/boot_id")
	assert.NilError(t, err)
	assert.Check(t, again != bootID, "a reboot gets a new boot ID")
	sameID, err := in(b2, "cat", "/etc/machine-id")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(sameID, machineID), "a reboot gets another machine ID: the journal of the boot before is out of journalctl's reach")
	// The boot before, read from the journal on the slot store.
	poll.WaitOn(t, journal(b2, "-1"), poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))

	// A power-off from inside ends the boot for good.
	_, _ = in(b2, "systemctl", "poweroff")
	end, err = b2.Wait()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(end, nsmachine.PoweredOff))

	// The power, pulled.
	b3 := start(t, m)
	booted(t, b3)
	assert.NilError(t, b3.Kill())
	end, err = b3.Wait()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(end, nsmachine.Crashed))
}

// stage downloads rel from a channel over HTTP into the machine's slot B
// and stages it, as liken-node does.
func stage(t *testing.T, m *nsmachine.Machine, rel *clirelease.Result) {
	t.Helper()
	ctx := context.Background()
	channel := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(rel.Dir))))
	defer channel.Close()
	store, err := slots.Open(ctx, filepath.Join(m.Dir, nsmachine.SlotsDir), slots.A, slots.WithBootPartition(filepath.Join(m.Dir, nsmachine.BootDir)))
	assert.NilError(t, err)
	target := release.Target{Version: rel.Version, Digest: rel.Digest}
	dl, err := store.BeginDownload(slots.B, target)
	assert.NilError(t, err)
	_, err = (&release.Fetcher{}).Fetch(ctx, channel.URL, target, dl)
	assert.NilError(t, err)
	_, err = store.Stage(ctx, slots.B)
	assert.NilError(t, err)
}

// TestFirmwareBootsATrialOnce runs a machine's firmware with a release
// staged in slot B and its trial armed, as liken-node does before its
// reboot: the firmware
// boots slot B once, as a trial, and the machine's next reboot, with no
// commit, boots its proven slot A again.
func TestFirmwareBootsATrialOnce(t *testing.T) {
	m, rel := newMachine(t, "ns-2")
	stage(t, m, rel)
	grub := boot.NewGRUB(filepath.Join(m.Dir, nsmachine.BootDir, "grub"))
	assert.NilError(t, grub.ArmTrial(boot.SlotB))

	boots := make(chan *nsmachine.Boot, 8)
	m.Started = func(b *nsmachine.Boot) { boots <- b }
	ctx, cancel := context.WithCancel(context.Background())
	var runEnd nsmachine.Ending
	var runErr error
	ran := make(chan struct{})
	go func() {
		runEnd, runErr = m.Run(ctx)
		close(ran)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})

	b := <-boots
	assert.Check(t, is.Equal(b.Slot, boot.SlotB))
	assert.Check(t, b.Trial)
	booted(t, b)
	cmdline, err := in(b, "cat", "/proc/cmdline")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cmdline, "BOOT_IMAGE=/B/vmlinuz liken.slot=B liken.trial=1"))
	st, err := grub.State()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.Trial, boot.Slot("")), "the firmware boots a trial once: it clears the flag as it boots it")

	_, _ = in(b, "systemctl", "reboot")
	b = <-boots
	assert.Check(t, is.Equal(b.Slot, boot.SlotA))
	assert.Check(t, !b.Trial)
	booted(t, b)
	cmdline, err = in(b, "cat", "/proc/cmdline")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cmdline, "BOOT_IMAGE=/A/vmlinuz liken.slot=A"))

	// The power, pulled: Run ends, and so does every process of the
	// machine.
	cancel()
	<-ran
	assert.NilError(t, runErr)
	assert.Check(t, is.Equal(runEnd, nsmachine.Crashed))
	assert.Check(t, is.ErrorContains(syscall.Kill(b.PID(), 0), "no such process"))
}

// initPID is a machine's init, by its host process ID.
type initPID int

func (p initPID) PID() int { return int(p) }

// TestPowerOffKillsTheMachine runs a machine as the lab does, liken lab
// ns-machine in a process group of its own, and pulls its power as liken
// lab power off does, with SIGKILL to that group: the machine's init, in
// a session of its own, dies with it, and every process of the machine
// with the init.
func TestPowerOffKillsTheMachine(t *testing.T) {
	m, _ := newMachine(t, "ns-3")
	firmware := exec.Command(m.Init[0], "lab", "ns-machine", "--name", m.Name, "--dir", m.Dir, "--cgroup", m.Cgroup)
	firmware.Stdout, firmware.Stderr = m.Console, m.Console
	firmware.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, firmware.Start())
	ended := make(chan struct{})
	go func() {
		_ = firmware.Wait()
		close(ended)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-firmware.Process.Pid, syscall.SIGKILL)
		<-ended
	})

	var pid initPID
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		b, err := os.ReadFile(filepath.Join(m.Dir, nsmachine.RunDir, nsmachine.PIDFile))
		if err != nil {
			return poll.Continue("no init yet: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return poll.Error(err)
		}
		pid = initPID(n)
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	bootedPID(t, pid, ended)
	others, err := in(pid, "sh", "-c", "ls -d /proc/[0-9]* | wc -l")
	assert.NilError(t, err)
	t.Logf("ns-3 runs %s processes", others)

	assert.NilError(t, syscall.Kill(-firmware.Process.Pid, syscall.SIGKILL))
	<-ended
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := syscall.Kill(pid.PID(), 0); errors.Is(err, syscall.ESRCH) {
			return poll.Success()
		}
		return poll.Continue("the machine's init (pid %d) still runs", pid)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	procs, err := m.CgroupProcs()
	assert.NilError(t, err)
	assert.Check(t, is.Len(procs, 0), "processes of the machine left in its cgroup")
}
