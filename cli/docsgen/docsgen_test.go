package docsgen

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"liken.sh/liken/cli"
)

// refDir holds the reference pages of the command line.
const refDir = "../../docs/reference/cli"

// TestReferenceCurrent fails when docs/reference/cli does not match the
// commands; go test ./cli/docsgen -update rewrites it.
func TestReferenceCurrent(t *testing.T) {
	// Flag defaults must not depend on who generates the pages.
	t.Setenv("HOME", "/home/user")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("LIKEN_LAB_HOME", "")
	pages := Pages(cli.NewRootCommand())
	dir, err := filepath.Abs(refDir)
	assert.NilError(t, err)

	var names []string
	for n := range pages {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		golden.Assert(t, string(pages[n]), filepath.Join(dir, n), "docs/reference/cli/%s is stale: run go test ./cli/docsgen -update", n)
	}

	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	for _, e := range entries {
		if _, ok := pages[e.Name()]; ok || !strings.HasSuffix(e.Name(), ".md") {
			continue
		}
		if golden.FlagUpdate() {
			assert.NilError(t, os.Remove(filepath.Join(dir, e.Name())))
			continue
		}
		t.Errorf("docs/reference/cli/%s belongs to no command: run go test ./cli/docsgen -update", e.Name())
	}
}

// The pages the user documents link to exist, with the anchors they use.
func TestReferenceAnchors(t *testing.T) {
	pages := Pages(cli.NewRootCommand())
	index := string(pages[IndexPage])
	for _, a := range []string{"liken-layer", "liken-request-reboot", "liken-approve-reboot", "liken-rollout", "liken-lab", "liken-version", "liken-completion"} {
		heading := "## " + strings.ReplaceAll(a, "-", " ")
		heading = strings.Replace(heading, "approve reboot", "approve-reboot", 1)
		heading = strings.Replace(heading, "request reboot", "request-reboot", 1)
		assert.Assert(t, strings.Contains(index, "\n"+heading+"\n"), "no heading for #%s", a)
		assert.Assert(t, strings.Contains(index, "(#"+a+")"), "no link to #%s", a)
	}
	for _, p := range []string{"liken_layer_pack.md", "liken_approve-reboot.md", "liken_rollout_status.md", "liken_options.md"} {
		_, ok := pages[p]
		assert.Assert(t, ok, "no page %s", p)
	}
}
