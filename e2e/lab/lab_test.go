package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/e2e/internal/fleetsim"
	"liken.sh/liken/generated/clientset/versioned"
)

// commandTimeout bounds every liken and kubectl command a test runs.
const commandTimeout = 3 * time.Minute

// minTimeLeft is the least time before go test's deadline in which a lab
// scenario may start.
const minTimeLeft = 6 * time.Minute

// startupGraceEnv sets the startup grace of a lab's cluster-operator
// copies (read by liken lab up).
const startupGraceEnv = "LIKEN_LAB_STARTUP_GRACE"

// testGrace is the startup grace of cluster-operator in the labs of the
// scenarios that do not keep its real default: each scenario runs a new
// lab, and 40 s of waiting for the first grant in each adds up.
const testGrace = 5 * time.Second

// testSettle is how long a machine settles after its turn in the labs of
// the scenarios, all but the guide's (spec.disruption.settle).
const testSettle = time.Second

// labStatus is the JSON of `liken lab status -o json`.
type labStatus struct {
	Name       string `json:"name"`
	Dir        string `json:"dir"`
	Kubeconfig string `json:"kubeconfig"`
	Channel    string `json:"channel"`
	ChannelDir string `json:"channelDir"`
	Processes  []struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		PID  int    `json:"pid"`
		Log  string `json:"log"`
	} `json:"processes"`
	Machines []struct {
		Name       string `json:"name"`
		Role       string `json:"role"`
		Kubeconfig string `json:"kubeconfig"`
		Dir        string `json:"dir"`
	} `json:"machines"`
}

// lab is one `liken lab` fleet, driven through the liken binary and
// kubectl, watched from its start to its end.
type lab struct {
	t      *testing.T
	name   string
	bin    string
	env    []string
	st     labStatus
	client versioned.Interface
	kube   kubernetes.Interface
	w      *watcher
	disk   *diskChecker
	// up is when liken lab up returned.
	up time.Time
}

// labOptions are the flags and environment of liken lab up.
type labOptions struct {
	// policy is --reboot-policy; empty keeps the default (Manual).
	policy string
	// env is added to the environment of every liken command.
	env []string
	// userDefaults keeps cluster-operator's default startup grace (40 s)
	// and the settle liken lab up writes (5 s), as a user's lab has them;
	// otherwise the operator's copies run with testGrace and the Cluster
	// settles for testSettle.
	userDefaults bool
}

