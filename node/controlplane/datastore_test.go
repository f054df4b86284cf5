package controlplane

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	clocktesting "k8s.io/utils/clock/testing"
)

// The fleet of these tests: three leaders l1 (first), l2, l3.
func client(n int) string { return fmt.Sprintf("https://l%d:2379", n) }
func peer(n int) string   { return fmt.Sprintf("https://l%d:2380", n) }
func voter(n int) Member {
	return Member{ID: uint64(n), Name: fmt.Sprintf("l%d", n), PeerURLs: []string{peer(n)}, ClientURLs: []string{client(n)}}
}

func TestDecideStart(t *testing.T) {
	removed := []Member{voter(1), voter(2)}
	all := []Member{voter(1), voter(2), voter(3)}
	for _, tc := range []struct {
		name string
		in   StartInput // Name and PeerURL are l3's unless set
		want StartDecision
	}{
		// 1. Data present: start with it, asking no one.
		{name: "reboot with data", in: StartInput{DataPresent: true},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "power cut: nobody answers, data present", in: StartInput{DataPresent: true, FirstLeader: true, Waited: time.Hour},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "trial boot on a new slot with the member's data", in: StartInput{DataPresent: true, Listed: true, Members: all},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "failed trial back on its proven slot: a boot, not a restart, so the data wins over any list", in: StartInput{DataPresent: true, Listed: true, Members: removed},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, still a member", in: StartInput{DataPresent: true, Restart: true, Listed: true, Members: all},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, nobody answers", in: StartInput{DataPresent: true, Restart: true},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, the member was removed", in: StartInput{DataPresent: true, Restart: true, Listed: true, Members: removed, Without: 2, Leaders: 3},
			want: StartDecision{Action: MoveDataAsideThenJoin}},
		{name: "restart after etcd exited, one leader of two voters lists no such member: proves nothing, starts with its data", in: StartInput{DataPresent: true, Restart: true, Listed: true, Members: removed, Without: 1, Leaders: 3},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, the only leader that answers, of three, runs a datastore of its own that lacks the member: starts with its data", in: StartInput{DataPresent: true, Restart: true, Listed: true, Members: []Member{voter(1)}, Without: 1, Leaders: 3},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, the first answer lacks the member but most list it: starts with its data", in: StartInput{DataPresent: true, Restart: true, Listed: true, Members: removed, Listing: 2, Without: 1, Leaders: 3},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},
		{name: "restart after etcd exited, the leaders answer for two datastores: starts with its data", in: StartInput{DataPresent: true, Restart: true, Unsure: "two datastores"},
			want: StartDecision{Action: StartWithData, InitialCluster: "l3=" + peer(3), InitialClusterState: "existing"}},

		// 2. No data, first leader, nobody answers.
		{name: "first leader, nobody answers for 29 s: waits", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Waited: 29 * time.Second},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "first leader, nobody answers for 30 s: bootstraps", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Waited: 30 * time.Second},
			want: StartDecision{Action: Bootstrap, InitialCluster: "l1=" + peer(1), InitialClusterState: "new"}},
		{name: "first leader, nobody answers for an hour, one other leader unheard: waits, never bootstraps", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Waited: time.Hour, Others: 2, NoData: 1, Unheard: "the leader at " + client(3)},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "first leader, a shorter bootstrap wait", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Waited: 2 * time.Second, BootstrapWait: time.Second},
			want: StartDecision{Action: Bootstrap, InitialCluster: "l1=" + peer(1), InitialClusterState: "new"}},
		{name: "first leader, no etcd answers but the API does: never bootstraps", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, EndpointAnswered: true, Waited: time.Hour},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "first leader whose peers answer joins, never bootstraps", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Listed: true, Members: []Member{voter(2), voter(3)}, Waited: time.Hour},
			want: StartDecision{Action: JoinAsLearner}},

		{name: "first leader, the leaders answer for two datastores: waits, never bootstraps", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Unsure: "two datastores", Waited: time.Hour},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},

		// 3. Otherwise wait for a member list, then join as a learner.
		{name: "not the first leader, nobody answers for an hour: waits, never bootstraps", in: StartInput{Waited: time.Hour},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "joins as a learner", in: StartInput{Listed: true, Members: removed},
			want: StartDecision{Action: JoinAsLearner}},
		{name: "re-installed: a member of this name, no data", in: StartInput{Listed: true, Members: all},
			want: StartDecision{Action: RemoveSelfThenJoin, MemberID: 3}},
		{name: "re-installed first leader whose peers run", in: StartInput{Name: "l1", PeerURL: peer(1), FirstLeader: true, Listed: true, Members: all},
			want: StartDecision{Action: RemoveSelfThenJoin, MemberID: 1}},
		{name: "a learner added for another machine and not started: one at a time", in: StartInput{Listed: true,
			Members: []Member{voter(1), {ID: 9, PeerURLs: []string{peer(2)}, IsLearner: true}}},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "another machine's learner, started, not promoted yet", in: StartInput{Listed: true,
			Members: []Member{voter(1), {ID: 9, Name: "l2", PeerURLs: []string{peer(2)}, ClientURLs: []string{client(2)}, IsLearner: true}}},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
		{name: "already added as a learner, not started: starts as it, adds nothing", in: StartInput{Listed: true,
			Members: []Member{voter(1), {ID: 9, PeerURLs: []string{peer(3) + "/"}, IsLearner: true}, voter(2)}},
			want: StartDecision{Action: StartAdded, InitialCluster: "l1=" + peer(1) + ",l3=" + peer(3) + "/,l2=" + peer(2), InitialClusterState: "existing"}},
		{name: "another machine's member holds this peer URL", in: StartInput{Listed: true,
			Members: []Member{voter(1), {ID: 9, Name: "old", PeerURLs: []string{peer(3)}}}},
			want: StartDecision{Action: Wait, RetryAfter: 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.in.Name == "" {
				tc.in.Name, tc.in.PeerURL = "l3", peer(3)
			}
			got := DecideStart(tc.in)
			assert.Check(t, got.Reason != "", "every decision says why")
			got.Reason = ""
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestDecideStartWaitReasons(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   StartInput
		want string
	}{
		{name: "first leader", in: StartInput{FirstLeader: true, Waited: 10 * time.Second},
			want: "the first leader starts a new datastore after 30s of silence (10s so far)"},
		{name: "a leader unheard", in: StartInput{FirstLeader: true, Waited: time.Hour, Others: 2, NoData: 1, Unheard: "the leader at https://l3:2379 (connection refused)"},
			want: "no leader's etcd answers, and the leader at https://l3:2379 (connection refused) did not say it holds no member data: it may hold the fleet's datastore, so the first leader starts no new one. Start the other leaders; if their data is lost for good, install them again (liken install), and the first leader starts a new datastore once they answer"},
		{name: "the API answers", in: StartInput{FirstLeader: true, EndpointAnswered: true},
			want: "an API server answers at the endpoint but no leader's etcd answers"},
		{name: "not first", in: StartInput{}, want: "only the first leader starts a new datastore"},
		{name: "pending learner", in: StartInput{Listed: true, Members: []Member{voter(1), {ID: 0xab, PeerURLs: []string{peer(2)}, IsLearner: true}}},
			want: "member ab at https://l2:2380 was added and has not started yet; etcd takes one new member at a time"},
		{name: "shared peer URL", in: StartInput{Listed: true, Members: []Member{{ID: 0xab, Name: "old", PeerURLs: []string{peer(3)}}}},
			want: "member old (ab) has this machine's peer URL https://l3:2380"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Name, tc.in.PeerURL = "l3", peer(3)
			got := DecideStart(tc.in)
			assert.Equal(t, got.Action, Wait)
			assert.Assert(t, strings.Contains(got.Reason, tc.want), "reason %q", got.Reason)
		})
	}
}

// fakeEtcd is the leaders' etcd gateways: one member list behind every
// client URL that is up.
type fakeEtcd struct {
	mu      sync.Mutex
	up      map[string]bool
	members []Member
	cluster uint64          // the datastore's ID every leader answers
	noData  map[string]bool // leaders whose etcd-start answers that they hold no member data
	addErrs []error         // errors of the next additions
	addLost []error         // errors answered for the next additions, made all the same (the answer lost)
	lists   int             // member lists asked
	changes []string        // additions and removals, in order
}

var errDown = errors.New("connection refused")

func (f *fakeEtcd) ClusterMembers(_ context.Context, u string) (uint64, []Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if !f.up[u] {
		return 0, nil, errDown
	}
	return f.cluster, append([]Member(nil), f.members...), nil
}

func (f *fakeEtcd) HoldsMemberData(_ context.Context, u string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.noData[u] {
		return false, errDown
	}
	return false, nil
}

func (f *fakeEtcd) MemberAdd(_ context.Context, u, peerURL string, learner bool) (Member, []Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changes = append(f.changes, fmt.Sprintf("add %s learner=%v via %s", peerURL, learner, u))
	if !f.up[u] {
		return Member{}, nil, errDown
	}
	if len(f.addErrs) > 0 {
		err := f.addErrs[0]
		f.addErrs = f.addErrs[1:]
		return Member{}, nil, err
	}
	m := Member{ID: 100, PeerURLs: []string{peerURL}, IsLearner: learner}
	f.members = append(f.members, m)
	if len(f.addLost) > 0 {
		err := f.addLost[0]
		f.addLost = f.addLost[1:]
		return Member{}, nil, err
	}
	return m, append([]Member(nil), f.members...), nil
}

func (f *fakeEtcd) MemberRemove(_ context.Context, u string, id uint64) ([]Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changes = append(f.changes, fmt.Sprintf("remove %d via %s", id, u))
	if !f.up[u] {
		return nil, errDown
	}
	for i, m := range f.members {
		if m.ID == id {
			f.members = append(f.members[:i:i], f.members[i+1:]...)
			return append([]Member(nil), f.members...), nil
		}
	}
	return nil, errors.New("etcdserver: member not found")
}

type probeFunc func() bool

func (p probeFunc) Answers(context.Context) bool { return p() }

// runStart runs Start and steps the fake clock whenever Start waits, until
// Start returns or two minutes have passed on the clock (then ctx ends).
// It returns how long Start waited on the clock.
func runStart(t *testing.T, o StartOptions, clk *clocktesting.FakeClock) (StartDecision, error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		d   StartDecision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := Start(ctx, o)
		done <- result{d, err}
	}()
	var waited time.Duration
	for {
		var r *result
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			select {
			case got := <-done:
				r = &got
				return poll.Success()
			default:
			}
			if clk.HasWaiters() {
				return poll.Success()
			}
			return poll.Continue("Start neither returned nor waits")
		}, poll.WithDelay(time.Millisecond), poll.WithTimeout(10*time.Second))
		if r != nil {
			return r.d, r.err, waited
		}
		if waited >= 2*time.Minute {
			cancel()
			got := <-done
			return got.d, got.err, waited
		}
		clk.Step(RetryInterval)
		waited += RetryInterval
	}
}

