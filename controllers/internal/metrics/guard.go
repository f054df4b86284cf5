package metrics

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ReaderRole is the ClusterRole (manifests/20-rbac-operator.yaml) that
// lets an identity read /metrics; bind a scraper's service account to it.
const ReaderRole = "liken:metrics-reader"

// GuardCacheFor is how long an allowed token is remembered, so that a
// scraper costs the API server two reviews per token at most this often.
const GuardCacheFor = 10 * time.Second

// guardCacheSize bounds the tokens remembered: past it, the cache starts
// over.
const guardCacheSize = 1024

// Guard serves next only to a bearer token the API server authenticates and
// authorizes for the path, remembering allowed tokens for GuardCacheFor on
// clk and never failing open (docs/reference/operator.md#metrics-and-health).
func Guard(next http.Handler, authn authenticationv1client.TokenReviewsGetter, authz authorizationv1client.SubjectAccessReviewsGetter, clk clock.PassiveClock) http.Handler {
	return &guard{next: next, authn: authn, authz: authz, clock: clk, allowed: map[[32]byte]time.Time{}}
}

type guard struct {
	next  http.Handler
	authn authenticationv1client.TokenReviewsGetter
	authz authorizationv1client.SubjectAccessReviewsGetter
	clock clock.PassiveClock

	mu      sync.Mutex
	allowed map[[32]byte]time.Time // sha256 of token and path: until when
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		http.Error(w, fmt.Sprintf("cluster-operator serves %s only to an identity of the cluster: send its bearer token in the Authorization header (a service account token bound to the ClusterRole %s)", r.URL.Path, ReaderRole), http.StatusUnauthorized)
		return
	}
	key := sha256.Sum256([]byte(token + "\x00" + r.URL.Path))
	now := g.clock.Now()
	g.mu.Lock()
	until, known := g.allowed[key]
	g.mu.Unlock()
	if known && now.Before(until) {
		g.next.ServeHTTP(w, r)
		return
	}
	code, msg := g.review(r.Context(), token, r.URL.Path)
	if code != http.StatusOK {
		http.Error(w, msg, code)
		return
	}
	g.mu.Lock()
	if len(g.allowed) >= guardCacheSize {
		clear(g.allowed)
	}
	g.allowed[key] = now.Add(GuardCacheFor)
	g.mu.Unlock()
	g.next.ServeHTTP(w, r)
}

// review returns http.StatusOK when the token's identity may get path, or
// the status and message of the refusal.
func (g *guard) review(ctx context.Context, token, path string) (int, string) {
	logger := klog.FromContext(ctx)
	tr, err := g.authn.TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		logger.Error(err, "Cannot check a metrics scraper's token", "path", path)
		return http.StatusInternalServerError, "cluster-operator cannot check the token with the API server (TokenReview): " + err.Error()
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, fmt.Sprintf("the API server does not accept this token (%s): send a valid service account token", orNone(tr.Status.Error))
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.authz.SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		logger.Error(err, "Cannot check a metrics scraper's permission", "user", u.Username, "path", path)
		return http.StatusInternalServerError, "cluster-operator cannot check the permission with the API server (SubjectAccessReview): " + err.Error()
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden, fmt.Sprintf("%s may not get %s: bind it to the ClusterRole %s", u.Username, path, ReaderRole)
	}
	return http.StatusOK, ""
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}