// startLab runs liken lab up and starts the watcher. liken lab down runs
// when the test ends, after the watcher's last check and, on failure, a
// dump of the lab's state and logs.
func startLab(t *testing.T, name string, o labOptions) *lab {
	t.Helper()
	// go test panics at its -timeout without running cleanups, which would
	// leave the lab's processes running: refuse to start a lab that might
	// not be brought down.
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < minTimeLeft {
		t.Fatalf("only %s left before go test's -timeout; a lab scenario needs up to %s: run these tests with -timeout 30m (as make test does)",
			time.Until(deadline).Round(time.Second), minTimeLeft)
	}
	bin := fleetsim.BinDir(t, "liken", "liken-node", "cluster-operator", "kube", "kubectl")
	l := &lab{t: t, name: name, bin: bin}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, startupGraceEnv+"=") {
			l.env = append(l.env, kv)
		}
	}
	l.env = append(l.env, "LIKEN_LAB_HOME="+t.TempDir(), "LIKEN_BIN="+bin)
	if !o.userDefaults {
		l.env = append(l.env, startupGraceEnv+"="+testGrace.String())
	}
	l.env = append(l.env, o.env...)
	start := time.Now()
	t.Cleanup(func() {
		ran := time.Since(start)
		downAt := time.Now()
		l.down()
		if l.up.IsZero() {
			return
		}
		up := l.up.Sub(start)
		t.Logf("durations of %s: lab up %s, scenario %s, lab down %s", name, up.Round(100*time.Millisecond),
			(ran - up).Round(100*time.Millisecond), time.Since(downAt).Round(100*time.Millisecond))
	})
	t.Cleanup(func() {
		if l.w != nil {
			if !t.Failed() {
				l.w.settle(t)
				t.Logf("watcher: re-hashed %d slot stages on the machines' disks as they were reported", l.disk.stop())
				l.w.assertNoViolations(t)
			} else {
				// Show what broke, from what was delivered, without
				// waiting on an API server that may be the problem.
				l.disk.stop()
				l.w.evaluateDelivered()
			}
			l.w.stop()
		}
		if t.Failed() {
			l.dump()
		}
	})

	args := []string{"lab", "up", "--name", name}
	if o.policy != "" {
		args = append(args, "--reboot-policy", o.policy)
	}
	out := l.mustLiken(args...)
	l.up = time.Now()
	m := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']+)'$`).FindStringSubmatch(out)
	assert.Assert(t, m != nil, "liken lab up printed no export KUBECONFIG= line:\n%s", out)

	assert.NilError(t, json.Unmarshal([]byte(l.mustLiken("lab", "status", "--name", name, "-o", "json")), &l.st))
	assert.Equal(t, l.st.Kubeconfig, m[1], "lab status and lab up name different kubeconfigs")
	l.checkStatus(o.userDefaults)
	cfg, err := clientcmd.BuildConfigFromFlags("", l.st.Kubeconfig)
	assert.NilError(t, err)
	l.client, err = versioned.NewForConfig(cfg)
	assert.NilError(t, err)
	l.kube, err = kubernetes.NewForConfig(cfg)
	assert.NilError(t, err)
	t.Logf("lab %s up in %s", name, l.up.Sub(start).Round(100*time.Millisecond))
	if !o.userDefaults {
		l.mustKubectl("patch", "cluster", name, "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"disruption":{"settle":%q}}}`, testSettle))
	}

	disk := newDiskChecker(l)
	l.w = startWatcher(t, l.client, l.kube, name, disk.enqueue)
	l.disk = disk
	disk.start(l.w)
	return l
}

// startWithBadTarget starts an Auto lab, publishes a release with fault
// (see liken lab publish --fault), catalogs it and points spec.version at
// it. It returns the lab, the release the fleet ran before, the bad
// release, and the revision of the Cluster that set the target.
func startWithBadTarget(t *testing.T, name, fault string) (*lab, string, likenv1.CatalogEntry, int64) {
	t.Helper()
	l := startLab(t, name, labOptions{policy: "Auto"})
	good := l.cluster().Spec.Version
	bad := l.publish(fault)
	from := l.setVersion(bad.Version, bad)
	return l, good, bad, from
}

// checkStatus checks what liken lab status -o json must say: the admin
// kubeconfig, the channel URL, every process with its kind, name and pid,
// and every machine with its own kubeconfig. Each cluster-operator process
// runs with the startup grace the scenario asked for.
func (l *lab) checkStatus(userDefaults bool) {
	t := l.t
	t.Helper()
	st := l.st
	for _, p := range st.Processes {
		if p.Kind != "operator" {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
		assert.NilError(t, err, "operator %s", p.Name)
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		want := []string{"--startup-grace=" + testGrace.String()}
		if userDefaults {
			want = nil
		}
		var got []string
		for _, a := range args {
			if strings.HasPrefix(a, "--startup-grace") {
				got = append(got, a)
			}
		}
		assert.DeepEqual(t, got, want)
	}
	assert.Assert(t, strings.HasPrefix(st.Channel, "http://") || strings.HasPrefix(st.Channel, "https://"), "channel %q", st.Channel)
	_, err := os.Stat(st.Kubeconfig)
	assert.NilError(t, err)
	kinds := map[string]int{}
	for _, p := range st.Processes {
		assert.Assert(t, p.Kind != "" && p.Name != "" && p.PID > 0, "process %+v", p)
		kinds[p.Kind]++
	}
	assert.Equal(t, kinds["operator"], 2, "processes by kind: %v", kinds)
	assert.Equal(t, kinds["machine"], 5, "processes by kind: %v", kinds)
	for _, k := range []string{"etcd", "kube-apiserver"} {
		assert.Equal(t, kinds[k], 1, "processes by kind: %v", kinds)
	}
	assert.Equal(t, len(st.Machines), 5)
	for _, m := range st.Machines {
		_, err := os.Stat(m.Kubeconfig)
		assert.NilError(t, err, "machine %s", m.Name)
	}
}

func (l *lab) down() {
	out, err := l.liken("lab", "down", "--name", l.name)
	if err != nil && !strings.Contains(out, "there is no lab") {
		l.t.Errorf("liken lab down --name %s: %v\n%s", l.name, err, out)
	}
}

// run runs a command with the lab's environment and returns its stdout
// and, on failure, an error that holds its stderr.
func (l *lab) run(env []string, name string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append([]string(nil), l.env...), env...)
	// A killed command whose children still hold its output ends anyway.
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w\nstderr:\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), stderr.String(), err
}