func TestStart(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	urls := []string{client(1), client(2), client(3)}
	for _, tc := range []struct {
		name      string
		machine   int // 1 is the first leader
		data      bool
		restart   bool
		up        []string // client URLs that answer
		members   []Member
		addErrs   []error
		addLost   []error
		apiAnswer bool
		noData    []string // leaders that answer they hold no member data

		wantEnv     string // "" for no file
		wantErr     string
		wantWaited  time.Duration
		wantChanges []string
		wantLists   int // -1: any number
		wantAside   bool
	}{
		{name: "the first leader bootstraps after 30 s of silence, once the others say they hold no member data", machine: 1, noData: urls[1:],
			wantEnv:    "# Written by liken-node before etcd starts: Bootstrap\nETCD_INITIAL_CLUSTER_STATE=new\nETCD_INITIAL_CLUSTER_TOKEN=liken-<random>\nETCD_INITIAL_CLUSTER=l1=https://l1:2380\n",
			wantWaited: 30 * time.Second, wantLists: 7 * 3},
		{name: "a first leader installed again while the others are down never bootstraps", machine: 1, noData: urls[1:2],
			wantErr:    "etcd did not start: no leader's etcd answers, and the leader at https://l3:2379 (connection refused) did not say it holds no member data: it may hold the fleet's datastore, so the first leader starts no new one",
			wantWaited: 2 * time.Minute, wantLists: -1},
		{name: "the first leader never bootstraps while the API answers", machine: 1, apiAnswer: true, noData: urls[1:],
			wantErr:    "etcd did not start: an API server answers at the endpoint but no leader's etcd answers",
			wantWaited: 2 * time.Minute, wantLists: -1},
		{name: "another leader waits for a member list without end", machine: 2,
			wantErr:    "etcd did not start: no leader's etcd answers the member list; only the first leader starts a new datastore: context canceled",
			wantWaited: 2 * time.Minute, wantLists: -1},
		{name: "joins as a learner, having asked every leader", machine: 3, up: []string{client(2)}, members: []Member{voter(1), voter(2)},
			wantEnv:     "# Written by liken-node before etcd starts: JoinAsLearner\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l2=https://l2:2380,l3=https://l3:2380\n",
			wantChanges: []string{"add https://l3:2380 learner=true via https://l2:2379"}, wantLists: 3},
		{name: "the first leader whose peers run joins", machine: 1, up: []string{client(2), client(3)}, members: []Member{voter(2), voter(3)},
			wantEnv:     "# Written by liken-node before etcd starts: JoinAsLearner\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l2=https://l2:2380,l3=https://l3:2380,l1=https://l1:2380\n",
			wantChanges: []string{"add https://l1:2380 learner=true via https://l2:2379"}, wantLists: 3},
		{name: "a refused addition is tried again 5 s later", machine: 3, up: urls[:1], members: []Member{voter(1)},
			addErrs:     []error{errors.New("etcdserver: too many learner members in cluster")},
			wantEnv:     "# Written by liken-node before etcd starts: JoinAsLearner\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l3=https://l3:2380\n",
			wantChanges: []string{"add https://l3:2380 learner=true via https://l1:2379", "add https://l3:2380 learner=true via https://l1:2379"},
			wantWaited:  5 * time.Second, wantLists: 6},
		{name: "an addition etcd made but whose answer was lost: the next look starts as that member, adds nothing more", machine: 3, up: urls[:1], members: []Member{voter(1)},
			addLost:     []error{context.DeadlineExceeded},
			wantEnv:     "# Written by liken-node before etcd starts: StartAdded\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l3=https://l3:2380\n",
			wantChanges: []string{"add https://l3:2380 learner=true via https://l1:2379"},
			wantWaited:  5 * time.Second, wantLists: 6},
		{name: "re-installed: removes its old member, then joins", machine: 3, up: urls[:2], members: []Member{voter(1), voter(2), voter(3)},
			wantEnv:     "# Written by liken-node before etcd starts: JoinAsLearner\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l2=https://l2:2380,l3=https://l3:2380\n",
			wantChanges: []string{"remove 3 via https://l1:2379", "add https://l3:2380 learner=true via https://l1:2379"}, wantLists: 6},
		{name: "already added, not started: starts as that member, adds nothing", machine: 3, up: urls[:1],
			members:   []Member{voter(1), {ID: 100, PeerURLs: []string{peer(3)}, IsLearner: true}},
			wantEnv:   "# Written by liken-node before etcd starts: StartAdded\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l3=https://l3:2380\n",
			wantLists: 3},
		{name: "data present: starts with it, asking no one", machine: 1, data: true, up: urls, members: []Member{voter(2)},
			wantEnv:   "# Written by liken-node before etcd starts: StartWithData\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380\n",
			wantLists: 0},
		{name: "restart, still a member: starts with its data", machine: 3, data: true, restart: true, up: urls[:1], members: []Member{voter(1), voter(3)},
			wantEnv:   "# Written by liken-node before etcd starts: StartWithData\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l3=https://l3:2380\n",
			wantLists: 3},
		{name: "restart, one leader of two voters lists no such member: proves nothing, starts with its data", machine: 3, data: true, restart: true, up: urls[:1], members: []Member{voter(1), voter(2)},
			wantEnv:   "# Written by liken-node before etcd starts: StartWithData\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l3=https://l3:2380\n",
			wantLists: 3},
		{name: "restart, the member was removed: data aside, joins", machine: 3, data: true, restart: true, up: urls[:2], members: []Member{voter(1), voter(2)},
			wantEnv:     "# Written by liken-node before etcd starts: JoinAsLearner\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l1=https://l1:2380,l2=https://l2:2380,l3=https://l3:2380\n",
			wantChanges: []string{"add https://l3:2380 learner=true via https://l1:2379"}, wantLists: 6, wantAside: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			dataDir := filepath.Join(dir, "etcd")
			assert.NilError(t, os.Mkdir(dataDir, 0o700))
			if tc.data {
				assert.NilError(t, os.MkdirAll(filepath.Join(dataDir, "member", "wal"), 0o700))
				assert.NilError(t, os.WriteFile(filepath.Join(dataDir, "member", "wal", "0.wal"), []byte("log"), 0o600))
			}
			fake := &fakeEtcd{up: map[string]bool{}, noData: map[string]bool{}, members: tc.members, addErrs: tc.addErrs, addLost: tc.addLost}
			for _, u := range tc.noData {
				fake.noData[u] = true
			}
			for _, u := range tc.up {
				fake.up[u] = true
			}
			clk := clocktesting.NewFakeClock(now)
			env := filepath.Join(dir, "etcd.env")
			o := StartOptions{
				Name: fmt.Sprintf("l%d", tc.machine), PeerURL: peer(tc.machine), ClientURL: client(tc.machine), FirstLeader: tc.machine == 1,
				ClientURLs: urls, Etcd: fake, Data: DiskData{Dir: dataDir}, Restart: tc.restart,
				Endpoint: probeFunc(func() bool { return tc.apiAnswer }),
				EnvFile:  env, Clock: clk,
			}
			d, err, waited := runStart(t, o, clk)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
			} else {
				assert.NilError(t, err)
			}
			assert.Equal(t, waited, tc.wantWaited)
			assert.DeepEqual(t, fake.changes, tc.wantChanges)
			if tc.wantLists >= 0 {
				assert.Equal(t, fake.lists, tc.wantLists)
			}
			b, err := os.ReadFile(env)
			if tc.wantEnv == "" {
				assert.Check(t, errors.Is(err, os.ErrNotExist), "etcd.env written while etcd must not start: %s", b)
			} else {
				assert.NilError(t, err)
				// A new datastore's token is random: its own cluster and
				// member IDs.
				if d.Action == Bootstrap {
					assert.Check(t, is.Regexp(`^liken-[0-9a-f]{16}$`, d.InitialClusterToken))
					b = bytes.Replace(b, []byte(d.InitialClusterToken), []byte("liken-<random>"), 1)
				} else {
					assert.Check(t, is.Equal(d.InitialClusterToken, ""), "a token for a datastore that exists")
				}
				assert.Equal(t, string(b), tc.wantEnv)
				assert.Equal(t, d.InitialCluster+"\n", string(b[len(b)-len(d.InitialCluster)-1:]))
			}
			aside := filepath.Join(dataDir, "removed-20261202T120000Z")
			if tc.wantAside {
				b, err := os.ReadFile(filepath.Join(aside, "member", "wal", "0.wal"))
				assert.NilError(t, err, "the removed member's data is kept")
				assert.Equal(t, string(b), "log")
				present, err := DiskData{Dir: dataDir}.Present()
				assert.NilError(t, err)
				assert.Check(t, !present, "the removed member's data is out of etcd's way")
			} else {
				_, err := os.Stat(aside)
				assert.Check(t, errors.Is(err, os.ErrNotExist), "data moved aside: %v", err)
			}
		})
	}
}

