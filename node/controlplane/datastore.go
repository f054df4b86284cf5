package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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
	// Listed is true when the leaders' answers name one datastore
	// (chooseDatastore); Members is then its member list.
	Listed bool
	// Members is the member list of the datastore the leaders answered for.
	Members []Member
	// Listing is how many leaders answered for that datastore with a list
	// that names this member, Without how many with one that does not.
	Listing, Without int
	// Leaders is how many leaders the fleet has, this one included.
	Leaders int
	// Unsure says why the leaders' answers name no one datastore (they
	// answer for two, none of them this member's): etcd waits for the
	// datastore to be clear, or starts with its data.
	Unsure string
	// EndpointAnswered is true when an API server answered at the
	// Cluster's endpoint.
	EndpointAnswered bool
	// Others is how many other leaders the fleet has; NoData how many of
	// them answered that they hold no member data, and Unheard names the
	// others. The first leader starts a new datastore only once every
	// other leader said it holds none: one that is down may hold the
	// fleet's.
	Others, NoData int
	Unheard        string
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
		// Only a majority of the fleet's leaders, all answering for one
		// datastore, and a majority of its own voters, prove the member
		// removed: one leader's answer may come from another datastore
		// (one that a leader started alone), or from a member cut off.
		if in.Restart && in.Listed && in.Without >= majority(in.Members) && in.Without >= in.Leaders/2+1 {
			return StartDecision{Action: MoveDataAsideThenJoin,
				Reason: fmt.Sprintf("etcd exited and %d leaders, a majority of the fleet's and of the datastore's voters, list no member %s: it was removed, so its data moves aside and it joins again", in.Without, in.Name)}
		}
		return StartDecision{Action: StartWithData, InitialCluster: self, InitialClusterState: clusterStateExisting,
			Reason: "the member's data is present: etcd starts from it and catches up from the other members"}
	}
	if !in.Listed && in.Unsure != "" {
		return waitFor(in.Unsure)
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
		case in.NoData < in.Others:
			return waitFor(fmt.Sprintf("no leader's etcd answers, and %s did not say it holds no member data: it may hold the fleet's datastore, so the first leader starts no new one. "+
				"Start the other leaders; if their data is lost for good, install them again (liken install), and the first leader starts a new datastore once they answer", in.Unheard))
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

// majority is how many of members' voters make a quorum.
func majority(members []Member) int {
	voters := 0
	for _, m := range members {
		if !m.IsLearner {
			voters++
		}
	}
	return voters/2 + 1
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
	ClusterMembers(ctx context.Context, clientURL string) (uint64, []Member, error)
	HoldsMemberData(ctx context.Context, clientURL string) (bool, error)
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
	// Datastore is the ID of the datastore the member belongs to, as
	// Remember recorded it; 0 when none is recorded.
	Datastore() (uint64, error)
	// Remember records the ID of the member's datastore, kept when the
	// member's data moves aside: the member only ever joins that one again.
	Remember(cluster uint64) error
	// Forget removes the record, for a member that starts a new datastore.
	Forget() error
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

// DatastoreFile, in etcd's data folder beside member/, holds the ID of the
// datastore (etcd's cluster ID, hexadecimal) the member belongs to.
const DatastoreFile = "liken-datastore"

// Datastore reads Dir/liken-datastore; 0 when it does not exist.
func (d DiskData) Datastore() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.Dir, DatastoreFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("reading which datastore this member belongs to: %w", err)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 16, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("%s does not hold a datastore ID (%q): remove it, and etcd-start asks the leaders which datastore this member belongs to", filepath.Join(d.Dir, DatastoreFile), strings.TrimSpace(string(b)))
	}
	return id, nil
}

// Remember writes Dir/liken-datastore atomically, creating Dir.
func (d DiskData) Remember(cluster uint64) error {
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return fmt.Errorf("recording which datastore this member belongs to: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(d.Dir, DatastoreFile), []byte(strconv.FormatUint(cluster, 16)+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording which datastore this member belongs to: %w", err)
	}
	return nil
}