// liken runs the liken binary; out is stdout and stderr together.
func (l *lab) liken(args ...string) (string, error) {
	stdout, stderr, err := l.run(l.kubeconfigEnv(), filepath.Join(l.bin, "liken"), args...)
	return stdout + stderr, err
}

// mustLiken runs liken and returns its stdout; it fails the test if liken
// fails.
func (l *lab) mustLiken(args ...string) string {
	l.t.Helper()
	stdout, _, err := l.run(l.kubeconfigEnv(), filepath.Join(l.bin, "liken"), args...)
	assert.NilError(l.t, err)
	return stdout
}

// kubectl runs kubectl as the lab's admin.
func (l *lab) kubectl(args ...string) (string, string, error) {
	return l.run(l.kubeconfigEnv(), filepath.Join(l.bin, "kubectl"), args...)
}

func (l *lab) mustKubectl(args ...string) string {
	l.t.Helper()
	out, _, err := l.kubectl(args...)
	assert.NilError(l.t, err)
	return out
}

func (l *lab) kubeconfigEnv() []string {
	if l.st.Kubeconfig == "" {
		return nil
	}
	return []string{"KUBECONFIG=" + l.st.Kubeconfig}
}

// edit runs kubectl edit on the lab's Cluster with this test binary as the
// editor, which carries out plan.
func (l *lab) edit(plan editPlan) editResult {
	l.t.Helper()
	plan.Dir = l.t.TempDir()
	b, err := json.Marshal(plan)
	assert.NilError(l.t, err)
	self, err := os.Executable()
	assert.NilError(l.t, err)
	var r editResult
	r.stdout, r.stderr, r.err = l.run(append(l.kubeconfigEnv(), "KUBE_EDITOR="+self, editPlanEnv+"="+string(b)), filepath.Join(l.bin, "kubectl"), "edit", "cluster", l.name)
	for i := 1; ; i++ {
		buf, err := os.ReadFile(filepath.Join(plan.Dir, fmt.Sprintf("buffer-%d.yaml", i)))
		if err != nil {
			break
		}
		r.buffers = append(r.buffers, string(buf))
	}
	return r
}

// publish runs liken lab publish and checks the catalog entry it prints
// against the channel: the digest is the SHA-256 of the release document
// the channel serves.
func (l *lab) publish(fault string) likenv1.CatalogEntry {
	l.t.Helper()
	args := []string{"lab", "publish", "--name", l.name}
	if fault != "" {
		args = append(args, "--fault", fault)
	}
	out := l.mustLiken(args...)
	var entries []likenv1.CatalogEntry
	assert.NilError(l.t, yaml.UnmarshalStrict([]byte(out), &entries), "liken lab publish printed:\n%s", out)
	assert.Equal(l.t, len(entries), 1, "liken lab publish printed:\n%s", out)
	e := entries[0]
	doc, err := os.ReadFile(filepath.Join(l.st.ChannelDir, e.Version, "release.yaml"))
	assert.NilError(l.t, err)
	assert.Equal(l.t, e.Digest, digestOf(doc), "the printed digest is not the SHA-256 of the channel's release.yaml")
	if fault == "corrupt" {
		l.w.markCorrupt(e.Version)
	}
	l.t.Logf("published %s (%s) %s", e.Version, faultName(fault), e.Digest)
	return e
}

