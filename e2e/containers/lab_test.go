package containers

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/install"
	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/e2e/internal/userlab"
	nodecp "liken.sh/liken/node/controlplane"
)

// TestFleetOfThreeLeaders runs the user's commands on a namespace lab of
// five machines, three of them leaders running the fleet's datastore and
// API from liken's image: liken lab up --containers gives a Ready Cluster
// of real kubelets, this computer running only the lab's servers; the
// fleet is an ordinary Kubernetes cluster (userlab.NetworkAcrossMachines);
// an upgrade under the API probe, a leader's power cut while a worker
// holds its turn and a release whose trial fails keep the datastore's
// majority and members and the API within one leader's failover
// (userlab.SelfHostedFleet); a leader whose etcd stops right after its
// commit holds back the next leader's reboot until it is back; the first
// leader installed again while the two others are down starts no second
// datastore, and joins the fleet's once they are back; liken lab down
// leaves no process, mount, network namespace or cgroup behind.
func TestFleetOfThreeLeaders(t *testing.T) {
	l := userlab.Up(t, userlab.Containers, "ns", 5, 3)
	userlab.NetworkAcrossMachines(t, l)
	liveInBatches(t, l)
	userlab.SelfHostedFleet(t, l)
	etcdStoppedAfterCommit(t, l)
	reinstalledLeaderAlone(t, l)

	l.Down()
	st := l.St
	for _, p := range st.Processes {
		assert.Check(t, !p.Running(), "%s %s (pid %d) still runs", p.Kind, p.Name, p.PID)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(mounts), st.Dir), "mounts of the lab are left")
	_, err = os.Stat(st.Dir)
	assert.Check(t, os.IsNotExist(err), "the lab's folder is left: %v", err)
	left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/liken-lab/%s", l.Name))
	if _, err := os.Stat("/sys/fs/cgroup/liken-lab/" + l.Name); err == nil {
		left = append(left, "/sys/fs/cgroup/liken-lab/"+l.Name)
	}
	assert.Check(t, is.Len(left, 0), "the lab's cgroups are left")
}

