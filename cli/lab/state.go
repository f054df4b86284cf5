package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/internal/atomicfile"
	"liken.sh/liken/internal/qemu"
)

// Process kinds of the lab besides the control-plane components.
const (
	KindOperator = "operator"
	KindMachine  = "machine"
	KindChannel  = "channel"
	// KindEndpoint is the VM lab's API endpoint: a loopback port forwarded
	// to a ready leader's API server (liken lab serve-endpoint).
	KindEndpoint = "endpoint"
	// KindSegment is the VM lab's network segment: the switch between
	// the machines' second ports (liken lab serve-segment).
	KindSegment = "segment"
	// KindNames is the VM lab's name server (liken lab serve-dns).
	KindNames = "dns"
	// KindRegistry is the VM lab's image registry (liken lab
	// serve-registry).
	KindRegistry = "registry"
)

// State is what a running lab records in <lab dir>/lab.json; `liken lab
// status -o json` prints it.
type State struct {
	// Name is the lab's name.
	Name string `json:"name"`
	// Dir holds every file of the lab.
	Dir string `json:"dir"`
	// Kubeconfig is the admin kubeconfig.
	Kubeconfig string `json:"kubeconfig"`
	// Channel is the URL of the lab's release channel.
	Channel string `json:"channel"`
	// Endpoint is the URL of the VM lab's API endpoint on this computer,
	// which forwards to a ready leader.
	Endpoint string `json:"endpoint,omitempty"`
	// Registry is where the VM lab's machines pull the lab's registry's
	// images, RegistryName:PORT; an image copied into RegistryDir as
	// REPOSITORY:TAG is pulled as Registry/REPOSITORY:TAG.
	Registry string `json:"registry,omitempty"`
	// RegistryDir is the OCI image layout folder the VM lab's registry
	// serves.
	RegistryDir string `json:"registryDir,omitempty"`
	// ChannelDir is the directory the channel serves.
	ChannelDir string `json:"channelDir"`
	// Processes are the processes the lab started.
	Processes []controlplane.Process `json:"processes"`
	// Machines are the simulated machines.
	Machines []MachineInfo `json:"machines"`
	// VM is set in a lab whose machines are virtual machines running
	// liken's OS image (liken lab up --vm).
	VM bool `json:"vm,omitempty"`
	// Containers is set in a lab whose machines run liken's OS image in
	// Linux namespaces (liken lab up --containers).
	Containers bool `json:"containers,omitempty"`
	// NetNS is the namespace lab's own network namespace (a file), where
	// its segment's bridge and the lab's servers are.
	NetNS string `json:"netns,omitempty"`
	// ImageDir is the OS image the VM and namespace labs publish (make
	// image's output).
	ImageDir string `json:"imageDir,omitempty"`
}

// RealImage tells whether the lab's machines run liken's real OS image
// (virtual machines or namespaces), with their own kubelet and control
// plane, rather than simulated machines.
func (st *State) RealImage() bool { return st.VM || st.Containers }

// ServersAddress is the address where the machines of a VM or namespace
// lab reach the lab's servers (the channel, the name server, the
// registry), and what the lab's names resolve to; empty for a lab of
// simulated machines.
func (st *State) ServersAddress() string {
	switch {
	case st.VM:
		return qemu.HostAddress
	case st.Containers:
		return segmentGateway
	}
	return ""
}

// MachineInfo describes one simulated machine.
type MachineInfo struct {
	// Name is the machine's (and its Node's) name.
	Name string `json:"name"`
	// Role is Leader or Worker.
	Role string `json:"role"`
	// Kubeconfig is the machine's own identity (system:node:<name>),
	// written by its liken-node when it joins. Empty for a virtual
	// machine: its identity stays on its disk.
	Kubeconfig string `json:"kubeconfig"`
	// Dir holds the machine's disk, layer and logs.
	Dir string `json:"dir"`
	// Forwards maps ports of this computer's loopback to a virtual
	// leader's API server and etcd ports, kept so that the leader powers
	// on again behind the same ones.
	Forwards map[int]int `json:"forwards,omitempty"`
}

