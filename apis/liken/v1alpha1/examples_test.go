package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"sigs.k8s.io/yaml"

	v1 "liken.sh/liken/apis/liken/v1alpha1"
)

// TestExamplesDecodeStrictly keeps manifests/examples in step with the Go
// types: every field of every example must be known to them.
func TestExamplesDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "manifests", "examples", "*.yaml"))
	assert.NilError(t, err)
	assert.Assert(t, len(files) > 0)
	kinds := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		assert.NilError(t, err)
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct{ Kind string }
			assert.NilError(t, yaml.Unmarshal([]byte(doc), &meta))
			var obj any
			switch meta.Kind {
			case "Cluster":
				obj = &v1.Cluster{}
			case "Machine":
				obj = &v1.Machine{}
			default:
				t.Fatalf("%s document %d: unexpected kind %q", f, i, meta.Kind)
			}
			assert.NilError(t, yaml.UnmarshalStrict([]byte(doc), obj), "%s document %d", f, i)
			kinds[meta.Kind]++
		}
	}
	assert.Assert(t, kinds["Cluster"] >= 1 && kinds["Machine"] >= 3, "examples: %v", kinds)
}