// liveInBatches changes settings.sysctls, a Live field, on the lab's
// Cluster, with maxUnavailable 2 for the step. First with a parameter no
// kernel has: the two machines granted a Live turn fail to apply it, say
// why and keep their turns, and no other machine gets one. Then with a
// parameter of the machines' network namespace: each machine applies it
// in a Live turn of its own, no more turns held at once than
// maxUnavailable, leaders one at a time, with no reboot and no cordon,
// and every machine ends Ready with the value in its kernel. The settle
// time is cut to a second for the step, so that the batches take
// seconds.
func liveInBatches(t *testing.T, l *userlab.Lab) {
	t.Helper()
	ctx := t.Context()
	const bad, name, value = "net.ipv4.liken_no_such_parameter", "net.ipv4.tcp_keepalive_time", "600"
	const maxTurns = 2
	path := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
	boots := map[string]string{}
	for _, m := range l.St.Machines {
		n, err := l.Kube.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
		assert.NilError(t, err)
		boots[m.Name] = n.Status.NodeInfo.BootID
		out, err := machineOutput(t, l, m.Name, "cat", path)
		assert.NilError(t, err)
		assert.Assert(t, strings.TrimSpace(out) != value, "%s: %s is already %s", m.Name, name, value)
	}
	c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.Name, metav1.GetOptions{})
	assert.NilError(t, err)
	was := c.Spec.Disruption.DeepCopy()
	setSysctl := func(k, v string, d *likenv1.DisruptionSpec) {
		t.Helper()
		c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.Name, metav1.GetOptions{})
		assert.NilError(t, err)
		c.Spec.Settings.Sysctls = map[string]string{k: v}
		c.Spec.Disruption = *d
		_, err = l.Liken.LikenV1alpha1().Clusters().Update(ctx, c, metav1.UpdateOptions{})
		assert.NilError(t, err)
	}
	step := was.DeepCopy()
	step.MaxUnavailable = ptr.To(intstr.FromInt32(maxTurns))
	step.Settle = &metav1.Duration{Duration: time.Second}

	// Each turn lasts at least the settle time after it ends (the ledger,
	// then status.settling): read every 200 ms, every turn is seen.
	turns := map[string]bool{}
	most := 0
	check := func(c *likenv1.Cluster) error {
		held, leaders := 0, 0
		for _, tn := range c.Status.RebootTurns {
			if tn.Reason != likenv1.TurnLive {
				return fmt.Errorf("%s holds a %s turn, not a Live one", tn.Machine, tn.Reason)
			}
			turns[tn.Machine] = true
			held++
			if tn.Leader {
				leaders++
			}
		}
		for _, s := range c.Status.Settling {
			if s.Reason == likenv1.TurnLive {
				turns[s.Machine] = true
				held++
				if s.Leader {
					leaders++
				}
			}
		}
		most = max(most, held)
		if held > maxTurns {
			return fmt.Errorf("%d machines hold or settle from Live turns, more than maxUnavailable (%d): %+v %+v", held, maxTurns, c.Status.RebootTurns, c.Status.Settling)
		}
		if leaders > 1 {
			return fmt.Errorf("%d leaders hold or settle from Live turns at once: %+v %+v", leaders, c.Status.RebootTurns, c.Status.Settling)
		}
		nodes, err := l.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil // read again
		}
		for _, n := range nodes.Items {
			if n.Spec.Unschedulable {
				return fmt.Errorf("%s was cordoned for a Live change", n.Name)
			}
			if b, ok := boots[n.Name]; ok && n.Status.NodeInfo.BootID != b {
				return fmt.Errorf("%s rebooted for a Live change", n.Name)
			}
		}
		return nil
	}
	read := func() (*likenv1.Cluster, poll.Result) {
		c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.Name, metav1.GetOptions{})
		if err != nil {
			return nil, poll.Continue("the Cluster: %v", err)
		}
		if err := check(c); err != nil {
			return nil, poll.Error(err)
		}
		return c, nil
	}

	// A value no machine can apply: the turns granted for it are kept.
	setSysctl(bad, "1", step)
	start := time.Now()
	failed := map[string]bool{}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, r := read()
		if r != nil {
			return r
		}
		for _, tn := range c.Status.RebootTurns {
			m := l.Machine(tn.Machine)
			if cond := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionConfigApplied); m.Status.Phase == likenv1.MachineDegraded && cond != nil &&
				cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, bad) {
				failed[m.Name] = true
			}
		}
		if len(failed) < maxTurns {
			return poll.Continue("%d machines report their failure to set %s (turns %+v)", len(failed), bad, c.Status.RebootTurns)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))
	t.Logf("%s=1: %v failed to apply it in their Live turns, %s after the edit, and say so", bad, slices.Sorted(maps.Keys(failed)), time.Since(start).Round(time.Second))
	// For fifteen seconds (fifteen settle times, and past the first retry,
	// 10 s after the failure) no other machine gets a turn: each read
	// checks it, and the wait ends once fifteen seconds have passed.
	held := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, r := read()
		if r != nil {
			return r
		}
		for _, tn := range c.Status.RebootTurns {
			if !failed[tn.Machine] {
				return poll.Error(fmt.Errorf("%s got a Live turn while %v failed to apply the value", tn.Machine, slices.Sorted(maps.Keys(failed))))
			}
		}
		if len(c.Status.Settling) > 0 {
			return poll.Error(fmt.Errorf("a machine settles from a turn while %v failed: %+v", slices.Sorted(maps.Keys(failed)), c.Status.Settling))
		}
		if time.Since(held) < 15*time.Second {
			return poll.Continue("%s of 15 s with only %v holding turns", time.Since(held).Round(time.Second), slices.Sorted(maps.Keys(failed)))
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))
	assert.DeepEqual(t, turns, failed)

	// The value corrected: every machine applies it, in batches.
	setSysctl(name, value, step)
	start = time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, r := read(); r != nil {
			return r
		}
		for _, m := range l.St.Machines {
			st := l.Machine(m.Name).Status
			if st.Phase != likenv1.MachineReady || len(st.Pending) > 0 {
				return poll.Continue("%s: %s, pending %v", m.Name, st.Phase, st.Pending)
			}
			out, err := machineOutput(t, l, m.Name, "cat", path)
			if err != nil || strings.TrimSpace(out) != value {
				return poll.Continue("%s: %s is %q (%v)", m.Name, name, strings.TrimSpace(out), err)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(200*time.Millisecond))
	assert.Equal(t, len(turns), len(l.St.Machines), "Live turns seen: %v", turns)
	t.Logf("%s=%s on all %d machines %s after the correction, each in a Live turn of its own, at most %d at once (maxUnavailable %d), no reboot, no cordon",
		name, value, len(l.St.Machines), time.Since(start).Round(time.Second), most, maxTurns)
	setSysctl(name, value, was)
}

