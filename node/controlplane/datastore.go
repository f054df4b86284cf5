package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"liken.sh/liken/internal/atomicfile"
)

const (
	// DefaultBootstrapWait is how long the first leader finds no member
	// and no API before it starts a new datastore.
	DefaultBootstrapWait = 30 * time.Second
	// RetryInterval is how long etcd-start waits before it looks again.
	RetryInterval = 5 * time.Second

	clusterStateNew      = "new"
	clusterStateExisting = "existing"
)

// Files of the datastore's start in SetupDir.
const (
	// EtcdEnvFile is etcd's environment, which Start writes before every
	// start of etcd and etcd.service reads (EnvironmentFile).
	EtcdEnvFile = "etcd.env"
	// EtcdStartedFile marks that etcd started in this boot: liken-node
	// control-plane etcd-start writes it once it first lets etcd start, so
	// a later start in the same boot is a restart (StartOptions.Restart).
	// SetupDir is memory, so every boot begins without it.
	EtcdStartedFile = "etcd-started"
)

// StartAction is how etcd starts on this leader, or what must happen
// first (docs/design/controlplane.md, "The datastore").
type StartAction string

const (
	// StartWithData starts etcd from the member data on disk, asking no one.
	StartWithData StartAction = "StartWithData"
	// MoveDataAsideThenJoin moves the data of a removed member aside; the
	// machine then joins as a new member.
	MoveDataAsideThenJoin StartAction = "MoveDataAsideThenJoin"
	// Bootstrap starts a new one-member datastore (initial cluster state
	// new): only the first leader, only after finding no member and no API.
	Bootstrap StartAction = "Bootstrap"
	// RemoveSelfThenJoin removes the member of this machine's name, whose
	// data is gone (a re-install); the machine then joins as a new member.
	RemoveSelfThenJoin StartAction = "RemoveSelfThenJoin"
	// JoinAsLearner adds this machine as a learner and starts etcd with
	// the members etcd answers (initial cluster state existing).
	JoinAsLearner StartAction = "JoinAsLearner"
	// StartAdded starts etcd as the member already added for this
	// machine's peer URL and not started yet (initial cluster state
	// existing), adding nothing.
	StartAdded StartAction = "StartAdded"
	// Wait looks again after RetryAfter; Reason says what for.
	Wait StartAction = "Wait"
)

// StartInput is what etcd-start knows when it decides.
type StartInput struct {
	// DataPresent is true when the member's data exists (/var/lib/etcd/member).
	DataPresent bool
	// Restart is true when etcd exited and systemd starts it again in the
	// same boot.
	Restart bool
	// Name is this machine's name, etcd's --name.
	Name string
	// PeerURL is this machine's etcd peer URL.
	PeerURL string
	// FirstLeader is true on the first leader, the only one that may start
	// a new datastore.
	FirstLeader bool
	// Listed is true when a leader answered the member list; Members is
	// then its answer.
	Listed bool
	// Members is the member list a leader answered.
	Members []Member
	// EndpointAnswered is true when an API server answered at the
	// Cluster's endpoint.
	EndpointAnswered bool
	// Waited is how long nothing has answered (neither a member nor the API).
	Waited time.Duration
	// BootstrapWait is how long the first leader waits for an answer
	// before it starts a new datastore (DefaultBootstrapWait when zero).
	BootstrapWait time.Duration
}

// StartDecision is what etcd-start does, and what it writes into etcd.env
// when etcd starts.
type StartDecision struct {
	// Action is what to do.
	Action StartAction
	// Reason says why, for the log; for Wait, what it waits for.
	Reason string
	// RetryAfter is when to look again (Wait only).
	RetryAfter time.Duration
	// MemberID is the member to remove (RemoveSelfThenJoin only).
	MemberID uint64
	// InitialCluster is ETCD_INITIAL_CLUSTER (name=peerURL,...), set when
	// Action starts etcd; JoinAsLearner sets it from etcd's answer to the
	// addition.
	InitialCluster string
	// InitialClusterState is ETCD_INITIAL_CLUSTER_STATE: new or existing.
	InitialClusterState string
	// InitialClusterToken is ETCD_INITIAL_CLUSTER_TOKEN, set by Start for
	// Bootstrap only: a new random one for every new datastore, so that
	// two datastores never share etcd's cluster and member IDs (a first
	// leader installed again while the others were down starts one whose
	// IDs would otherwise equal those of the fleet's: etcd would then take
	// the two for one, and a raft log for another's).
	InitialClusterToken string
}

