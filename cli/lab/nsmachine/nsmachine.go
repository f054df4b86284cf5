// Package nsmachine runs a lab machine's OS image in Linux namespaces, with the image's own systemd as its PID 1.
//
// A machine is a folder written by liken install (Options.Folder): its
// boot, layer and slot store partitions as folders. Start does what the
// machine's firmware and GRUB do (choose the slot from the boot state, with
// grub.cfg's rules) and what liken-boot does (assemble the root from the
// slot's squashfs, the slot store and the layer), and runs the image's
// init in new mount, PID, UTS, IPC, cgroup and network namespaces. There is
// no kernel of its own: the machine shares the host's, so the host's
// kernel settings are kept out of its reach (see Init).
package nsmachine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"liken.sh/liken/node/boot"
)

// Folders of a machine's folder: install's partitions by label, and the
// firmware's own.
const (
	BootDir  = "liken-boot"  // the boot partition: grub/grubenv, the slots' kernels
	LayerDir = "liken-layer" // the layer partition, mounted read-only at /var/lib/liken-layer
	SlotsDir = "liken-slots" // the slot store, mounted at /var/lib/liken
	// RunDir holds what one boot needs outside the image: the mount point
	// of its root, and its kernel command line and boot ID.
	RunDir = "run"
	// PIDFile, in RunDir, holds the host's process ID of the running
	// boot's init: where to enter the machine (nsenter --target).
	PIDFile = "pid"
)

// Machine is one machine in namespaces.
type Machine struct {
	// Name is the machine's name, for messages.
	Name string
	// Dir is the machine's folder (install's Options.Folder).
	Dir string
	// Cgroup is the machine's cgroup in each hierarchy, relative to the
	// caller's own, or to the hierarchy's root when it starts with a
	// slash, such as "/liken-lab/lab/node-1" (the lab's commands run in
	// different cgroups). Its processes stay in it.
	Cgroup string
	// NetNS is the network namespace the machine joins (a path such as
	// /run/netns/NAME); "" gives it a new one with only loopback.
	NetNS string
	// Init is the command that runs Init in the new namespaces, such as
	// liken's hidden "liken lab ns-init"; Start adds Init's flags.
	Init []string
	// Console receives the machine's console: Init's messages and
	// systemd's status lines.
	Console io.Writer
	// Started, if set, is given each boot Run starts.
	Started func(*Boot)
}

// Boot is one boot of a machine.
type Boot struct {
	boot.Selection
	cmd    *exec.Cmd
	ended  chan struct{}
	ending Ending
	err    error
}

// Ending is how a boot ended.
type Ending string

// How a boot ends.
const (
	// Rebooted: the OS asked the kernel to restart (reboot(2) in its PID
	// namespace); the firmware boots again.
	Rebooted Ending = "rebooted"
	// PoweredOff: the OS asked to halt or power off.
	PoweredOff Ending = "powered off"
	// Crashed: init exited or died of a signal of its own (the kernel
	// would panic), or was killed (lab power off).
	Crashed Ending = "crashed"
)

// Start chooses the slot as grub.cfg does (clearing a trial flag as it
// boots it), writes the boot's command line and ID, and starts the image's
// init in new namespaces.
func (m *Machine) Start() (*Boot, error) {
	sel, err := boot.SelectBootDetail(filepath.Join(m.Dir, BootDir, "grub"))
	if err != nil {
		return nil, fmt.Errorf("machine %s's boot state: %w", m.Name, err)
	}
	run := filepath.Join(m.Dir, RunDir)
	if err := os.MkdirAll(filepath.Join(run, "root"), 0o755); err != nil {
		return nil, err
	}
	cmdline := "BOOT_IMAGE=/" + string(sel.Slot) + "/vmlinuz liken.slot=" + string(sel.Slot)
	if sel.Trial {
		cmdline += " liken.trial=1"
	}
	args, err := readKernelArgs(filepath.Join(m.Dir, BootDir, "grub"))
	if err != nil {
		return nil, err
	}
	if len(args) > 0 {
		cmdline += " " + strings.Join(args, " ")
	}
	if err := os.WriteFile(filepath.Join(run, "cmdline"), []byte(cmdline+"\n"), 0o644); err != nil {
		return nil, err
	}
	id, err := os.ReadFile("/proc/sys/kernel/random/uuid")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(run, "boot_id"), id, 0o444); err != nil {
		return nil, err
	}
	// The power line: Init's end of a pipe whose other end only this
	// process holds. Init sees it closed when this process is gone.
	powerIn, powerOut, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer powerIn.Close()
	argv := append(append([]string{}, m.Init[1:]...), "--dir", m.Dir, "--slot", string(sel.Slot), "--cgroup", m.Cgroup, "--netns", m.NetNS, "--hostname", m.Name, "--power-fd", "3")
	cmd := exec.Command(m.Init[0], argv...)
	cmd.Stdout, cmd.Stderr = m.Console, m.Console
	cmd.ExtraFiles = []*os.File{powerIn}
	flags := syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC
	if m.NetNS == "" {
		flags |= syscall.CLONE_NEWNET
	}
	// Init joins its cgroup itself, then makes it the root of a new
	// cgroup namespace: the clone cannot do both in this order. A machine
	// never outlives what powered it on: the kernel kills its init, and
	// with it the whole machine, when the thread that started it ends
	// (Init sets the same signal again on the thread that runs the
	// image's init, and checks the power line before it does).
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: uintptr(flags), Setsid: true, Pdeathsig: syscall.SIGKILL}
	b := &Boot{Selection: sel, cmd: cmd, ended: make(chan struct{})}
	started := make(chan error)
	go func() {
		// The parent-death signal follows the starting thread, not the
		// process: this one stays out of the Go scheduler's reach until
		// the boot ends (a thread that another goroutine locks into a
		// namespace and ends would otherwise take the machine with it).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			powerOut.Close()
			started <- err
			return
		}
		started <- nil
		b.ending, b.err = end(cmd.Wait())
		powerOut.Close()
		close(b.ended)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting machine %s: %w", m.Name, err)
	}
	if err := os.WriteFile(filepath.Join(run, PIDFile), []byte(strconv.Itoa(b.PID())+"\n"), 0o644); err != nil {
		_ = b.Kill()
		return nil, err
	}
	return b, nil
}