// etcdStoppedAfterCommit upgrades the fleet again; as soon as the second
// leader is granted its turn, the etcd member of the first, which has just
// committed its trial, is stopped. With one member of three down, the
// second leader must not go down: it keeps its turn, its Machine's Ready
// condition says what it waits for, and no other leader boots again until the first's etcd is
// back. Then the upgrade finishes.
func etcdStoppedAfterCommit(t *testing.T, l *userlab.Lab) {
	ctx := t.Context()
	etcd, urls := l.Datastore(t)
	leaders := slices.Sorted(maps.Keys(urls))
	ids := userlab.WaitDatastore(t, etcd, urls, 2*time.Minute)
	ver, digest := l.Publish("")
	boots := map[string]string{}
	for _, n := range leaders {
		boots[n] = l.Machine(n).Status.Observed.BootID
	}
	l.MoveTo(ver, digest)

	// The first leader's turn ends and the second's is granted.
	var first, second string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.Name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("the Cluster: %v", err)
		}
		for _, tn := range c.Status.RebootTurns {
			if tn.Version != ver || !slices.Contains(leaders, tn.Machine) {
				continue
			}
			if first == "" || first == tn.Machine {
				first = tn.Machine
				return poll.Continue("%s holds the first turn for %s", first, ver)
			}
			second = tn.Machine
			return poll.Success()
		}
		return poll.Continue("turns held: %q", c.Status.Turns)
	}, poll.WithTimeout(15*time.Minute), poll.WithDelay(500*time.Millisecond))
	m := l.Machine(first)
	assert.Assert(t, m.Status.Version == ver && m.Status.Observed.BootID != boots[first], "%s's turn ended without its upgrade: %s on %q", first, m.Status.Phase, m.Status.Version)
	machineExec(t, l, first, "systemctl", "stop", "etcd.service")
	stopped := time.Now()
	t.Logf("%s committed %s; its etcd stopped as %s was granted its turn", first, ver, second)

	// The second leader waits, says why, and nobody else goes down.
	var waiting string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, n := range leaders {
			if n != first && l.Machine(n).Status.Observed.BootID != boots[n] {
				return poll.Error(fmt.Errorf("%s booted again while %s's etcd member was stopped: the datastore lost its majority", n, first))
			}
		}
		m := l.Machine(second)
		ready := meta.FindStatusCondition(m.Status.Conditions, likenv1.ConditionReady)
		if ready == nil || !strings.Contains(ready.Message, "waits, because") {
			return poll.Continue("%s: %s: %+v", second, m.Status.Phase, ready)
		}
		waiting = ready.Message
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(time.Second))
	t.Logf("%s, %s after %s's etcd stopped: %q", second, time.Since(stopped).Round(time.Second), first, waiting)
	assert.Check(t, strings.Contains(waiting, urls[first]), "%s's message does not name %s's member (%s), which is down: %q", second, first, urls[first], waiting)
	// It keeps waiting: for ten seconds (five of its SafeToStop checks,
	// asked every 2 s) nothing else boots again.
	hold := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, n := range leaders {
			if n != first && l.Machine(n).Status.Observed.BootID != boots[n] {
				return poll.Error(fmt.Errorf("%s booted again while %s's etcd member was stopped: the datastore lost its majority", n, first))
			}
		}
		if time.Since(hold) < 10*time.Second {
			return poll.Continue("watching the leaders' boots")
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(2*time.Second))

	// The member is back: the upgrade goes on and ends with the same
	// datastore.
	machineExec(t, l, first, "systemctl", "start", "etcd.service")
	back := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ms, err := l.Liken.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
		if err != nil {
			return poll.Continue("the Machines: %v", err)
		}
		for _, m := range ms.Items {
			if m.Status.Version != ver || m.Status.Phase != likenv1.MachineReady {
				return poll.Continue("%s: %s on %q", m.Name, m.Status.Phase, m.Status.Version)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("the fleet on %s %s after %s's etcd started again", ver, time.Since(back).Round(time.Second), first)
	after := userlab.WaitDatastore(t, etcd, urls, 2*time.Minute)
	assert.DeepEqual(t, after, ids)
}

// reinstalledLeaderAlone powers the three leaders off, installs the first
// again (liken install of the lab's first release and layer on a new
// disk) and powers it on alone: it hears no other leader and holds no
// member data, so it must not start a datastore of its own, which its API
// server would serve at the endpoint with no pods, no Machines and no
// Nodes. Its etcd stays down, saying why in its journal, well past the
// silence after which a first leader bootstraps a new fleet. Once the two
// others are back with the datastore, it replaces its old member with a
// new one and the fleet is whole again, the two others' members kept.
func reinstalledLeaderAlone(t *testing.T, l *userlab.Lab) {
	ctx := t.Context()
	etcd, urls := l.Datastore(t)
	leaders := slices.Sorted(maps.Keys(urls))
	first, others := leaders[0], leaders[1:]
	before := userlab.WaitDatastore(t, etcd, urls, 2*time.Minute)
	node, err := l.Kube.CoreV1().Nodes().Get(ctx, first, metav1.GetOptions{})
	assert.NilError(t, err)
	for _, n := range append(others, first) {
		l.Run("lab", "power", "off", n, "--name", l.Name)
	}
	info, err := l.St.Machine(first)
	assert.NilError(t, err)
	// Power off returned: none of the machine's processes is left to
	// write to the disk removed below.
	procs, err := clilab.NSMachine(&l.St, info).CgroupProcs()
	assert.NilError(t, err)
	assert.Check(t, is.Len(procs, 0), "%s's processes are still in its cgroup after liken lab power off", first)
	versions, err := os.ReadDir(l.St.ChannelDir)
	assert.NilError(t, err)
	var oldest string
	for _, v := range versions {
		if v.IsDir() && (oldest == "" || v.Name() < oldest) {
			oldest = v.Name()
		}
	}
	disk := filepath.Join(info.Dir, "disk")
	assert.NilError(t, os.RemoveAll(disk))
	_, err = install.Install(ctx, install.Options{Folder: disk, Release: filepath.Join(l.St.ChannelDir, oldest),
		Layer: filepath.Join(l.St.Dir, "layer.tgz"), Machine: first, TempDir: t.TempDir()})
	assert.NilError(t, err)
	l.Run("lab", "power", "on", first, "--name", l.Name)
	on := time.Now()

	// Alone, it waits, and says why; its etcd never answers, well past the
	// bootstrap wait counted from the moment it was first seen waiting.
	var journal string
	var waiting time.Time
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := etcd.MemberList(ctx, urls[first]); err == nil {
			return poll.Error(fmt.Errorf("%s, installed again and alone, runs an etcd member: a second datastore", first))
		}
		out, err := machineOutput(t, l, first, "journalctl", "-b", "-u", "etcd.service", "--no-pager", "-o", "cat")
		if err != nil || !strings.Contains(out, "did not say it holds no member data") {
			return poll.Continue("%s's etcd journal: %v %s", first, err, out[max(0, len(out)-300):])
		}
		journal = out
		if waiting.IsZero() {
			waiting = time.Now()
		}
		if time.Since(waiting) < nodecp.DefaultBootstrapWait+10*time.Second {
			return poll.Continue("watching %s's etcd past the first leader's bootstrap wait", first)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(2*time.Second))
	lines := strings.Split(strings.TrimSpace(journal), "\n")
	t.Logf("%s installed again, alone for %s: its etcd waits: %s", first, time.Since(on).Round(time.Second), lines[len(lines)-1])

	// The others are back: it joins as a new member of the same datastore.
	for _, n := range others {
		l.Run("lab", "power", "on", n, "--name", l.Name)
	}
	back := time.Now()
	after := userlab.WaitDatastore(t, etcd, urls, 10*time.Minute)
	t.Logf("the datastore whole again %s after the other leaders' power on: %v (before: %v)", time.Since(back).Round(time.Second), after, before)
	for _, n := range others {
		assert.Check(t, after[n] == before[n], "%s's member changed: %x, was %x", n, after[n], before[n])
	}
	assert.Check(t, after[first] != before[first], "%s, installed again, kept its old member %x", first, before[first])
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ns, err := l.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return poll.Continue("the Nodes: %v", err)
		}
		for _, n := range ns.Items {
			switch {
			case n.Name == first && n.Status.NodeInfo.BootID == node.Status.NodeInfo.BootID:
				return poll.Continue("Node %s still shows its boot before the new install", n.Name)
			case !userlab.NodeReady(&n):
				return poll.Continue("Node %s is not Ready", n.Name)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("%s's Node Ready from its new install, and every other Node Ready, %s after the other leaders' power on", first, time.Since(back).Round(time.Second))
}

// machineExec runs a command inside the lab machine called name (all its
// namespaces, as its PID 1 sees the world) and fails the test if it fails.
func machineExec(t *testing.T, l *userlab.Lab, name string, args ...string) {
	t.Helper()
	out, err := machineOutput(t, l, name, args...)
	assert.NilError(t, err, "in %s: %s:\n%s", name, strings.Join(args, " "), out)
}

// machineOutput runs a command inside the lab machine called name and
// returns its output.
func machineOutput(t *testing.T, l *userlab.Lab, name string, args ...string) (string, error) {
	t.Helper()
	m, err := l.St.Machine(name)
	if err != nil {
		return "", err
	}
	pid, err := os.ReadFile(filepath.Join(m.Dir, "disk", "run", "pid"))
	if err != nil {
		return "", fmt.Errorf("%s's PID 1: %w", name, err)
	}
	out, err := exec.CommandContext(t.Context(), "nsenter", append([]string{"-t", strings.TrimSpace(string(pid)), "-a", "-r", "-w"}, args...)...).CombinedOutput()
	return string(out), err
}