// A member list with a name systemd would misread (another member's name,
// from the network) fails the write midway: etcd.env stays as it was,
// with no half-written file beside it.
func TestStartFailedWriteLeavesEnvFile(t *testing.T) {
	dir := t.TempDir()
	env := filepath.Join(dir, "etcd.env")
	old := "# Written by liken-node before etcd starts: StartWithData\nETCD_INITIAL_CLUSTER_STATE=existing\nETCD_INITIAL_CLUSTER=l3=https://l3:2380\n"
	assert.NilError(t, os.WriteFile(env, []byte(old), 0o600))
	bad := voter(1)
	bad.Name = "l1\nETCD_NAME=evil"
	fake := &fakeEtcd{up: map[string]bool{client(1): true}, members: []Member{bad}}
	clk := clocktesting.NewFakeClock(time.Now())
	_, err, _ := runStart(t, StartOptions{Name: "l3", PeerURL: peer(3), ClientURLs: []string{client(1)}, Etcd: fake,
		Data: DiskData{Dir: filepath.Join(dir, "etcd")}, EnvFile: env, Clock: clk}, clk)
	assert.ErrorContains(t, err, "writing etcd's environment "+env+": ETCD_INITIAL_CLUSTER: ")
	b, err := os.ReadFile(env)
	assert.NilError(t, err)
	assert.Equal(t, string(b), old)
	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 1, "a half-written file is left: %v", entries)
}

