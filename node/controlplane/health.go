package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Health checks this leader's own control plane, the way its trial and its
// RestartK3s turn need it checked: the kubelet reaches the API through the
// Cluster's endpoint, so a Ready Node proves nothing about the leader's own
// member or API server (docs/design/controlplane.md, "Trials and turns on a
// leader").
type Health struct {
	// Machine is this leader's name, its etcd member's name.
	Machine string
	// SetupDir holds the certificates Setup made (SetupDir on a machine).
	SetupDir string
	// Etcd is this leader's etcd member's client URL (LocalEtcd when empty).
	Etcd string
	// APIServer is this leader's API server (LocalAPIServer when empty).
	APIServer string
	// Peers are the other leaders' etcd client URLs. A peer that answers
	// for another datastore at least as large as this leader's means this
	// leader's datastore split off (Check).
	Peers []string
	// Fence, when set, stops this leader's API server once its datastore
	// is found split off (Check), so that clients behind the endpoint
	// reach only the fleet's. liken-node stops kube-apiserver.service.
	Fence func(ctx context.Context) error
	// Timeout bounds each request (2 s when zero).
	Timeout time.Duration
}

// NewHealth is the health check of leader cfg.Machine, its certificates
// in setupDir, asking the other leaders of cfg.
func NewHealth(cfg Config, setupDir string) *Health {
	h := &Health{Machine: cfg.Machine, SetupDir: setupDir}
	for _, l := range cfg.Leaders {
		if l.Name != cfg.Machine {
			h.Peers = append(h.Peers, l.EtcdClient)
		}
	}
	return h
}

// ErrSplit marks the error of a leader whose datastore split off the
// fleet's.
var ErrSplit = errors.New("two datastores")

// errSplitTie marks two datastores of which neither is the fleet's by
// splitFrom's rules: reported, but neither API server is stopped.
var errSplitTie = errors.New("two datastores")

