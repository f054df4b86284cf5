package nodeclients

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// fleet is a Machines of fixed names.
type fleet []string

func (f fleet) Exists(name string) bool {
	for _, n := range f {
		if n == name {
			return true
		}
	}
	return false
}

func (f fleet) BoundTo(group string) string {
	for _, n := range f {
		if likenv1.JoinGroup(n) == group {
			return n
		}
	}
	return ""
}

// request is a CSR's x509 request, made with a new key.
func request(t *testing.T, tmpl x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	assert.NilError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	assert.NilError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func kubeletRequest(t *testing.T, machine string) []byte {
	return request(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + machine, Organization: []string{"system:nodes"}}})
}

var clientUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}

func csr(req []byte, user string, groups ...string) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		Request: req, SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
		Usages: clientUsages, Username: user, Groups: append(groups, "system:authenticated"),
	}}
}

// token is the user and groups a bootstrap token bound to machine
// authenticates as.
func token(machine string) (string, []string) {
	return "system:bootstrap:abcdef", []string{"system:bootstrappers", likenv1.JoinGroup(machine)}
}

func TestDecide(t *testing.T) {
	machines := fleet{"leader-1", "leader-2", "worker-1", "rack1.worker-2"}
	w1User, w1Groups := token("worker-1")
	goneUser, goneGroups := token("worker-9")
	dotUser, dotGroups := token("rack1.worker-2")
	for _, tc := range []struct {
		name    string
		csr     *certificatesv1.CertificateSigningRequest
		approve bool
		wait    bool
		reason  string
		message string
	}{
		{
			name: "its own token, its own name", csr: csr(kubeletRequest(t, "worker-1"), w1User, w1Groups...),
			approve: true, reason: ReasonOwnJoinToken, message: "approved by cluster-operator: the join token of machine worker-1 asked for its own name",
		},
		{
			name: "a name with dots", csr: csr(kubeletRequest(t, "rack1.worker-2"), dotUser, dotGroups...),
			approve: true, reason: ReasonOwnJoinToken,
		},
		{
			name: "a worker's token asks for a leader's name", csr: csr(kubeletRequest(t, "leader-2"), w1User, w1Groups...),
			reason: ReasonAnotherMachine, message: "the join token abcdef is bound to worker-1 and may ask only for that machine's certificate, not for system:node:leader-2's",
		},
		{
			name: "the token of a deleted Machine asks for another name", csr: csr(kubeletRequest(t, "leader-2"), goneUser, goneGroups...),
			reason: ReasonAnotherMachine, message: "is bound to a machine that no longer exists",
		},
		{
			name: "its own token, no Machine", csr: csr(kubeletRequest(t, "worker-9"), goneUser, goneGroups...),
			wait: true, reason: ReasonNoSuchMachine, message: "waiting for Machine worker-9: no Machine has that name yet",
		},
		{
			name: "renewal of its own name", csr: csr(kubeletRequest(t, "leader-1"), "system:node:leader-1", "system:nodes"),
			approve: true, reason: ReasonOwnCertificate, message: "machine leader-1 renews its own certificate",
		},
		{
			name: "renewal for another name", csr: csr(kubeletRequest(t, "leader-2"), "system:node:worker-1", "system:nodes"),
			reason: ReasonAnotherMachine, message: "machine worker-1 may renew only its own certificate, not ask for system:node:leader-2's",
		},
		{
			name: "the fleet's shared token", csr: csr(kubeletRequest(t, "worker-1"), "system:bootstrap:fleet1", "system:bootstrappers", likenv1.FleetJoinGroup),
			approve: true, reason: ReasonFleetJoinToken,
		},
		{
			name: "the fleet's shared token, no Machine", csr: csr(kubeletRequest(t, "worker-9"), "system:bootstrap:fleet1", "system:bootstrappers", likenv1.FleetJoinGroup),
			wait: true, reason: ReasonNoSuchMachine,
		},
		{
			name: "a bootstrap token bound to nothing", csr: csr(kubeletRequest(t, "worker-1"), "system:bootstrap:other1", "system:bootstrappers"),
			reason: ReasonNotAMachine, message: "the bootstrap token other1 is bound to no machine",
		},
		{
			name: "an administrator", csr: csr(kubeletRequest(t, "worker-1"), "admin", "system:masters"),
			reason: ReasonNotAMachine, message: "and admin is neither",
		},
		{
			name: "a service account", csr: csr(kubeletRequest(t, "worker-1"), "system:serviceaccount:liken-system:cluster-operator", "system:serviceaccounts"),
			reason: ReasonNotAMachine,
		},
		{
			name:   "extra names",
			csr:    csr(request(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}}, DNSNames: []string{"kubernetes.default"}}), w1User, w1Groups...),
			reason: ReasonMalformed, message: "names hosts, addresses or URIs",
		},
		{
			name:   "system:masters asked for",
			csr:    csr(request(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes", "system:masters"}}}), w1User, w1Groups...),
			reason: ReasonMalformed, message: `the subject's organizations are ["system:nodes" "system:masters"], not [system:nodes]`,
		},
		{
			name:   "not a node's name",
			csr:    csr(request(t, x509.CertificateRequest{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:nodes"}}}), w1User, w1Groups...),
			reason: ReasonMalformed, message: `the subject's common name "admin" is not system:node:<machine>`,
		},
		{
			name: "server auth asked for", csr: func() *certificatesv1.CertificateSigningRequest {
				c := csr(kubeletRequest(t, "worker-1"), w1User, w1Groups...)
				c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageServerAuth)
				return c
			}(),
			reason: ReasonMalformed, message: `it asks for usage "server auth"`,
		},
		{
			name: "not a request", csr: csr([]byte("not PEM"), w1User, w1Groups...),
			reason: ReasonMalformed, message: "spec.request is not a PEM certificate request",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := Decide(tc.csr, machines)
			assert.Assert(t, ok)
			assert.Equal(t, v.Approve, tc.approve, v.Message)
			assert.Equal(t, v.Wait, tc.wait, v.Message)
			assert.Equal(t, v.Reason, tc.reason)
			assert.Check(t, is.Contains(v.Message, tc.message))
		})
	}
}

func TestDecideLeavesWhatIsNotItsOwn(t *testing.T) {
	user, groups := token("worker-1")
	other := csr(kubeletRequest(t, "worker-1"), user, groups...)
	other.Spec.SignerName = certificatesv1.KubeAPIServerClientSignerName
	_, ok := Decide(other, fleet{"worker-1"})
	assert.Check(t, !ok, "another signer's request")

	for _, typ := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed} {
		done := csr(kubeletRequest(t, "leader-1"), user, groups...)
		done.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: typ, Status: corev1.ConditionTrue}}
		_, ok := Decide(done, fleet{"leader-1"})
		assert.Check(t, !ok, "a request already %s", typ)
	}
}
