package bench

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// APICounter is a reverse proxy in front of the API server that counts
// every request passing through it by verb and resource. A process whose
// kubeconfig points at it (Kubeconfig) is measured exactly, whatever
// metrics it exports. It adds one loopback hop to each request.
type APICounter struct {
	// URL is the proxy's address (HTTPS on loopback, its own certificate).
	URL string

	srv    *httptest.Server
	caPEM  []byte
	mu     sync.Mutex
	counts map[Request]int
}

// Request is one kind of API request.
type Request struct {
	// Verb is get, list, watch, create, update, patch, delete or
	// deletecollection.
	Verb string
	// Resource is the resource, with its subresource after a slash
	// (machines/status).
	Resource string
}

// IsWrite is true for create, update, patch and delete (a conflict
// counts once as the write it was, and once more as "VERB (conflict)").
func (r Request) IsWrite() bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// String is "VERB RESOURCE".
func (r Request) String() string { return r.Verb + " " + r.Resource }

// StartAPICounter starts a counting proxy to the API server that cfg
// reaches, with cfg's TLS settings. Clients' bearer tokens pass through;
// a TLS proxy cannot pass on its clients' certificates, so it presents
// cfg's client certificate, if any, for every request: a counter made with
// a machine's certificate serves that one machine.
func StartAPICounter(cfg *rest.Config) (*APICounter, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	upstream := rest.AnonymousClientConfig(cfg)
	upstream.CertData, upstream.KeyData = cfg.CertData, cfg.KeyData
	upstream.CertFile, upstream.KeyFile = cfg.CertFile, cfg.KeyFile
	rt, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	c := &APICounter{counts: map[Request]int{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport: rt,
		// Watches stream: pass every event on at once.
		FlushInterval: -1,
	}
	// TLS, as the API server: client-go sends a kubeconfig's credentials
	// only over TLS.
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := Classify(r.Method, r.URL)
		c.count(req)
		rec := &statusRecorder{ResponseWriter: w}
		proxy.ServeHTTP(rec, r)
		if rec.status == http.StatusConflict {
			req.Verb += " (conflict)"
			c.count(req)
		}
	}))
	c.srv.EnableHTTP2 = true
	c.srv.StartTLS()
	c.URL = c.srv.URL
	c.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.srv.Certificate().Raw})
	return c, nil
}

// statusRecorder notes the status code of a response.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

// WriteHeader notes the code and passes it on.
func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets the proxy flush watch events through the recorder.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Close stops the proxy, cutting the connections of its clients (their
// watches too). The server's own Close goes first: it shuts the listener
// and every connection at once, while httptest's Close alone waits for
// the requests of a client that reconnected in the meantime (a node
// daemon's watch, which never ends).
func (c *APICounter) Close() {
	_ = c.srv.Config.Close()
	c.srv.Close()
}

func (c *APICounter) count(r Request) {
	c.mu.Lock()
	c.counts[r]++
	c.mu.Unlock()
}

// Snapshot returns the counts so far.
func (c *APICounter) Snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(Counts, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// WriteKubeconfig writes a kubeconfig that reaches the API server through
// the proxy with the credentials of cfg (its bearer token, or its client
// certificate and key).
func (c *APICounter) WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["liken"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.caPEM}
	// A certificate goes in too: its holder checks it is its own, and the
	// proxy presents it upstream.
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile}
	kc.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: "user"}
	kc.CurrentContext = "liken"
	return clientcmd.WriteToFile(*kc, path)
}

// Counts are request counts by kind.
type Counts map[Request]int

// Sub is c minus an earlier snapshot.
func (c Counts) Sub(earlier Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - earlier[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Total is the number of requests that match (all when match is nil).
func (c Counts) Total(match func(Request) bool) int {
	n := 0
	for k, v := range c {
		if match == nil || match(k) {
			n += v
		}
	}
	return n
}

// Writes is the number of writes.
func (c Counts) Writes() int { return c.Total(Request.IsWrite) }

// String lists the counts, most frequent first: "12 update leases, ...".
func (c Counts) String() string {
	keys := make([]Request, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Request) int {
		if c[a] != c[b] {
			return c[b] - c[a]
		}
		return strings.Compare(a.String(), b.String())
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", c[k], k))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Classify names the verb and resource of an API request from its method
// and URL (/api/v1/... or /apis/GROUP/VERSION/..., namespaced or not).
func Classify(method string, u *url.URL) Request {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return Request{Verb: strings.ToLower(method), Resource: "nonresource:" + u.Path}
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) != 2 {
		rest = rest[2:] // namespaces/NS/RESOURCE...
	}
	resource, named := "", false
	switch len(rest) {
	case 0:
		resource = "discovery"
	case 1:
		resource = rest[0]
	case 2:
		resource, named = rest[0], true
	default:
		resource, named = rest[0]+"/"+rest[2], true
	}
	verb := ""
	switch method {
	case http.MethodGet:
		switch {
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(method)
	}
	return Request{Verb: verb, Resource: resource}
}