// Forget removes Dir/liken-datastore, if it exists.
func (d DiskData) Forget() error {
	if err := os.Remove(filepath.Join(d.Dir, DatastoreFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("forgetting the datastore this member belonged to: %w", err)
	}
	return nil
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
	// ClientURL is this machine's own etcd client URL, one of ClientURLs.
	ClientURL string
	// Listen, when set, is the address etcd-start answers the other
	// leaders on, while this machine holds no member data, that it holds
	// none (MemberDataPath): etcd's client port, free until etcd starts.
	Listen string
	// ServerTLS serves Listen: etcd's serving certificate, and client
	// certificates of etcd's CA required.
	ServerTLS *tls.Config
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
	if present, err := o.Data.Present(); err == nil && !present && o.Listen != "" {
		stop, err := serveNoMemberData(log, o.Listen, o.ServerTLS)
		if err != nil {
			return StartDecision{}, err
		}
		defer stop()
	}
	restart := o.Restart
	quietSince := o.Clock.Now()
	lastReason := ""
	for {
		present, err := o.Data.Present()
		if err != nil {
			return StartDecision{}, err
		}
		in := StartInput{DataPresent: present, Restart: restart, Name: o.Name, PeerURL: o.PeerURL,
			FirstLeader: o.FirstLeader, BootstrapWait: o.BootstrapWait, Leaders: len(o.ClientURLs)}
		var from string
		var listErr error
		var chosen, recorded uint64
		if !present || restart {
			if recorded, err = o.Data.Datastore(); err != nil {
				return StartDecision{}, err
			}
			var answers []datastoreAnswer
			answers, listErr = listDatastores(ctx, o.Etcd, o.ClientURLs)
			var ds []datastoreAnswer
			ds, in.Unsure = chooseDatastore(answers, recorded)
			for _, a := range ds {
				if named(a.members, o.Name) != nil {
					in.Listing++
				} else {
					in.Without++
				}
			}
			if len(ds) > 0 {
				in.Listed, in.Members, from, chosen = true, ds[0].members, ds[0].from, ds[0].cluster
			}
		}
		if !present && !in.Listed && o.FirstLeader {
			in.EndpointAnswered = o.Endpoint.Answers(ctx)
			in.Others, in.NoData, in.Unheard = askMemberData(ctx, o.Etcd, o.ClientURLs, o.ClientURL)
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
			// The new datastore is the member's now; init records its ID
			// once etcd runs.
			if err := o.Data.Forget(); err != nil {
				return d, err
			}
			return d, writeStart(log, o.EnvFile, d)
		case StartWithData:
			// A member whose datastore is not recorded yet (it started
			// before liken recorded one) records it once a majority of
			// its voters list it.
			if recorded == 0 && in.Listed && in.Listing >= majority(in.Members) && in.Listing >= in.Leaders/2+1 {
				if err := remember(o.Data, chosen); err != nil {
					return d, err
				}
			}
			return d, writeStart(log, o.EnvFile, d)
		case StartAdded:
			if err := remember(o.Data, chosen); err != nil {
				return d, err
			}
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
			if err := remember(o.Data, chosen); err != nil {
				return d, err
			}
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

// datastoreAnswer is one leader's answer to the member list: the datastore
// it belongs to and its members.
type datastoreAnswer struct {
	from    string
	cluster uint64
	members []Member
}

// listDatastores asks every leader, never only the first that answers,
// and returns every answer; the error holds the others' errors.
func listDatastores(ctx context.Context, c MemberClient, clientURLs []string) ([]datastoreAnswer, error) {
	var answers []datastoreAnswer
	var errs []string
	for _, u := range clientURLs {
		cluster, members, err := c.ClusterMembers(ctx, u)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		answers = append(answers, datastoreAnswer{from: u, cluster: cluster, members: members})
	}
	if len(errs) > 0 {
		return answers, errors.New(strings.Join(errs, "; "))
	}
	return answers, nil
}

// chooseDatastore picks the datastore etcd-start acts on from the leaders'
// answers: the member's recorded datastore when one is recorded (answers
// for any other are ignored); else the one datastore every answer names.
// It returns every answer for it, and, when it picks none although
// leaders answered, why.
func chooseDatastore(answers []datastoreAnswer, recorded uint64) ([]datastoreAnswer, string) {
	var ids []uint64
	byID := map[uint64][]datastoreAnswer{}
	for _, a := range answers {
		if _, ok := byID[a.cluster]; !ok {
			ids = append(ids, a.cluster)
		}
		byID[a.cluster] = append(byID[a.cluster], a)
	}
	describe := func() string {
		var parts []string
		for _, id := range ids {
			var from []string
			for _, a := range byID[id] {
				from = append(from, a.from)
			}
			parts = append(parts, fmt.Sprintf("datastore %x (%s) at %s", id, memberNames(byID[id][0].members), strings.Join(from, ", ")))
		}
		return strings.Join(parts, "; ")
	}
	switch {
	case recorded != 0 && len(byID[recorded]) > 0:
		return byID[recorded], ""
	case recorded != 0 && len(answers) > 0:
		return nil, fmt.Sprintf("this member belongs to datastore %x, and no leader that answers belongs to it (%s): etcd waits for a leader of its own datastore and never joins another", recorded, describe())
	case len(ids) == 1:
		return byID[ids[0]], ""
	case len(ids) > 1:
		return nil, fmt.Sprintf("the leaders answer for %d datastores (%s), and this member has no record of its own: etcd waits until the leaders of one are down or installed again (liken install)", len(ids), describe())
	}
	return nil, ""
}

// MemberDataPath is where etcd-start answers, on etcd's client port while
// etcd does not run, whether this leader holds member data.
const MemberDataPath = "/liken/v1/member-data"

// memberDataAnswer is the answer at MemberDataPath.
type memberDataAnswer struct {
	MemberData bool `json:"memberData"`
}

// serveNoMemberData answers at MemberDataPath on listen that this leader
// holds no member data, until stop is called. Only clients with a
// certificate of etcd's CA are answered (tlsConfig requires them).
func serveNoMemberData(log klog.Logger, listen string, tlsConfig *tls.Config) (stop func(), err error) {
	if tlsConfig == nil {
		return nil, errors.New("answering the other leaders: no TLS configuration")
	}
	ln, err := tls.Listen("tcp", listen, tlsConfig)
	if err != nil {
		return nil, fmt.Errorf("answering the other leaders that this one holds no member data, on %s: %w", listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+MemberDataPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(memberDataAnswer{MemberData: false})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Answering the other leaders that this one holds no member data")
		}
	}()
	return func() { _ = srv.Close(); <-done }, nil
}

// MemberDataTLS is the TLS configuration etcd-start answers the other
// leaders with, from the certificates setup wrote in setupDir: etcd's own
// serving certificate, and client certificates of etcd's CA required.
func MemberDataTLS(setupDir string) (*tls.Config, error) {
	f := files(setupDir)
	cert, err := tls.LoadX509KeyPair(f(EtcdServer.Cert()), f(EtcdServer.Key()))
	if err != nil {
		return nil, fmt.Errorf("loading etcd's serving certificate: %w", err)
	}
	caPEM, err := os.ReadFile(f(EtcdServerCA.Cert()))
	if err != nil {
		return nil, fmt.Errorf("reading etcd's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", f(EtcdServerCA.Cert()))
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, nil
}

// askMemberData asks every leader but self whether it holds member data,
// and returns how many others there are, how many said they hold none,
// and the ones that did not.
func askMemberData(ctx context.Context, c MemberClient, clientURLs []string, self string) (others, none int, unheard string) {
	var silent []string
	for _, u := range clientURLs {
		if strings.TrimSuffix(u, "/") == strings.TrimSuffix(self, "/") {
			continue
		}
		others++
		holds, err := c.HoldsMemberData(ctx, u)
		switch {
		case err != nil:
			silent = append(silent, fmt.Sprintf("the leader at %s (%v)", u, err))
		case holds:
			silent = append(silent, fmt.Sprintf("the leader at %s (it holds member data)", u))
		default:
			none++
		}
	}
	return others, none, strings.Join(silent, ", ")
}

// remember records the datastore this member joins, unless unknown (0).
func remember(data MemberData, cluster uint64) error {
	if cluster == 0 {
		return nil
	}
	return data.Remember(cluster)
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
