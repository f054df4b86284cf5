package layer

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"liken.sh/liken/node/controlplane"
)

// TestPackGivesEachMachineItsOwnToken: every Machine of a packed layer has
// a join token of its own, all different, expiring the TTL after the pack;
// a fleet that opts in to a shared token has none, and its workers keep
// the identity's.
func TestPackGivesEachMachineItsOwnToken(t *testing.T) {
	dir := workdir(t)
	at := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	opts := PackOptions{Files: []string{dir + "/cluster.yaml", dir + "/machines.yaml"}, IdentityDir: dir + "/identity", Now: at, TokenTTL: 48 * time.Hour}
	l, err := Assemble(opts)
	assert.NilError(t, err)
	assert.Equal(t, len(l.Tokens), len(l.Machines))
	seen := map[string]bool{}
	for i, tok := range l.Tokens {
		assert.Check(t, is.Equal(tok.Machine, l.Machines[i].Name))
		assert.Check(t, tok.Validate())
		assert.Check(t, is.Equal(tok.Expires, at.Add(48*time.Hour)))
		assert.Check(t, !seen[tok.Token], "two machines share a token")
		seen[tok.Token] = true
		got, err := l.JoinTokenOf(tok.Machine)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(got, tok.Token))
	}

	opts.SharedJoinToken = true
	shared, err := Assemble(opts)
	assert.NilError(t, err)
	assert.Check(t, is.Len(shared.Tokens, 0))
	worker, err := shared.ForMachine("node-4")
	assert.NilError(t, err)
	back, err := Read(bytes.NewReader(archiveBytes(t, worker)), DefaultLimits)
	assert.NilError(t, err)
	assert.Check(t, back.SharedJoinToken)
	tok, err := back.JoinTokenOf("node-4")
	assert.NilError(t, err)
	id, secret, err := BootstrapToken(shared.Identity.Files[TokenFile])
	assert.NilError(t, err)
	assert.Check(t, is.Equal(tok, id+"."+secret))
	var out bytes.Buffer
	assert.NilError(t, back.Describe(&out, "layer.tgz", false))
	assert.Check(t, is.Contains(out.String(), "every machine with the identity's shared join token, which may ask for the certificate of any Machine"))

	opts.TokenTTL = -time.Hour
	_, err = Assemble(opts)
	assert.ErrorContains(t, err, "--join-token-ttl -1h0m0s: a join token's lifetime must be more than 0")
}

// TestReadRefusesBadTokens: a layer's join tokens must each name one of
// its Machines, once, and be bootstrap tokens with an expiry; a layer of a
// shared token holds none.
func TestReadRefusesBadTokens(t *testing.T) {
	good := controlplane.MachineToken{Machine: "node-4", Token: "abcdef.0123456789abcdef", Expires: fixtureTokenExpiry}
	for _, tc := range []struct {
		name    string
		tokens  []controlplane.MachineToken
		shared  bool
		noToken bool
		want    string
	}{
		{name: "no such machine", tokens: []controlplane.MachineToken{{Machine: "node-9", Token: good.Token, Expires: good.Expires}}, want: "holds a join token for node-9, which is no Machine of the layer"},
		{name: "twice", tokens: []controlplane.MachineToken{good, good}, want: "holds two join tokens for node-4"},
		{name: "not a token", tokens: []controlplane.MachineToken{{Machine: "node-4", Token: "abc", Expires: good.Expires}}, want: "the join token of machine node-4 is not a bootstrap token"},
		{name: "no expiry", tokens: []controlplane.MachineToken{{Machine: "node-4", Token: good.Token}}, want: "the join token of machine node-4 has no expiry"},
		{name: "a shared token and own ones", tokens: []controlplane.MachineToken{good}, shared: true, want: "a layer whose machines share one join token holds no machine's own"},
		{name: "a shared token missing", shared: true, noToken: true, want: "the layer's machines share the identity's join token, and identity/token is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := fixtureLayer(t)
			l.Tokens, l.SharedJoinToken = tc.tokens, tc.shared
			if tc.noToken {
				l.Identity = l.Identity.WithoutPrivateKeys()
				delete(l.Identity.Files, TokenFile)
			}
			_, err := Read(bytes.NewReader(archiveBytes(t, l)), DefaultLimits)
			assert.ErrorContains(t, err, tc.want)
			assert.Check(t, !strings.Contains(err.Error(), "0123456789abcdef"), "an error quoted a token's secret")
		})
	}
}

// TestTokenCommand: liken layer token gives one machine a new join token in
// the layer, leaves every other as it was, and prints the new token's
// Secret for kubectl apply; --print prints every token's Secret and
// changes nothing.
func TestTokenCommand(t *testing.T) {
	dir := workdir(t)
	_, _, err := run(t, dir, "pack", "-f", "cluster.yaml", "-f", "machines.yaml", "--identity", "identity", "-o", "layer.tgz")
	assert.NilError(t, err)
	before, err := ReadFile(dir+"/layer.tgz", DefaultLimits)
	assert.NilError(t, err)

	out, stderr, err := run(t, dir, "token", "layer.tgz", "node-4")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(stderr, "Machine node-4 has a new join token in layer.tgz, valid until "))
	after, err := ReadFile(dir+"/layer.tgz", DefaultLimits)
	assert.NilError(t, err)
	for i, tok := range after.Tokens {
		if tok.Machine == "node-4" {
			assert.Check(t, tok.Token != before.Tokens[i].Token, "node-4 kept its token")
			id, _, err := tok.Split()
			assert.NilError(t, err)
			assert.Check(t, is.Contains(out, "name: bootstrap-token-"+id))
			continue
		}
		assert.Check(t, is.DeepEqual(tok, before.Tokens[i]))
	}
	assert.Check(t, is.Equal(strings.Count(out, "kind: Secret"), 1), out)
	assert.Check(t, is.Contains(out, "liken.sh/machine: node-4"))
	assert.Check(t, is.Equal(after.Cluster.Name, before.Cluster.Name))

	out, stderr, err = run(t, dir, "token", "layer.tgz", "--print")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(strings.Count(out, "kind: Secret"), len(after.Tokens)))
	assert.Check(t, is.Contains(stderr, "5 join token Secrets printed"))
	again, err := ReadFile(dir+"/layer.tgz", DefaultLimits)
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(again.Tokens, after.Tokens), "--print changed the layer")

	_, _, err = run(t, dir, "token", "layer.tgz", "node-9")
	assert.ErrorContains(t, err, `the layer has no Machine "node-9"`)
	_, _, err = run(t, dir, "token", "layer.tgz")
	assert.ErrorContains(t, err, "name the machines to give new join tokens")
	worker, err := after.ForMachine("node-4")
	assert.NilError(t, err)
	assert.NilError(t, worker.WriteFile(dir+"/worker.tgz", false))
	_, _, err = run(t, dir, "token", "worker.tgz", "node-4")
	assert.ErrorContains(t, err, "worker.tgz is a worker's copy of the layer")
}
