// Package nodeclients approves a kubelet client certificate only for the machine whose name it carries, and denies every other request with a reason.
package nodeclients

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// Condition reasons of the requests this controller decides (kubectl get
// csr shows the condition; kubectl describe csr its reason and message).
const (
	// ReasonOwnJoinToken approves a request of the join token bound to the
	// name it asks for.
	ReasonOwnJoinToken = "LikenOwnJoinToken"
	// ReasonOwnCertificate approves a machine renewing its own certificate.
	ReasonOwnCertificate = "LikenOwnCertificate"
	// ReasonFleetJoinToken approves a request of a fleet's shared join
	// token for a Machine that exists.
	ReasonFleetJoinToken = "LikenFleetJoinToken"
	// ReasonAnotherMachine denies a request for another machine's name.
	ReasonAnotherMachine = "LikenAnotherMachine"
	// ReasonNoSuchMachine keeps a request for a name no Machine has
	// pending, until the Machine is created.
	ReasonNoSuchMachine = "LikenNoSuchMachine"
	// ReasonNotAMachine denies a request from someone who is neither a
	// join token nor a machine.
	ReasonNotAMachine = "LikenNotAMachine"
	// ReasonMalformed denies a request that is not a kubelet client
	// certificate request.
	ReasonMalformed = "LikenNotAKubeletClientRequest"
)

// Kubernetes' names this controller reads.
const (
	nodeUserPrefix      = "system:node:"
	nodesGroup          = "system:nodes"
	bootstrapUserPrefix = "system:bootstrap:"
	bootstrappersGroup  = "system:bootstrappers"
)

// Verdict is what to do with one request.
type Verdict struct {
	// Approve approves the request; otherwise it is denied, unless Wait.
	Approve bool
	// Wait leaves the request pending: it would be approved, but no
	// Machine has the name yet. The machine's kubelet and liken-node wait
	// for the answer, so creating the Machine lets them join.
	Wait bool
	// Machine is the name the request asks for ("" when it names none).
	Machine string
	// Reason is the condition's reason, one of the Reason constants.
	Reason string
	// Message says why, for the person reading kubectl describe csr.
	Message string
}

// Machines is what Decide knows of the fleet's Machines.
type Machines interface {
	// Exists reports whether a Machine has this name.
	Exists(name string) bool
	// BoundTo names the Machine whose join token authenticates in group
	// (likenv1.JoinGroup), or "" when none does.
	BoundTo(group string) string
}

