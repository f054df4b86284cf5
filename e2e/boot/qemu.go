package boote2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"liken.sh/liken/internal/qemu"
)

// VM is one QEMU process running a disk, its serial console captured.
type VM struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	out     bytes.Buffer
	pos     int // where the next Find starts
	done    chan struct{}
	exitErr error
	Started time.Time
	logFile *os.File
}

// BootTest is the hardware of the boot tests: 512 MiB, one CPU, no
// network.
var BootTest = qemu.Hardware{MemoryMiB: 512, CPUs: 1}

// Start boots disk on hw. The console is also copied to logPath.
func (k *Kit) Start(disk, logPath string, hw qemu.Hardware) (*VM, error) {
	return k.start(k.Args(disk, hw, "stdio"), logPath)
}

// StartCacheDisk boots the disk d serves, on hw: QEMU reads and writes it
// over NBD, through its volatile write cache.
func (k *Kit) StartCacheDisk(d *CacheDisk, logPath string, hw qemu.Hardware) (*VM, error) {
	args := k.Args("placeholder", hw, "stdio")
	i := slices.Index(args, "-drive")
	if i < 0 || i+1 >= len(args) {
		return nil, fmt.Errorf("QEMU's arguments have no -drive: %q", args)
	}
	args[i+1] = d.DriveArg()
	return k.start(args, logPath)
}

func (k *Kit) start(args []string, logPath string) (*VM, error) {
	cmd := k.Command("qemu-system-x86_64", args...)
	cmd.Stdin = nil
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	vm := &VM{cmd: cmd, done: make(chan struct{}), logFile: logFile}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &lockedWriter{vm: vm}
	vm.Started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("QEMU did not start: %w", err)
	}
	go func() {
		_, _ = io.Copy(&lockedWriter{vm: vm}, stdout)
		vm.exitErr = cmd.Wait()
		logFile.Close()
		close(vm.done)
	}()
	return vm, nil
}

type lockedWriter struct{ vm *VM }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.vm.mu.Lock()
	defer w.vm.mu.Unlock()
	w.vm.logFile.Write(p)
	return w.vm.out.Write(p)
}

// Output is everything the machine printed so far.
func (vm *VM) Output() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.out.String()
}

// Find looks for the next line containing marker after the previous
// match; it returns the line and moves past it.
func (vm *VM) Find(marker string) (string, bool) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	rest := vm.out.String()[vm.pos:]
	i := strings.Index(rest, marker)
	if i < 0 {
		return "", false
	}
	end := strings.IndexByte(rest[i:], '\n')
	if end < 0 {
		return "", false // wait for the whole line
	}
	start := strings.LastIndexByte(rest[:i], '\n') + 1
	vm.pos += i + end + 1
	return strings.TrimRight(rest[start:i+end], "\r"), true
}

// Exited reports whether QEMU has ended, and how.
func (vm *VM) Exited() (bool, error) {
	select {
	case <-vm.done:
		return true, vm.exitErr
	default:
		return false, nil
	}
}

// Kill cuts the power: QEMU is killed at once.
func (vm *VM) Kill() {
	if vm.cmd.Process != nil {
		_ = vm.cmd.Process.Kill()
	}
	<-vm.done
}

// Done is closed when QEMU has ended.
func (vm *VM) Done() <-chan struct{} { return vm.done }
