package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"liken.sh/liken/cli/install"
	"liken.sh/liken/cli/lab/controlplane"
	"liken.sh/liken/cli/lab/nsmachine"
	"liken.sh/liken/cli/lab/nsnet"
	"liken.sh/liken/cli/layer"
	nodecp "liken.sh/liken/node/controlplane"
)

// The namespace lab (liken lab up --containers): each machine runs
// liken's OS image in Linux namespaces above this computer's kernel
// (package nsmachine, docs/design/lab.md), on one network segment inside
// a network namespace of the lab's own (package nsnet). The leaders run
// the control plane from the image, cluster-operator runs as the
// Deployment of manifests/, and this computer runs the lab's servers
// (the channel, the registry, the name server and the API endpoint),
// which listen on the segment's gateway; the endpoint also listens on
// this computer's loopback for the person.

// containersTimeout is the least time liken lab up --containers waits for
// its Cluster: a leader's control plane is up about a minute after power
// on, at this computer's speed (docs/benchmarks.md).
const containersTimeout = 10 * time.Minute

// segmentNet is the folder of the namespace lab's network namespaces.
const segmentNet = "net"

// segmentGateway is the segment's gateway, where the lab's servers
// listen for the machines.
const segmentGateway = segmentPrefix + ".1"

// containerDisk is the machine's disk, as folders, in its folder.
const containerDisk = "disk"

// containerCgroup is a namespace lab machine's cgroup, from each
// hierarchy's root: the lab's commands run in different cgroups.
func containerCgroup(st *State, m *MachineInfo) string {
	return labCgroup(st) + "/" + m.Name
}

// NSMachine is a namespace lab's machine m, for reading its cgroup.
func NSMachine(st *State, m *MachineInfo) *nsmachine.Machine {
	return &nsmachine.Machine{Name: m.Name, Dir: filepath.Join(m.Dir, containerDisk), Cgroup: containerCgroup(st, m)}
}

// labCgroup is the cgroup of a namespace lab's machines.
func labCgroup(st *State) string { return "/liken-lab/" + st.Name }

// segmentOf opens the namespace lab's segment.
func segmentOf(st *State) (*nsnet.Segment, error) {
	return nsnet.Open(filepath.Join(st.Dir, segmentNet), netip.MustParsePrefix(segmentPrefix+".0/24"))
}

// serverArgs are the flags that make a lab server listen where the lab's
// machines reach it: the segment's gateway in the namespace lab, else
// nothing (the loopback).
func serverArgs(st *State) []string {
	if !st.Containers {
		return nil
	}
	return []string{"--netns", st.NetNS, "--address", segmentGateway}
}