// Decide decides a kubelet client certificate request
// (kubernetes.io/kube-apiserver-client-kubelet). It approves the request
// only when it asks for system:node:NAME of a Machine that exists, and its
// requester is the join token bound to NAME, the fleet's shared join token,
// or machine NAME itself renewing its certificate; it waits while such a
// request names no Machine yet, and denies every other.
// ok is false when the request is not this controller's to decide: another
// signer's, or already approved or denied.
func Decide(csr *certificatesv1.CertificateSigningRequest, machines Machines) (v Verdict, ok bool) {
	if csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName || decided(csr) {
		return Verdict{}, false
	}
	name, err := requestedMachine(csr)
	if err != nil {
		return Verdict{Reason: ReasonMalformed, Message: "denied by cluster-operator: not a kubelet client certificate request: " + err.Error()}, true
	}
	v = Verdict{Machine: name}
	user, groups := csr.Spec.Username, csr.Spec.Groups
	deny := func(reason, msg string, args ...any) (Verdict, bool) {
		v.Reason, v.Message = reason, "denied by cluster-operator: "+fmt.Sprintf(msg, args...)
		return v, true
	}
	approve := func(reason, msg string, args ...any) (Verdict, bool) {
		if !machines.Exists(name) {
			v.Wait, v.Reason, v.Message = true, ReasonNoSuchMachine, fmt.Sprintf("waiting for Machine %s: no Machine has that name yet; create it (kubectl apply -f its Machine document), and the request is approved", name)
			return v, true
		}
		v.Approve, v.Reason, v.Message = true, reason, "approved by cluster-operator: "+fmt.Sprintf(msg, args...)
		return v, true
	}
	switch {
	case strings.HasPrefix(user, nodeUserPrefix) && slices.Contains(groups, nodesGroup):
		if user != nodeUserPrefix+name {
			return deny(ReasonAnotherMachine, "machine %s may renew only its own certificate, not ask for %s%s's", strings.TrimPrefix(user, nodeUserPrefix), nodeUserPrefix, name)
		}
		return approve(ReasonOwnCertificate, "machine %s renews its own certificate", name)
	case strings.HasPrefix(user, bootstrapUserPrefix) && slices.Contains(groups, bootstrappersGroup):
		if slices.Contains(groups, likenv1.JoinGroup(name)) {
			return approve(ReasonOwnJoinToken, "the join token of machine %s asked for its own name", name)
		}
		for _, g := range groups {
			if !strings.HasPrefix(g, likenv1.JoinGroupPrefix) {
				continue
			}
			owner := machines.BoundTo(g)
			if owner == "" {
				owner = "a machine that no longer exists"
			}
			return deny(ReasonAnotherMachine, "the join token %s is bound to %s and may ask only for that machine's certificate, not for %s%s's: a machine's disk holds its own token only, so this request comes from elsewhere (a copied disk or layer); find who holds token %s",
				strings.TrimPrefix(user, bootstrapUserPrefix), owner, nodeUserPrefix, name, strings.TrimPrefix(user, bootstrapUserPrefix))
		}
		if slices.Contains(groups, likenv1.FleetJoinGroup) {
			return approve(ReasonFleetJoinToken, "the fleet's shared join token asked for Machine %s", name)
		}
		return deny(ReasonNotAMachine, "the bootstrap token %s is bound to no machine (its Secret's auth-extra-groups hold no %s<hash> group): liken layer pack gives each machine a token of its own",
			strings.TrimPrefix(user, bootstrapUserPrefix), likenv1.JoinGroupPrefix)
	}
	return deny(ReasonNotAMachine, "%s%s's certificate is given only to the join token bound to %s or to the machine itself renewing it, and %s is neither", nodeUserPrefix, name, name, user)
}

// decided reports whether the request was already approved or denied (or
// failed): then there is nothing to decide.
func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			if c.Status == corev1.ConditionTrue || c.Status == "" {
				return true
			}
		}
	}
	return false
}

// requestedMachine checks that the request asks for a kubelet client
// certificate, as a kubelet asks for one (subject system:node:NAME in
// organization system:nodes, no other name, client authentication), and
// returns NAME.
func requestedMachine(csr *certificatesv1.CertificateSigningRequest) (string, error) {
	blk, _ := pem.Decode(csr.Spec.Request)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("spec.request is not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("spec.request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return "", fmt.Errorf("spec.request is not signed by its own key: %w", err)
	}
	name, ok := strings.CutPrefix(req.Subject.CommonName, nodeUserPrefix)
	if !ok || name == "" {
		return "", fmt.Errorf("the subject's common name %q is not %s<machine>", req.Subject.CommonName, nodeUserPrefix)
	}
	if !slices.Equal(req.Subject.Organization, []string{nodesGroup}) {
		return "", fmt.Errorf("the subject's organizations are %q, not [%s]", req.Subject.Organization, nodesGroup)
	}
	if len(req.DNSNames)+len(req.EmailAddresses)+len(req.IPAddresses)+len(req.URIs) > 0 {
		return "", errors.New("it names hosts, addresses or URIs besides the subject: a client certificate names none")
	}
	client := false
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageClientAuth:
			client = true
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		default:
			return "", fmt.Errorf("it asks for usage %q: a kubelet client certificate has only digital signature, key encipherment and client auth", u)
		}
	}
	if !client {
		return "", errors.New("it does not ask for client auth")
	}
	return name, nil
}
