package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeAPI answers reviews: tokens maps a token to its user, allowed the
// users that may get /metrics; down makes every review fail.
type fakeAPI struct {
	tokens  map[string]string
	allowed map[string]bool
	down    bool
	reviews int
}

func (a *fakeAPI) clientset() *kubefake.Clientset {
	cs := kubefake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a.reviews++
		if a.down {
			return true, nil, errors.New("connection refused")
		}
		tr := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		if u, ok := a.tokens[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: u, Groups: []string{"system:serviceaccounts"}}}
		} else {
			tr.Status.Error = "invalid bearer token"
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a.reviews++
		sar := action.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		nr := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = a.allowed[sar.Spec.User] && nr != nil && nr.Verb == "get" && nr.Path == "/metrics"
		return true, sar, nil
	})
	return cs
}

func TestGuard(t *testing.T) {
	const scraper, other = "system:serviceaccount:monitoring:prometheus", "system:serviceaccount:default:app"
	for _, tc := range []struct {
		name   string
		header string
		down   bool
		code   int
		body   string
	}{
		{"no token", "", false, http.StatusUnauthorized, "send its bearer token"},
		{"not a bearer token", "Basic YWRtaW46YWRtaW4=", false, http.StatusUnauthorized, "ClusterRole liken:metrics-reader"},
		{"unknown token", "Bearer forged", false, http.StatusUnauthorized, "does not accept this token (invalid bearer token)"},
		{"identity without the role", "Bearer app-token", false, http.StatusForbidden, other + " may not get /metrics: bind it to the ClusterRole liken:metrics-reader"},
		{"scraper", "Bearer scraper-token", false, http.StatusOK, "liken_operator_up 1"},
		{"API server unreachable", "Bearer scraper-token", true, http.StatusInternalServerError, "cannot check the token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{tokens: map[string]string{"scraper-token": scraper, "app-token": other}, allowed: map[string]bool{scraper: true}, down: tc.down}
			cs := api.clientset()
			h := Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("liken_operator_up 1\n")) }),
				cs.AuthenticationV1(), cs.AuthorizationV1(), clocktesting.NewFakePassiveClock(time.Now()))
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			h.ServeHTTP(rec, req)
			assert.Check(t, is.Equal(rec.Code, tc.code))
			assert.Check(t, is.Contains(rec.Body.String(), tc.body))
		})
	}
}

// TestGuardRemembersOnlyAllowedTokens: a scraper costs two reviews per
// GuardCacheFor; a refused token is asked about every time.
func TestGuardRemembersOnlyAllowedTokens(t *testing.T) {
	api := &fakeAPI{tokens: map[string]string{"scraper-token": "scraper", "app-token": "app"}, allowed: map[string]bool{"scraper": true}}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	cs := api.clientset()
	h := Guard(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cs.AuthenticationV1(), cs.AuthorizationV1(), clk)
	get := func(token string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	assert.Equal(t, get("scraper-token"), http.StatusOK)
	assert.Equal(t, api.reviews, 2)
	clk.SetTime(clk.Now().Add(GuardCacheFor - time.Millisecond))
	assert.Equal(t, get("scraper-token"), http.StatusOK)
	assert.Equal(t, api.reviews, 2, "remembered")
	clk.SetTime(clk.Now().Add(time.Millisecond))
	assert.Equal(t, get("scraper-token"), http.StatusOK)
	assert.Equal(t, api.reviews, 4, "asked again after GuardCacheFor")

	for range 2 {
		assert.Equal(t, get("app-token"), http.StatusForbidden)
	}
	assert.Equal(t, api.reviews, 8, "a refusal is not remembered")

	// A token allowed once and revoked since is refused once the memory
	// is over.
	delete(api.allowed, "scraper")
	clk.SetTime(clk.Now().Add(GuardCacheFor))
	assert.Equal(t, get("scraper-token"), http.StatusForbidden)
}