func TestStartRefusesAnUnwritableIdentity(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), StartOptions{Name: "l 3", PeerURL: peer(3), Etcd: &fakeEtcd{},
		Data: DiskData{Dir: dir}, EnvFile: filepath.Join(dir, "etcd.env")})
	assert.ErrorContains(t, err, `the machine's name and peer URL: "l 3=https://l3:2380" holds " "`)
	_, err = Start(context.Background(), StartOptions{Name: "l1", PeerURL: peer(1), FirstLeader: true, Etcd: &fakeEtcd{},
		Data: DiskData{Dir: dir}, EnvFile: filepath.Join(dir, "etcd.env")})
	assert.ErrorContains(t, err, "the first leader needs the endpoint")
}

func TestEndpointProbe(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Check(t, r.URL.Path == "/readyz", "path %s", r.URL.Path)
		http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake refused by the untrusting probe
	srv.StartTLS()
	defer srv.Close()
	trusted := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	other := httptest.NewTLSServer(http.NotFoundHandler())
	closed := other.URL
	other.Close()
	for _, tc := range []struct {
		name    string
		url     string
		trusted bool
		want    bool
	}{
		{name: "an API server that is not ready answers", url: srv.URL, trusted: true, want: true},
		{name: "a server of another CA does not", url: srv.URL, want: false},
		{name: "nobody listening does not", url: closed, trusted: true, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := x509.NewCertPool()
			if tc.trusted {
				pool = trusted
			}
			p := NewEndpointProbe(tc.url, pool)
			assert.Equal(t, p.Answers(context.Background()), tc.want)
		})
	}
}

