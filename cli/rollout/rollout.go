// Package rollout holds liken rollout: follow a rollout until it is done (status) and lift a halted one (resume).
package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
	"liken.sh/liken/cli/internal/fleet"
	"liken.sh/liken/cli/internal/printable"
	"liken.sh/liken/cli/kube"
	"liken.sh/liken/generated/clientset/versioned"
	"liken.sh/liken/generated/informers/externalversions"
	"liken.sh/liken/generated/informers/externalversions/internalinterfaces"
	"liken.sh/liken/internal/rules"
)

// NewCommand returns liken rollout and its subcommands.
func NewCommand(flags *kube.Flags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Follow a rollout, resume a halted one, or hold one",
		Long: `Follow the rollout of a cluster's release, machine by machine; resume a
rollout that cluster-operator halted because a turn stalled or a trial
failed; or hold the turns of a cluster until you lift the hold.`,
		Example: `  # Follow the rollout of mycluster until every machine runs spec.version
  liken rollout status mycluster

  # Lift a halt after you examined the machine that stalled or failed
  liken rollout resume mycluster

  # Stop new turns during a freeze, then let them start again
  liken rollout hold mycluster --reason "change freeze"
  liken rollout unhold mycluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newStatusCommand(flags), newResumeCommand(flags), newHoldCommand(flags), newUnholdCommand(flags))
	return cmd
}

func newStatusCommand(flags *kube.Flags) *cobra.Command {
	opts := StatusOptions{Watch: true}
	cmd := &cobra.Command{
		Use:   "status [CLUSTER]",
		Short: "Follow a rollout until every machine runs the cluster's version",
		Long: `Follow the rollout of a cluster until every machine is Ready on the
cluster's spec.version. Each change of a machine's step (Downloading,
UpdatePending, Updating, Ready, ...) or version prints one line, with the
progress of the whole cluster (machines ready out of all); a machine that
downloads a release prints a line for each tenth of it, with the bytes it
has out of the release's size. A staged machine's line says what it waits for: a person's
approval (with the command to run), or a turn. Why machines wait for a
turn is cluster-operator's to say: each time its word changes, the command
prints it (the Cluster's Progressing message: who holds a turn, who is
down, and whom the others wait for, such as a leader that waits for its
own approval). When the cluster declares maintenance windows, it says
whether one is open and, when none is, when the next opens: machines
download and stage at any time, but their turns wait for a window.

The command exits 0 when the rollout is complete, and non-zero when
cluster-operator halts it (RolloutStalled: a machine did not come back from
its turn; TrialFailed: a machine could not prove the release;
K3sRestartFailed: a machine's node did not come back after k3s restarted
with a new settings.k3sArgs value) or when
--timeout passes. CLUSTER may be left out when there is only one Cluster.`,
		Example: `  # Follow the rollout of mycluster
  liken rollout status mycluster

  # Give up after 30 minutes
  liken rollout status mycluster --timeout 30m

  # Print where the rollout stands, without following it
  liken rollout status mycluster --watch=false`,
		Args:              cmdutil.MaxArgs("CLUSTER"),
		ValidArgsFunction: flags.CompleteClusters(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				opts.Cluster = args[0]
			}
			return Status(cmd.Context(), c, opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVarP(&opts.Watch, "watch", "w", true, "Follow the rollout until it is done; with --watch=false, print where it stands and exit.")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 0, "How long to wait before giving up (such as 30m); 0 waits forever.")
	return cmd
}

func newResumeCommand(flags *kube.Flags) *cobra.Command {
	return &cobra.Command{
		Use:   "resume CLUSTER",
		Short: "Resume a halted rollout (a stall, or a failed trial, canary or k3s restart)",
		Long: `Resume a rollout that cluster-operator halted, once you have examined the
machine named in the halt.

RolloutStalled: a machine held its turn past the stall timeout, or came
back but did not settle within it. Resuming releases that machine's turn,
or stops waiting for it to settle, so the budget frees up; the machine asks
again when it comes back.

TrialFailed: a machine could not prove the release and went back to its
proven slot. Resuming lets machines try the same release again, that one
included; if another trial fails, the rollout halts again. To stop the
release instead, set spec.version back (that also lifts the halt).

CanaryFailed: the first machine of the rollout turned unhealthy on the new
release during its canary time (spec.disruption.canary). Resuming counts
the canary as passed: the other machines follow without a new canary. To
stop the release instead, set spec.version back.

K3sRestartFailed: a machine's node was not Ready again within the trial
timeout after k3s restarted with a new value of settings.k3sArgs, and the
machine restarted k3s with the value it ran before. Resuming lets machines try the same value again, that one
included; if another restart fails, the rollout halts again. To stop the
value instead, correct it (that also lifts the halt).`,
		Example: `  # Resume the rollout of mycluster
  liken rollout resume mycluster`,
		Args:              cmdutil.ExactArgs("CLUSTER"),
		ValidArgsFunction: flags.CompleteClusters(false),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := flags.Client()
			if err != nil {
				return err
			}
			return Resume(cmd.Context(), c, clock.RealClock{}, args[0], cmd.OutOrStdout())
		},
	}
}

// StatusOptions tune Status.
type StatusOptions struct {
	// Cluster to follow; empty picks the only Cluster.
	Cluster string
	// Watch follows the rollout until it is done or halted.
	Watch bool
	// Timeout bounds the wait; 0 waits forever.
	Timeout time.Duration
	// Clock reads the maintenance windows; nil is the real clock.
	Clock clock.PassiveClock
}

// HaltedError is returned when cluster-operator halted the rollout.
type HaltedError struct {
	// Cluster is the halted cluster.
	Cluster string
	// Reason is RolloutStalled, TrialFailed or K3sRestartFailed.
	Reason string
	// Machine is the machine the halt names.
	Machine string
	// Message is cluster-operator's message.
	Message string
}

func (e *HaltedError) Error() string {
	var next string
	switch e.Reason {
	case v1alpha1.ReasonRolloutStalled:
		next = fmt.Sprintf("examine %s (kubectl describe machine %s), then liken rollout resume %s", e.Machine, e.Machine, e.Cluster)
	case v1alpha1.ReasonTrialFailed:
		next = fmt.Sprintf("find why %s failed its trial (kubectl describe machine %s); set spec.version back, or after a fix run liken rollout resume %s", e.Machine, e.Machine, e.Cluster)
	case v1alpha1.ReasonK3sRestartFailed:
		next = fmt.Sprintf("find why the node of %s was not Ready after k3s restarted (kubectl describe machine %s, and the kubelet's log on it); correct settings.k3sArgs, or after a fix run liken rollout resume %s", e.Machine, e.Machine, e.Cluster)
	default:
		next = "kubectl describe cluster " + e.Cluster
	}
	msg := printable.Text(strings.TrimSpace(e.Message))
	if msg != "" {
		msg = ": " + msg
	}
	return fmt.Sprintf("the rollout of cluster %s is halted (%s on %s)%s\nNext: %s", e.Cluster, printable.Text(e.Reason), e.Machine, msg, next)
}

// Status follows the rollout of a cluster (see the status command).
func Status(ctx context.Context, c versioned.Interface, opts StatusOptions, out io.Writer) error {
	name, err := pickCluster(ctx, c, opts.Cluster)
	if err != nil {
		return err
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	t := newTracker(out, clk)
	if !opts.Watch {
		cl, err := c.LikenV1alpha1().Clusters().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return kube.Explain(err, "cluster "+name)
		}
		list, err := c.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{})
		if err != nil {
			return kube.Explain(err, "machines")
		}
		var all []*v1alpha1.Machine
		for i := range list.Items {
			all = append(all, &list.Items[i])
		}
		_, err = t.observe(cl, fleet.Members(name, all))
		return err
	}

	// Fail fast on what a watch would only retry: a missing cluster, no
	// access.
	if _, err := c.LikenV1alpha1().Clusters().Get(ctx, name, metav1.GetOptions{}); err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	if _, err := c.LikenV1alpha1().Machines().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return kube.Explain(err, "machines")
	}

	notify := make(chan struct{}, 1)
	poke := func() {
		select {
		case notify <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	clusterFactory := externalversions.NewSharedInformerFactoryWithOptions(c, 0,
		externalversions.WithTweakListOptions(internalinterfaces.TweakListOptionsFunc(func(o *metav1.ListOptions) {
			o.FieldSelector = "metadata.name=" + name
		})))
	machineFactory := externalversions.NewSharedInformerFactory(c, 0)
	clusters := clusterFactory.Liken().V1alpha1().Clusters()
	machines := machineFactory.Liken().V1alpha1().Machines()
	if _, err := clusters.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := machines.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	stop := make(chan struct{})
	defer func() {
		close(stop)
		clusterFactory.Shutdown()
		machineFactory.Shutdown()
	}()
	clusterFactory.Start(stop)
	machineFactory.Start(stop)
	for typ, ok := range clusterFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return waitError(ctx, name, t, fmt.Errorf("could not list %v", typ))
		}
	}
	for typ, ok := range machineFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return waitError(ctx, name, t, fmt.Errorf("could not list %v", typ))
		}
	}
	poke()
	for {
		select {
		case <-ctx.Done():
			return waitError(ctx, name, t, nil)
		case <-notify:
		}
		cl, err := clusters.Lister().Get(name)
		if apierrors.IsNotFound(err) {
			if t.cluster == nil {
				return fmt.Errorf("cluster %s not found (kubectl get clusters lists them)", name)
			}
			return fmt.Errorf("cluster %s was deleted during the rollout", name)
		}
		if err != nil {
			return err
		}
		all, err := machines.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		done, err := t.observe(cl, fleet.Members(name, all))
		if err != nil || done {
			return err
		}
	}
}

func waitError(ctx context.Context, name string, t *tracker, err error) error {
	where := ""
	if t.cluster != nil {
		where = fmt.Sprintf(" (%d/%d machines ready on %s)", t.ready, t.total, t.cluster.Spec.Version)
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("timed out waiting for the rollout of cluster %s%s; kubectl get machines shows each machine's step", name, where)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("watching cluster %s: %w", name, err)
}

// pickCluster returns name, or the only Cluster when name is empty.
func pickCluster(ctx context.Context, c versioned.Interface, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	list, err := c.LikenV1alpha1().Clusters().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", kube.Explain(err, "clusters")
	}
	switch len(list.Items) {
	case 0:
		return "", errors.New("there is no Cluster to follow: create one with kubectl apply -f cluster.yaml")
	case 1:
		return list.Items[0].Name, nil
	}
	var names []string
	for _, cl := range list.Items {
		names = append(names, cl.Name)
	}
	sort.Strings(names)
	return "", fmt.Errorf("there are %d Clusters (%s): name the one to follow, such as liken rollout status %s", len(names), strings.Join(names, ", "), names[0])
}

// step is what one line reports about a machine.
type step struct {
	phase   v1alpha1.MachinePhase
	version string
	target  string
	note    string
	// tenths is how much of its download the machine has, in whole tenths
	// of the release's size, so that a download prints a line for each
	// tenth; -1 when it downloads nothing.
	tenths int64
}

// tracker turns successive views of a cluster into lines: one per change
// of a machine's step, and a last line when the rollout is done.
type tracker struct {
	out     io.Writer
	last    map[string]step
	version string
	cluster *v1alpha1.Cluster
	ready   int
	total   int
	// clock reads the maintenance windows; window is the state of the
	// windows last printed.
	clock  clock.PassiveClock
	window string
	// operator is what cluster-operator said last (Progressing's reason
	// and message), as printed.
	operator string
}

func newTracker(out io.Writer, clk clock.PassiveClock) *tracker {
	return &tracker{out: out, last: map[string]step{}, clock: clk}
}

// stepOf is the step of machine m of cluster cl. Why a staged machine
// waits comes from the machine (its conditions, its approval) and from
// cluster-operator (its ledger); what holds back the machines that wait for
// a turn, cluster-operator says in one line for them all (showOperator).
func stepOf(m *v1alpha1.Machine, cl *v1alpha1.Cluster) step {
	s := step{phase: m.Status.Phase, version: m.Status.Version, tenths: -1}
	if d := m.Status.Download; d != nil {
		s.tenths = percent(d) / 10
	}
	switch {
	case m.Status.Download != nil && m.Status.Download.Version != "":
		s.target = m.Status.Download.Version
	case m.Status.Staged != "":
		s.target = m.Status.Staged
	}
	if s.target == s.version {
		s.target = ""
	}
	for _, typ := range []string{v1alpha1.ConditionTrialFailed, v1alpha1.ConditionDrainBlocked} {
		if c := meta.FindStatusCondition(m.Status.Conditions, typ); c != nil && c.Status == metav1.ConditionTrue {
			s.note = typ + ": " + printable.Text(c.Message)
			break
		}
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionConfigApplied); s.note == "" && c != nil && c.Reason == v1alpha1.ReasonK3sRestartFailed {
		s.note = c.Reason + ": " + printable.Text(c.Message)
	}
	staged := m.Status.Phase == v1alpha1.MachineUpdatePending || m.Status.Phase == v1alpha1.MachineRebootPending
	turn := fleet.HoldsTurn(cl, m.Name)
	switch {
	case s.note != "":
	case turn != nil && turn.Reason == v1alpha1.TurnRestartK3s:
		s.note = "restarting k3s in its turn (no reboot)"
	case turn != nil && turn.Reason == v1alpha1.TurnLive:
		s.note = "applying live changes in its turn (no reboot)"
	case !staged && slices.ContainsFunc(cl.Status.Settling, func(x v1alpha1.SettlingMachine) bool { return x.Machine == m.Name }):
		s.note = "back from its turn, settling: the next turn waits for its workloads (see what cluster-operator says)"
	case !staged:
	case turn != nil:
		s.note = "holds its turn: it cordons and drains its node next"
	case m.Status.Phase == v1alpha1.MachineRebootPending && onlyClasses(m.Status.Pending, v1alpha1.ClassRestartK3s):
		s.note = "waits for a turn to restart k3s (no reboot)"
	case m.Status.Phase == v1alpha1.MachineRebootPending && onlyClasses(m.Status.Pending, v1alpha1.ClassLive, v1alpha1.ClassRestartK3s):
		s.note = "waits for a turn to apply live changes (no reboot)"
	case fleet.AwaitingApproval(m) && !rules.Approved(m, m.Status.Change):
		s.note = "awaiting approval: liken approve-reboot " + m.Spec.Cluster + " " + m.Name
	case fleet.AwaitingTurn(m) || rules.Approved(m, m.Status.Change):
		s.note = "waiting for a turn: see what cluster-operator says"
	}
	return s
}

// downloaded says how much of a release a machine has downloaded, such as
// "downloaded 4.0 MiB of 12.0 MiB (33%)".
func downloaded(d *v1alpha1.DownloadProgress) string {
	return fmt.Sprintf("downloaded %s of %s (%d%%)", cmdutil.HumanBytes(d.BytesDone), cmdutil.HumanBytes(d.BytesTotal), percent(d))
}

// percent is the share of the release a download has, 0 to 100.
func percent(d *v1alpha1.DownloadProgress) int64 {
	if d.BytesTotal <= 0 {
		return 0
	}
	return min(d.BytesDone, d.BytesTotal) * 100 / d.BytesTotal
}

// onlyClasses is true when every pending change, at least one, is of one
// of classes.
func onlyClasses(pending []v1alpha1.PendingChange, classes ...v1alpha1.DisruptionClass) bool {
	for _, p := range pending {
		if !slices.Contains(classes, p.Class) {
			return false
		}
	}
	return len(pending) > 0
}

// observe prints what changed since the last view and reports whether the
// rollout is complete; it returns a *HaltedError when cluster-operator
// halted it.
func (t *tracker) observe(cl *v1alpha1.Cluster, members []*v1alpha1.Machine) (bool, error) {
	t.cluster = cl
	want := cl.Spec.Version
	t.total = len(members)
	t.ready = 0
	for _, m := range members {
		if m.Status.Phase == v1alpha1.MachineReady && m.Status.Version == want {
			t.ready++
		}
	}
	progress := fmt.Sprintf("[machines %d/%d]", t.ready, t.total)

	if want != t.version {
		t.version = want
		fmt.Fprintf(t.out, "Rollout of cluster %s to %s: %d of %d machines run it.\n", cl.Name, want, t.ready, t.total)
	}
	width := 0
	for _, m := range members {
		width = max(width, len(m.Name))
	}
	seen := map[string]bool{}
	for _, m := range members {
		seen[m.Name] = true
		s := stepOf(m, cl)
		if prev, ok := t.last[m.Name]; ok && prev == s {
			continue
		}
		t.last[m.Name] = s
		phase := string(s.phase)
		if phase == "" {
			phase = "Unknown"
		}
		ver := s.version
		if ver == "" {
			ver = "-"
		}
		if s.target != "" {
			ver += " -> " + s.target
		}
		line := fmt.Sprintf("%-*s  %-13s  %-32s  %s", width, m.Name, phase, ver, progress)
		if d := m.Status.Download; d != nil {
			line += "  " + downloaded(d)
		}
		if s.note != "" {
			line += "  " + s.note
		}
		fmt.Fprintln(t.out, line)
	}
	var gone []string
	for n := range t.last {
		if !seen[n] {
			gone = append(gone, n)
		}
	}
	sort.Strings(gone)
	for _, n := range gone {
		delete(t.last, n)
		fmt.Fprintf(t.out, "%-*s  %-13s  %-32s  %s\n", width, n, "Deleted", "-", progress)
	}

	current := cl.Status.ObservedGeneration >= cl.Generation
	if h := halt(cl); h != nil && current {
		return false, h
	}
	complete := current && cl.Status.Phase == v1alpha1.ClusterReady && t.total > 0 && t.ready == t.total
	for _, m := range members {
		if m.Status.Change != "" {
			complete = false
		}
	}
	if complete {
		fmt.Fprintf(t.out, "Rollout of cluster %s to %s complete: %d/%d machines ready.\n", cl.Name, want, t.ready, t.total)
		return true, nil
	}
	t.showOperator(cl)
	t.showWindow(cl)
	return false, nil
}

// showOperator prints what cluster-operator says about the cluster's
// turns (its Progressing condition) each time that changes: who holds a
// turn, who waits, and what holds them back. It prints nothing while no
// machine holds or waits for a turn.
func (t *tracker) showOperator(cl *v1alpha1.Cluster) {
	p := fleet.Progressing(cl)
	key := ""
	if p != nil && p.Reason != v1alpha1.ReasonIdle {
		key = p.Reason + "\n" + p.Message
	}
	if key == t.operator {
		return
	}
	t.operator = key
	if key != "" {
		fmt.Fprintf(t.out, "cluster-operator on cluster %s (%s): %s\n", cl.Name, printable.Text(p.Reason), fleet.OperatorSays(cl))
	}
}

// showWindow prints where the cluster stands against its maintenance
// windows, with the rule cluster-operator grants by, each time that
// changes: a window opens or closes, or the windows change.
func (t *tracker) showWindow(cl *v1alpha1.Cluster) {
	w := fleet.WindowOf(cl, t.clock.Now())
	note := w.Note()
	key := fmt.Sprint(w.State.Open, w.State.Opens.Unix(), w.State.Closes.Unix(), note == "")
	if len(w.Errs) > 0 {
		key = note
	}
	if key == t.window {
		return
	}
	t.window = key
	if note != "" {
		fmt.Fprintf(t.out, "Maintenance windows of cluster %s: %s.\n", cl.Name, note)
	}
}

// halt reads a halt from the cluster's status, or returns nil.
func halt(cl *v1alpha1.Cluster) *HaltedError {
	if h := cl.Status.Halt; h != nil && (h.Version == "" || h.Version == cl.Spec.Version) {
		return &HaltedError{Cluster: cl.Name, Reason: h.Reason, Machine: h.Machine, Message: h.Message}
	}
	if p := meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ConditionProgressing); p != nil && p.Status == metav1.ConditionFalse &&
		(p.Reason == v1alpha1.ReasonRolloutStalled || p.Reason == v1alpha1.ReasonTrialFailed || p.Reason == v1alpha1.ReasonCanaryFailed || p.Reason == v1alpha1.ReasonK3sRestartFailed) {
		machine := "a machine"
		if cl.Status.Halt != nil {
			machine = cl.Status.Halt.Machine
		}
		return &HaltedError{Cluster: cl.Name, Reason: p.Reason, Machine: machine, Message: p.Message}
	}
	return nil
}

// Resume sets the cluster's liken.sh/resume-rollout annotation to a new
// value, so cluster-operator lifts the halt. It refuses when the rollout is
// not halted.
func Resume(ctx context.Context, c versioned.Interface, clk clock.PassiveClock, name string, out io.Writer) error {
	cl, err := c.LikenV1alpha1().Clusters().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	h := halt(cl)
	if h == nil {
		state := "no Progressing condition yet"
		if p := meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ConditionProgressing); p != nil {
			state = fmt.Sprintf("Progressing is %s, %s", p.Status, p.Reason)
			if p.Message != "" {
				state += ": " + printable.Text(p.Message)
			}
		}
		return fmt.Errorf("the rollout of cluster %s is not halted (%s): there is nothing to resume", name, state)
	}
	value := clk.Now().UTC().Format(time.RFC3339Nano)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationResumeRollout, value)
	if _, err := c.LikenV1alpha1().Clusters().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "liken"}); err != nil {
		return kube.Explain(err, "cluster "+name)
	}
	fmt.Fprintf(out, "Asked cluster-operator to resume the rollout of cluster %s (halted: %s on %s).\n", name, h.Reason, h.Machine)
	switch h.Reason {
	case v1alpha1.ReasonRolloutStalled:
		if slices.ContainsFunc(cl.Status.Settling, func(s v1alpha1.SettlingMachine) bool { return s.Machine == h.Machine }) {
			fmt.Fprintf(out, "cluster-operator stops waiting for %s to settle; its place under maxUnavailable goes to the next machine.\n", h.Machine)
			break
		}
		fmt.Fprintf(out, "The turn %s held is released; %s asks for a new one when it is back.\n", h.Machine, h.Machine)
	case v1alpha1.ReasonTrialFailed:
		fmt.Fprintf(out, "Machines may now try %s again, %s included, within the disruption budget; if another trial fails, the rollout halts again.\n", cl.Spec.Version, h.Machine)
	case v1alpha1.ReasonCanaryFailed:
		fmt.Fprintf(out, "The canary %s counts as passed: the other machines may now take their turns to %s within the disruption budget, without a new canary.\n", h.Machine, cl.Spec.Version)
	case v1alpha1.ReasonK3sRestartFailed:
		fmt.Fprintf(out, "Machines may now restart k3s with the same value again, %s included, within the disruption budget; if another restart fails, the rollout halts again.\n", h.Machine)
	}
	fmt.Fprintf(out, "Follow it with: liken rollout status %s\n", name)
	return nil
}
