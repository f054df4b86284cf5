package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultEtcdTimeout bounds each call of an EtcdClient whose Timeout is zero.
const DefaultEtcdTimeout = 5 * time.Second

// Member is a member of the datastore as etcd lists it. A member added but
// not started yet has no Name and no ClientURLs.
type Member struct {
	// ID is etcd's member ID.
	ID uint64
	// Name is the member's --name, this package's machine name; empty until
	// the member first starts.
	Name string
	// PeerURLs are the URLs the other members reach it at.
	PeerURLs []string
	// ClientURLs are the URLs it serves clients at; empty until it starts.
	ClientURLs []string
	// IsLearner is true for a member that does not vote yet.
	IsLearner bool
}

// EtcdClient calls etcd's JSON gateway (the /v3 HTTP API) and /health over
// HTTPS with a client certificate.
type EtcdClient struct {
	// HTTP carries the calls; its transport holds the TLS configuration.
	HTTP *http.Client
	// Timeout bounds each call, on top of the caller's context
	// (DefaultEtcdTimeout when zero).
	Timeout time.Duration
}

// NewEtcdClient returns a client that speaks TLS with tlsConfig: its
// RootCAs verify the members (etcd/server-ca) and its Certificates hold the
// client certificate they require.
func NewEtcdClient(tlsConfig *tls.Config) *EtcdClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConfig
	tr.Proxy = nil // members are reached directly, never through $HTTPS_PROXY
	return &EtcdClient{HTTP: &http.Client{Transport: tr}}
}

// NewEtcdClientFromFiles returns NewEtcdClient with the client certificate
// and key of certFile and keyFile and the CA certificates of caFile (PEM).
func NewEtcdClientFromFiles(certFile, keyFile, caFile string) (*EtcdClient, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the etcd client certificate %s and key %s: %w", certFile, keyFile, err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading etcd's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("etcd's CA file %s holds no PEM certificate", caFile)
	}
	return NewEtcdClient(&tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		MinVersion:   tls.VersionTLS12,
	}), nil
}

// MemberList returns the members the member at clientURL knows. The list
// is served from that member's own state (not linearizable), so a member
// cut off from quorum still answers: an answer proves a datastore exists.
func (c *EtcdClient) MemberList(ctx context.Context, clientURL string) ([]Member, error) {
	_, members, err := c.ClusterMembers(ctx, clientURL)
	return members, err
}

// ClusterMembers is MemberList with the ID of the datastore the member at
// clientURL belongs to (etcd's cluster ID, 0 when its answer had none):
// two members with different IDs belong to two datastores.
func (c *EtcdClient) ClusterMembers(ctx context.Context, clientURL string) (uint64, []Member, error) {
	var resp membersResponse
	if err := c.post(ctx, clientURL, "/v3/cluster/member/list", struct{}{}, &resp); err != nil {
		return 0, nil, err
	}
	return uint64(resp.Header.ClusterID), resp.list(), nil
}

// HoldsMemberData asks the leader at clientURL whether it holds member
// data. While its etcd does not run, its etcd-start answers at
// MemberDataPath; a running etcd holds data (it answers 404 there).
func (c *EtcdClient) HoldsMemberData(ctx context.Context, clientURL string) (bool, error) {
	u := strings.TrimSuffix(clientURL, "/") + MemberDataPath
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return false, fmt.Errorf("asking %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return false, fmt.Errorf("asking %s: reading the answer: %w", u, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return true, nil // etcd itself runs there
	}
	var a memberDataAnswer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil {
		return false, fmt.Errorf("asking %s: HTTP %d: %s", u, resp.StatusCode, snippet(body))
	}
	return a.MemberData, nil
}

// MemberAdd adds a member with peerURL through the member at clientURL,
// as a learner when learner is true, and returns the new member (ID set,
// no name yet) and the members after the addition.
func (c *EtcdClient) MemberAdd(ctx context.Context, clientURL, peerURL string, learner bool) (Member, []Member, error) {
	req := struct {
		PeerURLs  []string `json:"peerURLs"`
		IsLearner bool     `json:"isLearner,omitempty"`
	}{PeerURLs: []string{peerURL}, IsLearner: learner}
	var resp struct {
		membersResponse
		Member *jsonMember `json:"member"`
	}
	if err := c.post(ctx, clientURL, "/v3/cluster/member/add", req, &resp); err != nil {
		return Member{}, nil, err
	}
	if resp.Member == nil || resp.Member.ID == 0 {
		return Member{}, nil, fmt.Errorf("etcd at %s added %s but did not answer the new member's ID", clientURL, peerURL)
	}
	return resp.Member.member(), resp.list(), nil
}