// TestChooseDatastore: etcd-start acts on the datastore recorded for the
// member, whoever else answers; with none recorded, on the one datastore
// every answer names, and on none when they name two.
func TestChooseDatastore(t *testing.T) {
	f, r := []Member{voter(1), voter(2), voter(3)}, []Member{voter(1)}
	answer := func(n int, cluster uint64, ms []Member) datastoreAnswer {
		return datastoreAnswer{from: client(n), cluster: cluster, members: ms}
	}
	for _, tc := range []struct {
		name     string
		answers  []datastoreAnswer
		recorded uint64
		from     string // "" for none
		live     int
		unsure   string
	}{
		{name: "nobody answers"},
		{name: "one datastore", answers: []datastoreAnswer{answer(1, 0xf, f), answer(2, 0xf, f)}, from: client(1), live: 2},
		{name: "two datastores, none recorded: none", answers: []datastoreAnswer{answer(1, 0xa, r), answer(3, 0xf, f)},
			unsure: "the leaders answer for 2 datastores (datastore a (members: l1) at https://l1:2379; datastore f (members: l1, l2, l3) at https://l3:2379), and this member has no record of its own: etcd waits until the leaders of one are down or installed again (liken install)"},
		{name: "two datastores, the recorded one wins though asked second", answers: []datastoreAnswer{answer(1, 0xa, r), answer(3, 0xf, f)}, recorded: 0xf, from: client(3), live: 1},
		{name: "only another datastore answers: none", answers: []datastoreAnswer{answer(1, 0xa, r)}, recorded: 0xf,
			unsure: "this member belongs to datastore f, and no leader that answers belongs to it (datastore a (members: l1) at https://l1:2379): etcd waits for a leader of its own datastore and never joins another"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unsure := chooseDatastore(tc.answers, tc.recorded)
			if tc.from == "" {
				assert.Check(t, is.Len(got, 0), "chose %+v", got)
			} else {
				assert.Assert(t, len(got) > 0)
				assert.Equal(t, got[0].from, tc.from)
			}
			assert.Equal(t, len(got), tc.live)
			assert.Equal(t, unsure, tc.unsure)
		})
	}
}