func faultName(f string) string {
	if f == "" {
		return "good"
	}
	return "fault " + f
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// setVersion catalogs entries and sets spec.version with one kubectl
// patch, and returns the revision of the Cluster it wrote.
func (l *lab) setVersion(version string, add ...likenv1.CatalogEntry) int64 {
	l.t.Helper()
	catalog := append(l.cluster().Spec.Releases.Catalog, add...)
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{
		"version":  version,
		"releases": map[string]any{"catalog": catalog},
	}})
	assert.NilError(l.t, err)
	out := l.mustKubectl("patch", "cluster", l.name, "--type", "merge", "-p", string(patch), "-o", "json")
	var c likenv1.Cluster
	assert.NilError(l.t, json.Unmarshal([]byte(out), &c))
	assert.Equal(l.t, c.Spec.Version, version)
	l.t.Logf("spec.version set to %s (Cluster revision %s)", version, c.ResourceVersion)
	return rvOf(&c)
}

func (l *lab) cluster() *likenv1.Cluster {
	l.t.Helper()
	c, err := l.client.LikenV1alpha1().Clusters().Get(context.Background(), l.name, metav1.GetOptions{})
	assert.NilError(l.t, err)
	return c
}

func (l *lab) machine(name string) *likenv1.Machine {
	l.t.Helper()
	m, err := l.client.LikenV1alpha1().Machines().Get(context.Background(), name, metav1.GetOptions{})
	assert.NilError(l.t, err)
	return m
}

func (l *lab) machines() []likenv1.Machine {
	l.t.Helper()
	ms, err := l.client.LikenV1alpha1().Machines().List(context.Background(), metav1.ListOptions{})
	assert.NilError(l.t, err)
	var out []likenv1.Machine
	for _, m := range ms.Items {
		if m.Spec.Cluster == l.name {
			out = append(out, m)
		}
	}
	assert.Assert(l.t, len(out) > 0, "cluster %s has no machines", l.name)
	return out
}

func (l *lab) nodeReady(name string) bool {
	l.t.Helper()
	n, err := l.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	assert.NilError(l.t, err)
	return isNodeReady(n)
}

func isNodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// condition returns a condition of a Machine or Cluster, or an empty one.
func condition(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{Type: typ}
}

// waitFor polls check until it returns true, for at most timeout, and
// logs how long it took.
func (l *lab) waitFor(what string, timeout time.Duration, check func() (bool, string)) time.Duration {
	l.t.Helper()
	start := time.Now()
	poll.WaitOn(l.t, func(poll.LogT) poll.Result {
		ok, state := check()
		if ok {
			return poll.Success()
		}
		return poll.Continue("waiting for %s; last seen: %s", what, state)
	}, poll.WithTimeout(timeout), poll.WithDelay(500*time.Millisecond))
	took := time.Since(start)
	l.t.Logf("%s: after %s", what, took.Round(100*time.Millisecond))
	return took
}

