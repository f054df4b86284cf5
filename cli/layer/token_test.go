package layer

import (
	"testing"

	"gotest.tools/v3/assert"

	"liken.sh/liken/node/controlplane"
)

// TestBootstrapTokenParsersAgree: liken-node reads the join token of a
// leader's identity with its own parser (it may not import this package);
// both parsers read the same bootstrap token from a generated identity's
// token file and refuse the same malformed ones, and both name the file
// alike.
func TestBootstrapTokenParsersAgree(t *testing.T) {
	assert.Equal(t, controlplane.TokenFile, TokenFile)
	id, err := GenerateIdentity(GenerateOptions{Cluster: "lab"})
	assert.NilError(t, err)
	file := id.Files[TokenFile]
	for _, tc := range []struct {
		name string
		file string
		ok   bool
	}{
		{name: "generated", file: string(file), ok: true},
		{name: "without its line end", file: string(file[:len(file)-1]), ok: true},
		{name: "bootstrap token alone", file: "abcdef.0123456789abcdef"},
		{name: "short secret", file: "K10ab::abcdef.0123456789abcde"},
		{name: "upper case", file: "K10ab::ABCDEF.0123456789abcdef"},
		{name: "trailing text", file: "K10ab::abcdef.0123456789abcdef::x"},
		{name: "two lines", file: string(file) + string(file)},
		{name: "empty", file: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lid, lsecret, lerr := BootstrapToken([]byte(tc.file))
			nid, nsecret, nerr := controlplane.BootstrapToken([]byte(tc.file))
			assert.Equal(t, lerr == nil, tc.ok, "liken layer: %v", lerr)
			assert.Equal(t, nerr == nil, tc.ok, "liken-node: %v", nerr)
			assert.Equal(t, nid, lid)
			assert.Equal(t, nsecret, lsecret)
			if tc.ok {
				assert.Assert(t, len(nid) == 6 && len(nsecret) == 16)
			}
		})
	}
}