// TestDatastoreRecord: the member's datastore is recorded beside its data,
// kept when the data moves aside, and a damaged record says what to do.
func TestDatastoreRecord(t *testing.T) {
	d := DiskData{Dir: filepath.Join(t.TempDir(), "etcd")}
	id, err := d.Datastore()
	assert.NilError(t, err)
	assert.Equal(t, id, uint64(0))
	assert.NilError(t, d.Remember(0xc0ffee))
	assert.NilError(t, os.MkdirAll(filepath.Join(d.Dir, "member"), 0o700))
	_, err = d.MoveAside(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
	assert.NilError(t, err)
	id, err = d.Datastore()
	assert.NilError(t, err)
	assert.Equal(t, id, uint64(0xc0ffee))
	assert.NilError(t, os.WriteFile(filepath.Join(d.Dir, DatastoreFile), []byte("zz\n"), 0o600))
	_, err = d.Datastore()
	assert.ErrorContains(t, err, `liken-datastore does not hold a datastore ID ("zz"): remove it, and etcd-start asks the leaders`)
	// A member that starts a new datastore forgets the old one.
	assert.NilError(t, d.Forget())
	id, err = d.Datastore()
	assert.NilError(t, err)
	assert.Equal(t, id, uint64(0))
	assert.NilError(t, d.Forget(), "forgetting twice")
}
