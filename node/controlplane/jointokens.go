package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// JoinTokensFile is the file, in a leader's directory next to ConfigFile,
// that lists the join token of each machine of the fleet: control-plane
// init makes each one a token of the cluster, once.
const JoinTokensFile = "join-tokens.yaml"

// Labels and annotations of the join tokens' Secrets.
const (
	// JoinTokenLabel marks the bootstrap token Secrets liken made:
	// kubectl get secrets -n kube-system -l liken.sh/join-token lists them.
	// Its value is "machine" for a machine's own token, "fleet" for a
	// fleet's shared one.
	JoinTokenLabel = "liken.sh/join-token"
	// JoinTokenMachineAnnotation names the machine a join token is bound to.
	JoinTokenMachineAnnotation = "liken.sh/machine"
)

// JoinTokens is the content of JoinTokensFile.
type JoinTokens struct {
	// Tokens are the machines' own join tokens, one per machine.
	Tokens []MachineToken `json:"tokens"`
}

// MachineToken is one machine's own join token: a Kubernetes bootstrap
// token that authenticates in the extra group likenv1.JoinGroup(Machine),
// so that cluster-operator approves with it only the certificate of that
// machine, and that the API server refuses after Expires.
type MachineToken struct {
	// Machine is the name of the machine the token is bound to.
	Machine string `json:"machine"`
	// Token is the bootstrap token, <id>.<secret>.
	Token string `json:"token"`
	// Expires is when the API server stops accepting the token.
	Expires time.Time `json:"expires"`
}

// Split returns the token's id and secret, or an error that never quotes
// the token.
func (t MachineToken) Split() (id, secret string, err error) {
	id, secret, _ = strings.Cut(t.Token, ".")
	if len(id) != 6 || len(secret) != 16 || !tokenChars(id) || !tokenChars(secret) {
		return "", "", fmt.Errorf("the join token of %s is not a bootstrap token <id>.<secret> of 6 and 16 characters of a-z, 0-9", t.owner())
	}
	return id, secret, nil
}

func (t MachineToken) owner() string {
	if t.Machine == "" {
		return "the fleet"
	}
	return "machine " + t.Machine
}

// Validate checks the fields of a machine's token.
func (t MachineToken) Validate() error {
	if t.Machine == "" {
		return errors.New("a join token names no machine")
	}
	if _, _, err := t.Split(); err != nil {
		return err
	}
	if t.Expires.IsZero() {
		return fmt.Errorf("the join token of machine %s has no expiry", t.Machine)
	}
	return nil
}

// FleetToken is a fleet's shared join token (<id>.<secret>), for fleets
// that opt in to one: no Machine, no expiry; its Secret puts it in
// likenv1.FleetJoinGroup, whose requests cluster-operator approves for any
// Machine that exists.
func FleetToken(token string) MachineToken { return MachineToken{Token: token} }

// Secret is the bootstrap token Secret that makes the token authenticate
// in kube-system: in likenv1.JoinGroup(Machine), until Expires; a
// FleetToken in likenv1.FleetJoinGroup, with no expiry.
func (t MachineToken) Secret() (*corev1.Secret, error) {
	id, secret, err := t.Split()
	if err != nil {
		return nil, err
	}
	if t.Machine == "" {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem,
				Labels: map[string]string{JoinTokenLabel: "fleet"},
			},
			Type: corev1.SecretTypeBootstrapToken,
			Data: map[string][]byte{
				"description":                    []byte("liken's shared join token: it gets the certificate of any Machine (the fleet opted in)"),
				"token-id":                       []byte(id),
				"token-secret":                   []byte(secret),
				"usage-bootstrap-authentication": []byte("true"),
				"auth-extra-groups":              []byte(likenv1.FleetJoinGroup),
			},
		}, nil
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem,
			Labels:      map[string]string{JoinTokenLabel: "machine"},
			Annotations: map[string]string{JoinTokenMachineAnnotation: t.Machine},
		},
		Type: corev1.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			"description":                    []byte("liken's join token of machine " + t.Machine + ": it gets only that machine's certificate"),
			"token-id":                       []byte(id),
			"token-secret":                   []byte(secret),
			"expiration":                     []byte(t.Expires.UTC().Format(time.RFC3339)),
			"usage-bootstrap-authentication": []byte("true"),
			"auth-extra-groups":              []byte(likenv1.JoinGroup(t.Machine)),
		},
	}, nil
}