func upContainers(ctx context.Context, o upOptions, dir string, bins binaries, graceArgs []string, step func(string, ...any), out, log io.Writer) (err error) {
	o.timeout = max(o.timeout, containersTimeout)
	deadline := time.Now().Add(o.timeout)
	imageDir, err := osImageDir(log)
	if err != nil {
		return err
	}
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: o.name})
	if err != nil {
		return err
	}
	st := &State{Name: o.name, Dir: dir, Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), ChannelDir: filepath.Join(dir, "channel"), Containers: true, ImageDir: imageDir}
	defer func() {
		if err != nil {
			stopAll(st)
			err = fmt.Errorf("%w\nThe lab's logs are in %s (each machine's console is its machine.log); liken lab down --name %s removes them", err, dir, o.name)
		} else {
			err = st.Save()
		}
	}()
	seg, err := nsnet.Create(filepath.Join(dir, segmentNet), netip.MustParsePrefix(segmentPrefix+".0/24"))
	if err != nil {
		return err
	}
	st.NetNS = seg.LabNetNS()
	step("the machines' network segment: %s.0/24 on a bridge in the lab's network namespace %s", segmentPrefix, st.NetNS)

	srv, version, digest, err := startServers(ctx, st, bins)
	if err != nil {
		return err
	}
	step("release channel at %s with release %s", st.Channel, version)

	// Each leader is reached at its own address; the endpoint, on the
	// gateway and on this computer's loopback, forwards to them.
	names := machineNames(o.machines)
	reach := map[string]string{}
	var backends []string
	for i, n := range names[:o.leaders] {
		backends = append(backends, fmt.Sprintf("%s:%d", segmentAddress(i), nodecp.APIServerPort))
		if o.leaders > 1 {
			reach[n] = reachAnnotations(segmentAddress(i), leaderPorts{nodecp.APIServerPort, nodecp.EtcdClientPort, nodecp.EtcdPeerPort})
		}
	}
	caFile := filepath.Join(dir, "server-ca.crt")
	if err := os.WriteFile(caFile, id.Files["server-ca.crt"], 0o644); err != nil {
		return err
	}
	endpoint := fmt.Sprintf("%s:%d", segmentGateway, nodecp.APIServerPort)
	if _, err := startEndpoint(ctx, st, bins, backends, caFile, "--netns", st.NetNS, "--netns-address", endpoint); err != nil {
		return err
	}
	step("API endpoint at %s and, for the machines, %s, forwarding to the leaders' API servers at %s", st.Endpoint, endpoint, strings.Join(backends, ", "))

	source := fmt.Sprintf("https://%s:%d", ChannelName, srv.channel)
	_, layerFile, _, err := packLayer(dir, id, fleetDocuments(o, endpoint, source, version, digest, reach, srv.settings(st.ServersAddress())))
	if err != nil {
		return err
	}
	if err := writeAdminKubeconfig(st.Kubeconfig, id, st.Endpoint); err != nil {
		return err
	}
	for i, n := range names {
		m := MachineInfo{Name: n, Role: roleOf(i, o.leaders), Dir: filepath.Join(dir, "machines", n)}
		if err := os.MkdirAll(m.Dir, 0o755); err != nil {
			return err
		}
		step("writing %s's disk with liken install (%s)", n, m.Role)
		if _, err := install.Install(ctx, install.Options{
			Folder: filepath.Join(m.Dir, containerDisk), Release: filepath.Join(st.ChannelDir, version), Layer: layerFile,
			Machine: m.Name, TempDir: m.Dir,
		}); err != nil {
			return fmt.Errorf("installing machine %s: %w", n, err)
		}
		if _, err := seg.AddMachine(n, netip.MustParseAddr(segmentAddress(i))); err != nil {
			return fmt.Errorf("machine %s's network: %w", n, err)
		}
		st.Machines = append(st.Machines, m)
	}
	step("%d machines installed by liken install, slot A holding %s, each with its address on the segment (%s to %s)", o.machines, version, segmentAddress(0), segmentAddress(o.machines-1))
	for i := range st.Machines {
		p, err := startNSMachine(st, &st.Machines[i], bins)
		if err != nil {
			return err
		}
		st.Processes = append(st.Processes, *p)
	}
	if err := st.Save(); err != nil {
		return err
	}
	step("%d machines powered on, each in its own namespaces", o.machines)

	return finishUp(ctx, st, o, id, version, graceArgs, deadline, step, out, log)
}

// startNSMachine powers a namespace lab machine on: its firmware process
// (liken lab ns-machine), in a session of its own, its console in the
// machine's log.
func startNSMachine(st *State, m *MachineInfo, bins binaries) (*controlplane.Process, error) {
	seg, err := segmentOf(st)
	if err != nil {
		return nil, err
	}
	netns, err := seg.NetNS(m.Name)
	if err != nil {
		return nil, err
	}
	p, err := controlplane.StartProcess(bins.liken, []string{"lab", "ns-machine",
		"--name", m.Name, "--dir", filepath.Join(m.Dir, containerDisk), "--cgroup", containerCgroup(st, m), "--netns", netns,
	}, filepath.Join(m.Dir, machineLog), true)
	if err != nil {
		return nil, err
	}
	p.Kind, p.Name = KindMachine, m.Name
	return p, nil
}

// stopContainers removes what a namespace lab's machines leave once their
// processes are stopped: the lab's cgroups (the machines' are below it;
// /liken-lab itself stays, for the other labs) and the network segment.
func stopContainers(st *State) error {
	var errs []error
	lab := &nsmachine.Machine{Name: "of lab " + st.Name, Cgroup: labCgroup(st)}
	if err := lab.RemoveCgroup(30 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if seg, err := segmentOf(st); err == nil {
		errs = append(errs, seg.Delete())
	}
	return errors.Join(errs...)
}