// Run is the machine's firmware while its power is on: it boots the
// machine, and boots it again after a reboot or a crash (a kernel that
// panics restarts), until the OS powers off or ctx ends, which pulls the
// power. Each boot is said on the console.
func (m *Machine) Run(ctx context.Context) (Ending, error) {
	for n := 1; ; n++ {
		b, err := m.Start()
		if err != nil {
			return "", err
		}
		kind := "proven"
		if b.Trial {
			kind = "one-time trial"
		}
		note := ""
		if b.Note != "" {
			note = " (" + b.Note + ")"
		}
		m.say("boot %d: slot %s (%s)%s", n, b.Slot, kind, note)
		if m.Started != nil {
			m.Started(b)
		}
		select {
		case <-b.Ended():
		case <-ctx.Done():
			_ = b.Kill()
			<-b.Ended()
			m.say("power off")
			return Crashed, nil
		}
		end, err := b.Wait()
		m.say("boot %d ended: %s%s", n, end, errNote(err))
		switch end {
		case PoweredOff:
			return end, nil
		case Crashed:
			// A kernel that panics restarts after kernel.panic's
			// seconds, as liken's own kernel does.
			m.say("restarting in %s, as a kernel that panicked", PanicRestart)
			select {
			case <-ctx.Done():
				m.say("power off")
				return Crashed, nil
			case <-time.After(PanicRestart):
			}
		}
	}
}

// PanicRestart is how long a crashed machine takes to boot again: a
// kernel's kernel.panic seconds.
const PanicRestart = 5 * time.Second

// say writes a firmware line on the machine's console.
func (m *Machine) say(format string, args ...any) {
	fmt.Fprintf(m.Console, "%s firmware %s: %s\n", time.Now().UTC().Format(time.RFC3339), m.Name, fmt.Sprintf(format, args...))
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// readKernelArgs reads the Cluster's kernel arguments from the boot
// partition's grub folder, as grub.cfg appends them.
func readKernelArgs(bootDir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(bootDir, boot.KernelArgsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return boot.ParseKernelArgsConfig(b)
}

// PID is the host's process ID of the machine's init.
func (b *Boot) PID() int { return b.cmd.Process.Pid }

// Kill pulls the power: every process of the machine dies at once, with
// no shutdown (killing a PID namespace's init kills the namespace).
func (b *Boot) Kill() error { return b.cmd.Process.Kill() }

// Ended is closed once the boot has ended.
func (b *Boot) Ended() <-chan struct{} { return b.ended }

// Wait waits for the boot to end and says how.
func (b *Boot) Wait() (Ending, error) {
	<-b.ended
	return b.ending, b.err
}

// end reads how init ended from its wait. An init that exits, rather
// than asking the kernel to restart or halt, is a crash: a kernel panics
// when its init ends (an image without /sbin/init does that).
func end(err error) (Ending, error) {
	var exit *exec.ExitError
	if err == nil {
		return Crashed, errors.New("init exited: a kernel panics when its init ends")
	}
	if !errors.As(err, &exit) {
		return Crashed, err
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return Crashed, fmt.Errorf("init exited with status %d: a kernel panics when its init ends", exit.ExitCode())
	}
	return ending(ws.Signal()), nil
}

// ending reads the signal that ended a PID namespace's init: the kernel
// ends it with SIGHUP for a restart and SIGINT for a halt or power-off
// (reboot(2) in a PID namespace).
func ending(sig syscall.Signal) Ending {
	switch sig {
	case syscall.SIGHUP:
		return Rebooted
	case syscall.SIGINT:
		return PoweredOff
	}
	return Crashed
}