// maxJoinTokensFile bounds JoinTokensFile: a few thousand workers fit.
const maxJoinTokensFile = 4 << 20

// LoadJoinTokens reads and validates a JoinTokensFile. A file that does
// not exist holds no token: a leader installed before machines had tokens
// of their own.
func LoadJoinTokens(path string) (JoinTokens, error) {
	var jt JoinTokens
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return jt, nil
	case err != nil:
		return jt, err
	case st.Size() > maxJoinTokensFile:
		return jt, fmt.Errorf("%s is %d bytes, more than the %d allowed", path, st.Size(), maxJoinTokensFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return jt, err
	}
	if err := yaml.UnmarshalStrict(b, &jt); err != nil {
		return jt, fmt.Errorf("%s: %w", path, err)
	}
	var errs []error
	seen := map[string]bool{}
	for _, t := range jt.Tokens {
		if err := t.Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[t.Machine] {
			errs = append(errs, fmt.Errorf("machine %s has two join tokens", t.Machine))
		}
		seen[t.Machine] = true
	}
	if err := errors.Join(errs...); err != nil {
		return jt, fmt.Errorf("%s: %w", path, err)
	}
	return jt, nil
}

// JoinTokensRecord is the ConfigMap in kube-system where control-plane
// init records each join token whose Secret it created (data: the token's
// id, the machine's name), so that it never creates one twice: a token an
// administrator deleted stays deleted.
const JoinTokensRecord = "liken-join-tokens"

// EnsureJoinTokens creates the Secret of each token it has never created
// (JoinTokensRecord) and that has not expired at now, then records it. A
// Secret that exists is left as it is, whatever it holds: an administrator
// who shortened a token's expiry keeps it so, and one who deleted it keeps
// it deleted. A power cut between a Secret and its record costs nothing: the
// next init finds the Secret and records it.
func EnsureJoinTokens(ctx context.Context, cs kubernetes.Interface, tokens []MachineToken, now time.Time) error {
	if len(tokens) == 0 {
		return nil
	}
	log := klog.FromContext(ctx)
	cms := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	record, err := cms.Get(ctx, JoinTokensRecord, metav1.GetOptions{})
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err):
		record = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: JoinTokensRecord, Namespace: metav1.NamespaceSystem}}
	case err != nil:
		return fmt.Errorf("reading the record of join tokens %s/%s: %w", metav1.NamespaceSystem, JoinTokensRecord, err)
	default:
		record = record.DeepCopy()
	}
	if record.Data == nil {
		record.Data = map[string]string{}
	}
	api := cs.CoreV1().Secrets(metav1.NamespaceSystem)
	added := 0
	for _, t := range tokens {
		s, err := t.Secret()
		if err != nil {
			return permanent(err)
		}
		id := s.Data["token-id"]
		if _, done := record.Data[string(id)]; done {
			continue
		}
		if !t.Expires.IsZero() && !now.Before(t.Expires) {
			log.Info("A machine's join token in the layer has expired; its Secret is not created (liken layer token makes a new one)", "machine", t.Machine, "expired", t.Expires.UTC().Format(time.RFC3339))
			continue
		}
		_, err = api.Create(ctx, s, metav1.CreateOptions{FieldManager: InitFieldManager})
		switch {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			return fmt.Errorf("creating the join token Secret %s of %s: %w", klog.KObj(s), t.owner(), err)
		default:
			log.Info("Created a join token's Secret", "of", t.owner(), "secret", klog.KObj(s), "expires", t.Expires.UTC().Format(time.RFC3339))
		}
		record.Data[string(id)] = t.owner()
		added++
	}
	if added == 0 {
		return nil
	}
	if !exists {
		_, err = cms.Create(ctx, record, metav1.CreateOptions{FieldManager: InitFieldManager})
	} else {
		_, err = cms.Update(ctx, record, metav1.UpdateOptions{FieldManager: InitFieldManager})
	}
	if err != nil {
		// Another leader's init may have written it: the next try reads it
		// again, and finds the Secrets made.
		return fmt.Errorf("recording the join tokens created in %s/%s: %w", metav1.NamespaceSystem, JoinTokensRecord, err)
	}
	return nil
}