var labName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$`)

// Home is the folder that holds every lab: $LIKEN_LAB_HOME, else
// $XDG_STATE_HOME/liken/labs, else ~/.local/state/liken/labs.
func Home() (string, error) {
	if h := os.Getenv("LIKEN_LAB_HOME"); h != "" {
		return filepath.Abs(h)
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "liken", "labs"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the labs folder: %w (set LIKEN_LAB_HOME)", err)
	}
	return filepath.Join(home, ".local", "state", "liken", "labs"), nil
}

// Dir is the folder of the lab called name.
func Dir(name string) (string, error) {
	if !labName.MatchString(name) {
		return "", fmt.Errorf("lab name %q: use 1 to 32 lowercase letters, digits and dashes, such as lab or lab-2", name)
	}
	home, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, name), nil
}

// Load reads the state of the lab called name.
func Load(name string) (*State, error) {
	dir, err := Dir(name)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("there is no lab called %q (looked in %s): start one with liken lab up --name %s", name, dir, name)
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s is damaged (%v): stop what is left with liken lab down --name %s", filepath.Join(dir, "lab.json"), err, name)
	}
	st.refreshOperatorPIDs()
	return &st, nil
}

// Save writes the lab's state atomically.
func (st *State) Save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(st.Dir, "lab.json"), append(b, '\n'), 0o600)
}

// Machine returns the machine called name.
func (st *State) Machine(name string) (*MachineInfo, error) {
	for i := range st.Machines {
		if st.Machines[i].Name == name {
			return &st.Machines[i], nil
		}
	}
	var names []string
	for _, m := range st.Machines {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("lab %s has no machine %q; its machines are %v", st.Name, name, names)
}

// Process returns the process of the given kind and name, or nil.
func (st *State) Process(kind, name string) *controlplane.Process {
	for i := range st.Processes {
		if st.Processes[i].Kind == kind && st.Processes[i].Name == name {
			return &st.Processes[i]
		}
	}
	return nil
}

// Running reports whether any process of the lab is alive.
func (st *State) Running() bool {
	for _, p := range st.Processes {
		if p.Running() {
			return true
		}
	}
	return false
}

// Exited returns the lab's processes that should run and do not: every
// started process but the machines a user powered off (PID 0) and the
// cluster-operator copies, which their supervisors start again (a copy that
// loses the lease exits by design; its supervisor stands for it).
func (st *State) Exited() []controlplane.Process {
	var gone []controlplane.Process
	for _, p := range st.Processes {
		if judged(p) && p.PID > 0 && !p.Running() {
			gone = append(gone, p)
		}
	}
	return gone
}

// DownError says that a lab's processes have exited: its API server, its
// channel or its machines are gone (the computer restarted, or they were
// killed), and what to run.
type DownError struct {
	// Name is the lab's name.
	Name string
	// Exited are the processes that should run and do not.
	Exited []controlplane.Process
	// Total is how many of the lab's processes are judged (all but the
	// cluster-operator copies, whose supervisors stand for them).
	Total int
}

// Summary says in one line how much of the lab is down.
func (e *DownError) Summary() string {
	if len(e.Exited) == e.Total {
		return fmt.Sprintf("lab %s is down: all of its %d processes have exited (the computer restarted, or they were killed)", e.Name, e.Total)
	}
	return fmt.Sprintf("lab %s is down: %d of its %d processes have exited", e.Name, len(e.Exited), e.Total)
}

func (e *DownError) Error() string {
	var b strings.Builder
	b.WriteString(e.Summary())
	if len(e.Exited) < e.Total {
		b.WriteString(":")
		for _, p := range e.Exited {
			fmt.Fprintf(&b, "\n  %s %s (pid %d); its log: %s", p.Kind, p.Name, p.PID, p.Log)
		}
	}
	fmt.Fprintf(&b, "\nStart it again with liken lab up --name %s (it stops what is left of this lab first), or remove it with liken lab down --name %s", e.Name, e.Name)
	return b.String()
}

// Check returns a *DownError when a process of the lab that should run
// has exited, and nil when the lab runs.
func (st *State) Check() *DownError {
	gone := st.Exited()
	if len(gone) == 0 {
		return nil
	}
	total := 0
	for _, p := range st.Processes {
		if judged(p) {
			total++
		}
	}
	return &DownError{Name: st.Name, Exited: gone, Total: total}
}

// judged is false for a cluster-operator copy: its supervisor, which
// starts it again, stands for it.
func judged(p controlplane.Process) bool {
	return p.Kind != KindOperator
}