// DecideStart decides how etcd starts on this leader, in the order of the
// design: data present starts with it (unless etcd exited and the member
// was removed); with no data, the first leader alone bootstraps, and only
// after BootstrapWait of silence; everyone else waits for a member list,
// removes its stale member, and joins as a learner, one at a time.
func DecideStart(in StartInput) StartDecision {
	self := in.Name + "=" + in.PeerURL
	if in.DataPresent {
		if in.Restart && in.Listed && named(in.Members, in.Name) == nil {
			return StartDecision{Action: MoveDataAsideThenJoin,
				Reason: fmt.Sprintf("etcd exited and the member list has no member %s: it was removed, so its data moves aside and it joins again", in.Name)}
		}
		return StartDecision{Action: StartWithData, InitialCluster: self, InitialClusterState: clusterStateExisting,
			Reason: "the member's data is present: etcd starts from it and catches up from the other members"}
	}
	if !in.Listed {
		wait := in.BootstrapWait
		if wait <= 0 {
			wait = DefaultBootstrapWait
		}
		switch {
		case !in.FirstLeader:
			return waitFor("no leader's etcd answers the member list; only the first leader starts a new datastore")
		case in.EndpointAnswered:
			return waitFor("an API server answers at the endpoint but no leader's etcd answers: starting a second datastore would split the cluster")
		case in.Waited < wait:
			return waitFor(fmt.Sprintf("no leader's etcd and no API answer yet; the first leader starts a new datastore after %s of silence (%s so far)", wait, in.Waited))
		}
		return StartDecision{Action: Bootstrap, InitialCluster: self, InitialClusterState: clusterStateNew,
			Reason: fmt.Sprintf("no member and no API answered for %s: the first leader starts a new datastore", in.Waited)}
	}
	if m := named(in.Members, in.Name); m != nil {
		return StartDecision{Action: RemoveSelfThenJoin, MemberID: m.ID,
			Reason: fmt.Sprintf("member %s (%x) exists but this machine has no data (re-installed): the old member is removed, then it joins", in.Name, m.ID)}
	}
	for _, m := range in.Members {
		if !hasPeerURL(m, in.PeerURL) {
			continue
		}
		if m.Name == "" {
			return StartDecision{Action: StartAdded, InitialClusterState: clusterStateExisting,
				InitialCluster: initialCluster(in.Members, m.ID, in.Name),
				Reason:         fmt.Sprintf("member %x was added for this machine's peer URL and has not started: etcd starts as it", m.ID)}
		}
		return waitFor(fmt.Sprintf("member %s (%x) has this machine's peer URL %s: two leaders share a peer URL; correct the Machines' etcd peer URLs", m.Name, m.ID, in.PeerURL))
	}
	for _, m := range in.Members {
		if m.Name == "" {
			return waitFor(fmt.Sprintf("member %x at %s was added and has not started yet; etcd takes one new member at a time", m.ID, strings.Join(m.PeerURLs, ",")))
		}
		if m.IsLearner {
			return waitFor(fmt.Sprintf("learner %s is not promoted yet; etcd takes one learner at a time", m.Name))
		}
	}
	return StartDecision{Action: JoinAsLearner, Reason: "the datastore runs and this machine is no member: it joins as a learner"}
}

func waitFor(reason string) StartDecision {
	return StartDecision{Action: Wait, Reason: reason, RetryAfter: RetryInterval}
}