// table parses kubectl's table output into rows of column name to value.
// Columns start where their header starts; an empty last column is "".
func table(out string) []map[string]string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 {
		return nil
	}
	header := lines[0]
	type col struct {
		name  string
		start int
	}
	var cols []col
	for _, m := range regexp.MustCompile(`\S+`).FindAllStringIndex(header, -1) {
		cols = append(cols, col{name: header[m[0]:m[1]], start: m[0]})
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, c := range cols {
			end := len(line)
			if i+1 < len(cols) && cols[i+1].start < end {
				end = cols[i+1].start
			}
			if c.start < end {
				row[c.name] = strings.TrimSpace(line[c.start:end])
			} else {
				row[c.name] = ""
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// row is the table row whose NAME is name, or nil.
func row(out, name string) map[string]string {
	for _, r := range table(out) {
		if r["NAME"] == name {
			return r
		}
	}
	return nil
}

// machineLog is the firmware's and node daemon's log of a machine.
func (l *lab) machineLog(name string) string {
	l.t.Helper()
	for _, p := range l.st.Processes {
		if p.Kind == "machine" && p.Name == name {
			b, err := os.ReadFile(p.Log)
			assert.NilError(l.t, err)
			return string(b)
		}
	}
	l.t.Fatalf("lab %s has no machine %s", l.name, name)
	return ""
}

// machineDir is the folder of a simulated machine.
func (l *lab) machineDir(name string) string {
	for _, m := range l.st.Machines {
		if m.Name == name {
			return m.Dir
		}
	}
	l.t.Fatalf("lab %s has no machine %s", l.name, name)
	return ""
}

// firmwareLines are the firmware's lines of a machine's log that contain s.
func (l *lab) firmwareLines(name, s string) []string {
	var out []string
	for _, line := range strings.Split(l.machineLog(name), "\n") {
		if strings.Contains(line, "firmware "+name+":") && strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// checkBootedAndStaged proves, from the machines' disks and logs, that
// nothing unverified was ever bootable: every slot the Machine reports
// Active, Staged or Previous holds a release document whose digest the
// catalog pins and files that match it byte for byte, and every release
// the firmware booted is catalogued and not a corrupt one.
func (l *lab) checkBootedAndStaged() {
	l.t.Helper()
	catalog, corrupt := l.w.trusted()
	upLine := regexp.MustCompile(`firmware \S+: release (\S+) up`)
	for _, m := range l.machines() {
		for _, s := range m.Status.Slots {
			switch s.State {
			case likenv1.SlotActive, likenv1.SlotStaged, likenv1.SlotPrevious:
			default:
				continue
			}
			assert.Assert(l.t, !corrupt[s.Version], "machine %s slot %s holds corrupt release %s as %s", m.Name, s.Name, s.Version, s.State)
			dir := filepath.Join(l.machineDir(m.Name), "disk", "slots", s.Name)
			assert.NilError(l.t, verifySlotOnDisk(dir, s.Version, catalog[s.Version]), "machine %s slot %s (%s %s)", m.Name, s.Name, s.State, s.Version)
		}
		for _, mm := range upLine.FindAllStringSubmatch(l.machineLog(m.Name), -1) {
			v := mm[1]
			assert.Assert(l.t, catalog[v] != "" && !corrupt[v], "machine %s booted release %s, which is not a verified catalogued release", m.Name, v)
		}
	}
}

// hashPath returns the SHA-256 (hex) and size of the file at path.
func hashPath(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// dump prints what a person needs to see why a scenario failed: the
// fleet as kubectl shows it, what the watcher recorded, and the tails of
// the operators' and machines' logs.
func (l *lab) dump() {
	t := l.t
	if l.st.Kubeconfig == "" {
		// lab up failed: its state still names the logs.
		out, _, err := l.run(nil, filepath.Join(l.bin, "liken"), "lab", "status", "--name", l.name, "-o", "json")
		if err != nil || json.Unmarshal([]byte(out), &l.st) != nil {
			t.Logf("liken lab status --name %s: %v\n%s", l.name, err, out)
			return
		}
	}
	for _, args := range [][]string{
		{"get", "clusters", "-o", "wide"},
		{"get", "machines", "-o", "wide"},
		{"get", "nodes"},
		{"get", "cluster", l.name, "-o", "yaml"},
	} {
		out, _, err := l.kubectl(args...)
		t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
	}
	if l.w != nil {
		t.Logf("watcher:\n%s", l.w.summary())
	}
	for _, p := range l.st.Processes {
		if p.Kind == "operator" || p.Kind == "machine" {
			t.Logf("tail of %s %s (%s):\n%s", p.Kind, p.Name, p.Log, tail(p.Log, 40))
		}
	}
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
