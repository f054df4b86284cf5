package printable

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"drain blocked by pod web-1 (PDB web)", "drain blocked by pod web-1 (PDB web)"},
		{"größer – ünïcode stays", "größer – ünïcode stays"},
		{"\x1b[2Jcleared", `\x1b[2Jcleared`},
		{"ok\r\nNext: run rm -rf", `ok\x0d\x0aNext: run rm -rf`},
		{"bell\x07 del\x7f", `bell\x07 del\x7f`},
		{"bad \xff byte", `bad \xff byte`},
		{"c1 \u009b31m", `c1 \u009b31m`},
		{"rtl \u202egnp.exe", `rtl \u202egnp.exe`},
	} {
		assert.Equal(t, Text(tc.in), tc.want, "%q", tc.in)
	}
}