// Check returns nil when this leader's control plane is healthy: its etcd
// member is a voter (a learner does not count for quorum) and healthy, and
// its API server's /readyz answers 200. Otherwise the error says the first
// thing that is not, for the Machine's status and its events.
func (h *Health) Check(ctx context.Context) error {
	timeout := h.timeout()
	etcdURL, apiURL := h.etcdURL(), h.APIServer
	if apiURL == "" {
		apiURL = LocalAPIServer
	}
	etcd, err := h.etcdClient()
	if err != nil {
		return err
	}
	f := files(h.SetupDir)
	cluster, members, err := etcd.ClusterMembers(ctx, etcdURL)
	if err != nil && strings.Contains(err.Error(), errLearner) {
		return errors.New("this leader's etcd member is a learner: liken-control-plane-init promotes it once it has caught up")
	}
	if err != nil {
		return fmt.Errorf("this leader's etcd member does not answer: %w", err)
	}
	var self *Member
	for i := range members {
		if members[i].Name == h.Machine {
			self = &members[i]
		}
	}
	switch {
	case self == nil:
		return fmt.Errorf("this leader is not among the datastore's members yet (%s)", memberNames(members))
	case self.IsLearner:
		return errors.New("this leader's etcd member is a learner: liken-control-plane-init promotes it once it has caught up")
	}
	if _, err := etcd.Health(ctx, etcdURL); err != nil {
		return fmt.Errorf("this leader's etcd member is not healthy: %w", err)
	}
	// Before the API server: a fenced leader's API server is stopped, and
	// the split is what to say.
	if err := h.splitFrom(ctx, etcd, cluster, members); err != nil {
		return err
	}
	caPEM, err := os.ReadFile(f(ServerCA.Cert()))
	if err != nil {
		return fmt.Errorf("the control plane's certificates are not ready: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s holds no PEM certificate", filepath.Join(h.SetupDir, ServerCA.Cert()))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.Proxy = nil
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := strings.TrimSuffix(apiURL, "/") + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("this leader's API server does not answer: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<12))
		return fmt.Errorf("this leader's API server is not ready: %s answered %s: %s", u, resp.Status, failedChecks(body))
	}
	return nil
}

// etcdClient is liken-node's client of the members, with the certificate
// setup wrote. Read at every check: setup writes them at every boot, maybe
// after liken-node started.
func (h *Health) etcdClient() (*EtcdClient, error) {
	f := files(h.SetupDir)
	etcd, err := NewEtcdClientFromFiles(f(NodeEtcdClient.Cert()), f(NodeEtcdClient.Key()), f(EtcdServerCA.Cert()))
	if err != nil {
		return nil, fmt.Errorf("the control plane's certificates are not ready (liken-control-plane-setup.service makes them at boot): %w", err)
	}
	etcd.Timeout = h.timeout()
	return etcd, nil
}

// timeout bounds each request: Timeout, or 2 s when zero.
func (h *Health) timeout() time.Duration {
	if h.Timeout == 0 {
		return 2 * time.Second
	}
	return h.Timeout
}

// etcdURL is this leader's own member: Etcd, or LocalEtcd when empty.
func (h *Health) etcdURL() string {
	if h.Etcd == "" {
		return LocalEtcd
	}
	return h.Etcd
}

// SafeToStop returns nil when this leader's etcd member may go down (a
// reboot, or a restart of its control plane) with the datastore keeping
// its majority: every other member is a voter that has started, and each
// of them and each other configured leader answers for this leader's
// datastore and is healthy. It asks them directly, at the moment it is
// called: the operator's view (ControlPlaneReady, the Nodes) may be stale
// by the length of a drain. Otherwise the error says which member stops
// it and why, for the Machine's status; the caller keeps its turn and
// asks again (docs/design/controlplane.md, "Trials and turns on a
// leader"). A datastore of this member alone has no majority to keep: its
// leader may go down, the API with it.
func (h *Health) SafeToStop(ctx context.Context) error {
	if len(h.Peers) == 0 {
		return nil // one leader: no majority to keep, even with its etcd down
	}
	etcd, err := h.etcdClient()
	if err != nil {
		return err
	}
	self := h.etcdURL()
	// The member list from this leader's own member; when it does not
	// answer (it is already down), from the other leaders, who must agree.
	cluster, members, err := etcd.ClusterMembers(ctx, self)
	if err != nil {
		var errs []string
		for _, p := range h.Peers {
			c, ms, perr := etcd.ClusterMembers(ctx, p)
			switch {
			case perr != nil:
				errs = append(errs, perr.Error())
			case cluster != 0 && c != cluster:
				return fmt.Errorf("the other leaders answer for two datastores (%x and %x): this leader does not go down until one datastore answers", cluster, c)
			default:
				cluster, members = c, ms
			}
		}
		if cluster == 0 {
			return fmt.Errorf("no member of the datastore answers its member list (%s): this leader does not go down until the datastore answers", strings.Join(append([]string{err.Error()}, errs...), "; "))
		}
	}
	others := map[string]bool{}
	for _, p := range h.Peers {
		others[strings.TrimSuffix(p, "/")] = true
	}
	voters := 0
	for _, m := range members {
		switch {
		case m.Name == h.Machine:
			continue
		case m.Name == "":
			return fmt.Errorf("member %x (%s) was added and has not started: the datastore waits for a new member, so this leader does not go down until it votes", m.ID, strings.Join(m.PeerURLs, ","))
		case m.IsLearner:
			return fmt.Errorf("%s's etcd member is a learner still catching up: this leader does not go down until liken-control-plane-init on %s promotes it", m.Name, m.Name)
		}
		voters++
		for _, u := range m.ClientURLs {
			others[strings.TrimSuffix(u, "/")] = true
		}
	}
	if voters == 0 {
		return nil
	}
	for _, u := range slices.Sorted(maps.Keys(others)) {
		c, _, err := etcd.ClusterMembers(ctx, u)
		switch {
		case err != nil && strings.Contains(err.Error(), errLearner):
			return fmt.Errorf("the leader at %s is a learner still catching up: this leader does not go down until it votes", u)
		case err != nil:
			return fmt.Errorf("the leader at %s does not answer (%v): with this leader down too, the datastore could lose its majority; it goes down once every other leader is back", u, err)
		case c != cluster:
			return fmt.Errorf("the leader at %s answers for datastore %x, not this leader's %x: this leader does not go down while the fleet has two datastores", u, c, cluster)
		}
		if _, err := etcd.Health(ctx, u); err != nil {
			return fmt.Errorf("%v: with this leader down too, the datastore could lose its majority; it goes down once every other member is healthy", err)
		}
	}
	return nil
}

// splitFrom returns an error when this leader's datastore (cluster,
// members) split off the fleet's: the two datastores a first leader made
// when it was installed again while every other leader was down and
// started a new one alone (docs/design/controlplane.md, "The datastore").
// The fleet's datastore is judged by live quorum: the one for which a
// majority of the fleet's leaders (this one and Peers) answer. When
// neither has one, the one with more members is taken for the fleet's.
// The other leaders' datastore holds the fleet; this leader's must go, and
// Fence stops its API server (never when the two are as large: both would
// stop). A peer that does not answer proves nothing and is passed over.
func (h *Health) splitFrom(ctx context.Context, etcd *EtcdClient, cluster uint64, members []Member) error {
	if cluster == 0 {
		return nil
	}
	ours := 1 // this leader answers for its own
	type datastore struct {
		at      []string
		members []Member
	}
	others := map[uint64]*datastore{}
	var order []uint64
	for _, p := range h.Peers {
		other, theirs, err := etcd.ClusterMembers(ctx, p)
		switch {
		case err != nil || other == 0:
			continue
		case other == cluster:
			ours++
			continue
		}
		if others[other] == nil {
			others[other] = &datastore{members: theirs}
			order = append(order, other)
		}
		others[other].at = append(others[other].at, p)
	}
	quorum := (len(h.Peers)+1)/2 + 1
	if ours >= quorum {
		return nil
	}
	for _, other := range order {
		d := others[other]
		live := len(d.at) >= quorum
		if !live && len(d.members) < len(members) {
			continue
		}
		who := "the leader at " + d.at[0] + " answers"
		if len(d.at) > 1 {
			who = "the leaders at " + strings.Join(d.at, ", ") + " answer"
		}
		split := fmt.Sprintf("this leader's etcd member belongs to datastore %x (%s), but %s for datastore %x (%s)",
			cluster, memberNames(members), who, other, memberNames(d.members))
		if !live && len(d.members) == len(members) {
			// Stopping both API servers would leave none: the user says
			// which datastore is the fleet's.
			return fmt.Errorf("%w: %s. The two are as large, so neither leader stops its API server. "+
				"Install again the leaders whose datastore is not the fleet's (liken install): they then join the other (what was written to theirs is lost)", errSplitTie, split)
		}
		fenced := "clients that reach its API server see another cluster"
		if h.Fence != nil {
			fenced = "its API server is stopped, so that clients reach only the fleet's"
			if err := h.Fence(ctx); err != nil {
				fenced = fmt.Sprintf("stopping its API server failed (%v), so clients that reach it see another cluster", err)
			}
		}
		return fmt.Errorf("%w: %s. This leader started a new one alone, as a first leader installed again while the other leaders were down could; %s. "+
			"Install this leader again (liken install) now that the others run: it then joins their datastore (what was written to its own is lost)", ErrSplit, split, fenced)
	}
	return nil
}

// SplitCheck returns nil when this leader's etcd member has not split off
// the fleet's datastore (splitFrom), or is a learner (it joined through
// the fleet's member list). liken-node control-plane split-check runs it
// before the API server starts, so that an API server never serves a
// datastore that split off, not even until the first health check.
func (h *Health) SplitCheck(ctx context.Context) error {
	etcd, err := h.etcdClient()
	if err != nil {
		return err
	}
	self := h.etcdURL()
	cluster, members, err := etcd.ClusterMembers(ctx, self)
	switch {
	case err != nil && strings.Contains(err.Error(), errLearner):
		return nil
	case err != nil:
		return fmt.Errorf("this leader's etcd member does not answer: %w", err)
	}
	if err := h.splitFrom(ctx, etcd, cluster, members); err != nil && !errors.Is(err, errSplitTie) {
		return err
	}
	return nil // a tie stops neither API server: both would stop
}

// errLearner is etcd's answer to a learner asked for anything but its
// status (etcd v3.7.0).
const errLearner = "rpc not supported for learner"

func memberNames(ms []Member) string {
	if len(ms) == 0 {
		return "none listed"
	}
	var names []string
	for _, m := range ms {
		n := m.Name
		if n == "" {
			n = fmt.Sprintf("%x (not started)", m.ID)
		}
		names = append(names, n)
	}
	return "members: " + strings.Join(names, ", ")
}

// failedChecks keeps the lines of a /readyz answer that name a failed
// check ("[-]etcd failed: ..."), or the answer's start.
func failedChecks(body []byte) string {
	var failed []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "[-]") {
			failed = append(failed, strings.TrimPrefix(l, "[-]"))
		}
	}
	if len(failed) > 0 {
		return strings.Join(failed, "; ")
	}
	return snippet(body)
}