// named returns the member called name, or nil.
func named(members []Member, name string) *Member {
	for i := range members {
		if members[i].Name == name {
			return &members[i]
		}
	}
	return nil
}

func hasPeerURL(m Member, peerURL string) bool {
	for _, u := range m.PeerURLs {
		if strings.TrimSuffix(u, "/") == strings.TrimSuffix(peerURL, "/") {
			return true
		}
	}
	return false
}

// initialCluster is ETCD_INITIAL_CLUSTER for the member selfID, named
// name, joining members: every member's name=peerURL.
func initialCluster(members []Member, selfID uint64, name string) string {
	var parts []string
	for _, m := range members {
		n := m.Name
		if m.ID == selfID {
			n = name
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// MemberClient reads and changes the member list through one member's
// client URL; EtcdClient is one.
type MemberClient interface {
	MemberList(ctx context.Context, clientURL string) ([]Member, error)
	MemberAdd(ctx context.Context, clientURL, peerURL string, learner bool) (Member, []Member, error)
	MemberRemove(ctx context.Context, clientURL string, id uint64) ([]Member, error)
}

// MemberData is this machine's etcd data; DiskData is one.
type MemberData interface {
	// Present reports whether the member's data exists.
	Present() (bool, error)
	// MoveAside moves the member's data out of etcd's way, keeping it, and
	// returns where it went.
	MoveAside(now time.Time) (string, error)
}

// DiskData is etcd's data folder (--data-dir): its member data is
// Dir/member.
type DiskData struct {
	// Dir is etcd's --data-dir.
	Dir string
}

// Present reports whether Dir/member exists.
func (d DiskData) Present() (bool, error) {
	st, err := os.Stat(filepath.Join(d.Dir, "member"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking for etcd's data: %w", err)
	case !st.IsDir():
		return false, fmt.Errorf("%s is not a folder: move it away so etcd can start", filepath.Join(d.Dir, "member"))
	}
	return true, nil
}

// MoveAside moves Dir/member to Dir/removed-<now>/member: inside the data
// folder, so on the same file system (the slot store's partition, where
// /var/lib/etcd is bound; /var itself is memory) and kept across reboots.
func (d DiskData) MoveAside(now time.Time) (string, error) {
	dir := filepath.Clean(d.Dir)
	aside := filepath.Join(dir, "removed-"+now.UTC().Format("20060102T150405Z"))
	if err := os.Mkdir(aside, 0o700); err != nil {
		return "", fmt.Errorf("moving the removed member's data aside: %w", err)
	}
	if err := os.Rename(filepath.Join(dir, "member"), filepath.Join(aside, "member")); err != nil {
		return "", fmt.Errorf("moving the removed member's data aside to %s: %w", aside, err)
	}
	return aside, atomicfile.SyncDir(dir)
}

// APIProbe tells whether an API server answers at the Cluster's endpoint;
// EndpointProbe is one.
type APIProbe interface {
	Answers(ctx context.Context) bool
}

// EndpointProbe asks the endpoint's /readyz. Any HTTP answer from a server
// with a certificate of the server CA counts, ready or not: an API server
// that runs means a datastore exists somewhere.
type EndpointProbe struct {
	// URL is the Cluster's endpoint, https://host:port.
	URL string
	// HTTP carries the request; its transport trusts the server CA.
	HTTP *http.Client
}

// NewEndpointProbe returns a probe of endpoint that trusts rootCAs (the
// server CA), each request bounded by 2 s.
func NewEndpointProbe(endpoint string, rootCAs *x509.CertPool) *EndpointProbe {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: rootCAs, MinVersion: tls.VersionTLS12}
	tr.Proxy = nil
	return &EndpointProbe{URL: endpoint, HTTP: &http.Client{Transport: tr, Timeout: 2 * time.Second}}
}

// Answers reports whether an API server answered the endpoint's /readyz.
func (p *EndpointProbe) Answers(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(p.URL, "/")+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := p.HTTP.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return true
}

// StartOptions are what Start needs.
type StartOptions struct {
	// Name is this machine's name, etcd's --name.
	Name string
	// PeerURL is this machine's etcd peer URL.
	PeerURL string
	// FirstLeader is true on the first leader.
	FirstLeader bool
	// ClientURLs are every leader's etcd client URL, asked in this order.
	ClientURLs []string
	// Etcd reads and changes the member list.
	Etcd MemberClient
	// Endpoint tells whether an API answers; the first leader needs it.
	Endpoint APIProbe
	// Data is this machine's etcd data.
	Data MemberData
	// Restart is true when etcd exited and starts again in this boot.
	Restart bool
	// EnvFile is etcd.env, read by etcd.service (EnvironmentFile).
	EnvFile string
	// BootstrapWait is DefaultBootstrapWait when zero.
	BootstrapWait time.Duration
	// Clock paces the waits and measures the silence (the real clock when nil).
	Clock clock.Clock
}

// Start decides how etcd starts, does what must happen first (moving
// removed data aside, removing this machine's stale member, adding it as a
// learner), and writes EnvFile atomically. It looks again every
// RetryInterval while the decision is to wait, until ctx ends, and returns
// the decision it wrote.
func Start(ctx context.Context, o StartOptions) (StartDecision, error) {
	switch {
	case o.Name == "" || o.PeerURL == "":
		return StartDecision{}, errors.New("starting etcd: the machine's name and peer URL are required")
	case o.Etcd == nil || o.Data == nil || o.EnvFile == "":
		return StartDecision{}, errors.New("starting etcd: the etcd client, the data folder and the env file are required")
	case o.FirstLeader && o.Endpoint == nil:
		return StartDecision{}, errors.New("starting etcd: the first leader needs the endpoint to check before it starts a new datastore")
	}
	if err := checkEnvValue(o.Name + "=" + o.PeerURL); err != nil {
		return StartDecision{}, fmt.Errorf("starting etcd: the machine's name and peer URL: %w", err)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	log := klog.FromContext(ctx).WithValues("member", o.Name)
	restart := o.Restart
	quietSince := o.Clock.Now()
	lastReason := ""
	for {
		present, err := o.Data.Present()
		if err != nil {
			return StartDecision{}, err
		}
		in := StartInput{DataPresent: present, Restart: restart, Name: o.Name, PeerURL: o.PeerURL,
			FirstLeader: o.FirstLeader, BootstrapWait: o.BootstrapWait}
		var from string
		var listErr error
		if !present || restart {
			in.Members, from, listErr = listMembers(ctx, o.Etcd, o.ClientURLs)
			in.Listed = listErr == nil
		}
		if !present && !in.Listed && o.FirstLeader {
			in.EndpointAnswered = o.Endpoint.Answers(ctx)
		}
		now := o.Clock.Now()
		if in.Listed || in.EndpointAnswered {
			quietSince = now
		}
		in.Waited = now.Sub(quietSince)

		d := DecideStart(in)
		switch d.Action {
		case Bootstrap:
			if d.InitialClusterToken, err = newClusterToken(); err != nil {
				return d, err
			}
			return d, writeStart(log, o.EnvFile, d)
		case StartWithData, StartAdded:
			return d, writeStart(log, o.EnvFile, d)
		case MoveDataAsideThenJoin:
			aside, err := o.Data.MoveAside(now)
			if err != nil {
				return d, err
			}
			log.Info("This machine's member was removed: its data moved aside, it joins again", "movedTo", aside, "answeredBy", from)
			restart = false
			continue
		case RemoveSelfThenJoin:
			if _, err := o.Etcd.MemberRemove(ctx, from, d.MemberID); err != nil {
				d = waitFor(fmt.Sprintf("removing this machine's old member %x: %v", d.MemberID, err))
				break
			}
			log.Info("Removed this machine's old member (re-installed, no data)", "id", fmt.Sprintf("%x", d.MemberID), "answeredBy", from)
			continue
		case JoinAsLearner:
			added, members, err := o.Etcd.MemberAdd(ctx, from, o.PeerURL, true)
			if err != nil {
				d = waitFor(fmt.Sprintf("adding this machine as a learner: %v", err))
				break
			}
			log.Info("Added this machine as a learner", "id", fmt.Sprintf("%x", added.ID), "answeredBy", from)
			d.InitialCluster = initialCluster(members, added.ID, o.Name)
			d.InitialClusterState = clusterStateExisting
			return d, writeStart(log, o.EnvFile, d)
		}
		if d.Reason != lastReason {
			kv := []any{"reason", d.Reason, "retryAfter", d.RetryAfter}
			if listErr != nil {
				kv = append(kv, "memberList", listErr.Error())
			}
			log.Info("Waiting before etcd starts", kv...)
			lastReason = d.Reason
		}
		select {
		case <-ctx.Done():
			return d, fmt.Errorf("etcd did not start: %s: %w", d.Reason, ctx.Err())
		case <-o.Clock.After(d.RetryAfter):
		}
	}
}

type memberLister interface {
	MemberList(ctx context.Context, clientURL string) ([]Member, error)
}

// listMembers asks the leaders in order and returns the first answer and
// who gave it, or every leader's error.
func listMembers(ctx context.Context, c memberLister, clientURLs []string) ([]Member, string, error) {
	var errs []string
	for _, u := range clientURLs {
		members, err := c.MemberList(ctx, u)
		if err == nil {
			return members, u, nil
		}
		errs = append(errs, err.Error())
	}
	if len(errs) == 0 {
		return nil, "", errors.New("no leader's etcd client URL is known")
	}
	return nil, "", errors.New(strings.Join(errs, "; "))
}

// newClusterToken is a new datastore's etcd cluster token: random, so its
// cluster and member IDs are its own.
func newClusterToken() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making the new datastore's cluster token: %w", err)
	}
	return "liken-" + hex.EncodeToString(b), nil
}

func writeStart(log klog.Logger, path string, d StartDecision) error {
	if err := WriteEtcdEnv(path, d); err != nil {
		return err
	}
	log.Info("etcd starts", "action", d.Action, "reason", d.Reason, "initialClusterState", d.InitialClusterState, "initialCluster", d.InitialCluster)
	return nil
}

// WriteEtcdEnv replaces path with the decision's ETCD_INITIAL_CLUSTER_STATE
// and ETCD_INITIAL_CLUSTER, KEY=value lines for systemd's
// EnvironmentFile. A value systemd would not read back as written (a
// space, a quote, a backslash, a line break) fails the write and leaves
// path as it was.
func WriteEtcdEnv(path string, d StartDecision) error {
	err := atomicfile.WriteFunc(path, 0o600, func(w io.Writer) error {
		if _, err := fmt.Fprintf(w, "# Written by liken-node before etcd starts: %s\n", d.Action); err != nil {
			return err
		}
		vars := [][2]string{{"ETCD_INITIAL_CLUSTER_STATE", d.InitialClusterState}}
		if d.InitialClusterToken != "" {
			vars = append(vars, [2]string{"ETCD_INITIAL_CLUSTER_TOKEN", d.InitialClusterToken})
		}
		for _, kv := range append(vars, [2]string{"ETCD_INITIAL_CLUSTER", d.InitialCluster}) {
			if err := checkEnvValue(kv[1]); err != nil {
				return fmt.Errorf("%s: %w", kv[0], err)
			}
			if _, err := fmt.Fprintf(w, "%s=%s\n", kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing etcd's environment %s: %w", path, err)
	}
	return nil
}

func checkEnvValue(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	for _, r := range v {
		if r <= ' ' || r == 0x7f || r == '"' || r == '\'' || r == '\\' {
			return fmt.Errorf("%q holds %q, which systemd's EnvironmentFile would not read back as written", v, string(r))
		}
	}
	return nil
}