// MemberRemove removes the member id through the member at clientURL and
// returns the members left.
func (c *EtcdClient) MemberRemove(ctx context.Context, clientURL string, id uint64) ([]Member, error) {
	var resp membersResponse
	if err := c.post(ctx, clientURL, "/v3/cluster/member/remove", idRequest{ID: jsonUint64(id)}, &resp); err != nil {
		return nil, err
	}
	return resp.list(), nil
}

// MemberPromote makes the learner id a voter through the member at
// clientURL and returns the members after. etcd refuses while the learner
// lags behind the leader.
func (c *EtcdClient) MemberPromote(ctx context.Context, clientURL string, id uint64) ([]Member, error) {
	var resp membersResponse
	if err := c.post(ctx, clientURL, "/v3/cluster/member/promote", idRequest{ID: jsonUint64(id)}, &resp); err != nil {
		return nil, err
	}
	return resp.list(), nil
}

// Health reports whether the member at clientURL is healthy (its /health
// says true: it has a leader and serves reads). When it is not, the error
// says why: no answer, or etcd's reason.
func (c *EtcdClient) Health(ctx context.Context, clientURL string) (bool, error) {
	u := strings.TrimSuffix(clientURL, "/") + "/health"
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("etcd health at %s: %w", u, err)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return false, fmt.Errorf("etcd health at %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return false, fmt.Errorf("etcd health at %s: reading the answer: %w", u, err)
	}
	var h struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(body), &h); err != nil || h.Health == "" {
		return false, fmt.Errorf("etcd health at %s: HTTP %d and no health document: %s", u, resp.StatusCode, snippet(body))
	}
	if h.Health != "true" || resp.StatusCode != http.StatusOK {
		reason := h.Reason
		if reason == "" {
			reason = "no reason given"
		}
		return false, fmt.Errorf("etcd at %s is unhealthy (HTTP %d): %s", clientURL, resp.StatusCode, reason)
	}
	return true, nil
}

// post sends body as JSON to clientURL+path and decodes a 2xx answer into
// out; any other answer becomes an error naming the URL and etcd's message.
func (c *EtcdClient) post(ctx context.Context, clientURL, path string, body, out any) error {
	u := strings.TrimSuffix(clientURL, "/") + path
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", u, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("etcd at %s: %w", u, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("etcd at %s: reading the answer: %w", u, err)
	}
	if resp.StatusCode/100 != 2 {
		// The gateway answers a failed call with a gRPC status:
		// {"code": 9, "message": "etcdserver: ..."}; older releases also
		// set "error".
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		msg := snippet(answer)
		if json.Unmarshal(answer, &e) == nil && (e.Message != "" || e.Error != "") {
			msg = e.Message
			if msg == "" {
				msg = e.Error
			}
		}
		return fmt.Errorf("etcd at %s answered HTTP %d: %s", u, resp.StatusCode, msg)
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("etcd at %s: the answer is not what etcd's gateway sends (%v): %s", u, err, snippet(answer))
	}
	return nil
}

// deadline bounds a call by Timeout within ctx.
func (c *EtcdClient) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	t := c.Timeout
	if t <= 0 {
		t = DefaultEtcdTimeout
	}
	return context.WithTimeout(ctx, t)
}

// snippet shortens an answer for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		s = "(empty)"
	}
	return s
}

// The gateway's JSON: protobuf field names, 64-bit integers as strings,
// fields at their zero value omitted.

type idRequest struct {
	ID jsonUint64 `json:"ID"`
}

type membersResponse struct {
	Header struct {
		ClusterID jsonUint64 `json:"cluster_id"`
	} `json:"header"`
	Members []jsonMember `json:"members"`
}

func (r membersResponse) list() []Member {
	out := make([]Member, 0, len(r.Members))
	for _, m := range r.Members {
		out = append(out, m.member())
	}
	return out
}

type jsonMember struct {
	ID         jsonUint64 `json:"ID"`
	Name       string     `json:"name"`
	PeerURLs   []string   `json:"peerURLs"`
	ClientURLs []string   `json:"clientURLs"`
	IsLearner  bool       `json:"isLearner"`
}

func (m jsonMember) member() Member {
	return Member{ID: uint64(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner}
}

// jsonUint64 is a uint64 written as a JSON string, read from a string or
// a number.
type jsonUint64 uint64

func (v jsonUint64) MarshalJSON() ([]byte, error) {
	return json.Marshal(strconv.FormatUint(uint64(v), 10))
}

func (v *jsonUint64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("not an unsigned 64-bit integer: " + string(b))
	}
	*v = jsonUint64(n)
	return nil
}
