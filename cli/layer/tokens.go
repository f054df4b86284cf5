package layer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"sigs.k8s.io/yaml"

	"liken.sh/liken/node/controlplane"
)

// JoinTokensMember is the archive member that lists the machines' own join
// tokens (controlplane.JoinTokens): every one in the fleet's layer and a
// leader's, a worker's own alone in a worker's.
const JoinTokensMember = controlplane.JoinTokensFile

// DefaultJoinTokenTTL is how long a worker's join token is valid after
// liken layer pack: the time to install the fleet. A machine needs its
// token only for its first join; then it renews its certificate with the
// certificate itself.
const DefaultJoinTokenTTL = 7 * 24 * time.Hour

// NewJoinToken makes a new bootstrap token, <id>.<secret>: 6 and 16
// characters of a-z and 0-9, from rnd (crypto/rand when nil).
func NewJoinToken(rnd io.Reader) (string, error) {
	if rnd == nil {
		rnd = rand.Reader
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	raw := make([]byte, 22)
	// Reject bytes past the last whole multiple of the alphabet, so every
	// character is equally likely.
	limit := byte(256 - 256%len(alphabet))
	for i := 0; i < len(raw); {
		var b [1]byte
		if _, err := io.ReadFull(rnd, b[:]); err != nil {
			return "", fmt.Errorf("generating a join token: %w", err)
		}
		if b[0] >= limit {
			continue
		}
		raw[i] = alphabet[int(b[0])%len(alphabet)]
		i++
	}
	return string(raw[:6]) + "." + string(raw[6:]), nil
}

// MachineTokens makes a join token for each of machines, expiring at
// expires. A leader of liken's own control plane does not use its own: its
// control plane setup issues its certificates; one whose control plane is
// another's joins with it as a worker does.
func MachineTokens(machines []*Document, expires time.Time, rnd io.Reader) ([]controlplane.MachineToken, error) {
	var out []controlplane.MachineToken
	for _, d := range machines {
		tok, err := NewJoinToken(rnd)
		if err != nil {
			return nil, err
		}
		out = append(out, controlplane.MachineToken{Machine: d.Name, Token: tok, Expires: expires.UTC().Truncate(time.Second)})
	}
	return out, nil
}

// Token returns the named machine's own join token in the layer.
func (l *Layer) Token(machine string) (controlplane.MachineToken, bool) {
	i := slices.IndexFunc(l.Tokens, func(t controlplane.MachineToken) bool { return t.Machine == machine })
	if i < 0 {
		return controlplane.MachineToken{}, false
	}
	return l.Tokens[i], true
}

// JoinTokenOf returns the bootstrap token (<id>.<secret>) the named
// machine joins with: the fleet's shared token when the layer opted in to
// one, else the machine's own.
func (l *Layer) JoinTokenOf(machine string) (string, error) {
	m := l.Machine(machine)
	if m == nil {
		return "", fmt.Errorf("the layer has no Machine %q", machine)
	}
	if l.SharedJoinToken {
		id, secret, err := BootstrapToken(l.Identity.Files[TokenFile])
		if err != nil {
			return "", err
		}
		return id + "." + secret, nil
	}
	t, ok := l.Token(machine)
	if !ok {
		return "", fmt.Errorf("the layer holds no join token for Machine %s: pack the layer again (liken layer pack)", machine)
	}
	return t.Token, nil
}

// marshalTokens is the JoinTokensMember of tokens.
func marshalTokens(tokens []controlplane.MachineToken) ([]byte, error) {
	return yaml.Marshal(controlplane.JoinTokens{Tokens: tokens})
}

// parseTokens reads a JoinTokensMember and checks that every token belongs
// to a Machine of machines, once.
func parseTokens(b []byte, machines []*Document) ([]controlplane.MachineToken, error) {
	var jt controlplane.JoinTokens
	if err := yaml.UnmarshalStrict(b, &jt); err != nil {
		return nil, fmt.Errorf("not a list of join tokens: %w", err)
	}
	var errs []error
	seen := map[string]bool{}
	for _, t := range jt.Tokens {
		if err := t.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case !slices.ContainsFunc(machines, func(d *Document) bool { return d.Name == t.Machine }):
			errs = append(errs, fmt.Errorf("holds a join token for %s, which is no Machine of the layer", t.Machine))
		case seen[t.Machine]:
			errs = append(errs, fmt.Errorf("holds two join tokens for %s", t.Machine))
		}
		seen[t.Machine] = true
	}
	return jt.Tokens, errors.Join(errs...)
}
