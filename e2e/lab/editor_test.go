package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// editPlanEnv holds the JSON editPlan when this test binary runs as
// kubectl's editor.
const editPlanEnv = "LIKEN_E2E_EDIT_PLAN"

// editPlan is what the editor does to a Cluster on its first opening, as a
// person in `kubectl edit cluster` would. Every opening's buffer is kept
// in Dir, so a test can read what kubectl showed when it reopened the
// buffer after a refusal.
type editPlan struct {
	// Dir receives buffer-N.yaml, the buffer of the N-th opening.
	Dir string `json:"dir"`
	// Version, when set, becomes spec.version.
	Version string `json:"version,omitempty"`
	// Add are catalog entries appended to spec.releases.catalog.
	Add []likenv1.CatalogEntry `json:"add,omitempty"`
	// DropMaxUnavailable removes spec.disruption.maxUnavailable, so the
	// default budget applies.
	DropMaxUnavailable bool `json:"dropMaxUnavailable,omitempty"`
}

// runEditor is the editor's main: kubectl passes the file to edit last.
// The first opening applies the plan; later openings (kubectl reopens the
// buffer with the API server's refusal at the top) change nothing, which
// cancels the edit.
func runEditor(args []string) int {
	if err := edit(args); err != nil {
		fmt.Fprintf(os.Stderr, "e2e editor: %v\n", err)
		return 1
	}
	return 0
}

func edit(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no file to edit")
	}
	file := args[len(args)-1]
	var plan editPlan
	if err := json.Unmarshal([]byte(os.Getenv(editPlanEnv)), &plan); err != nil {
		return fmt.Errorf("%s: %w", editPlanEnv, err)
	}
	buf, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	prev, err := filepath.Glob(filepath.Join(plan.Dir, "buffer-*.yaml"))
	if err != nil {
		return err
	}
	n := len(prev) + 1
	if err := os.WriteFile(filepath.Join(plan.Dir, fmt.Sprintf("buffer-%d.yaml", n)), buf, 0o600); err != nil {
		return err
	}
	if n > 1 {
		return nil
	}
	var obj map[string]any
	if err := yaml.Unmarshal(buf, &obj); err != nil {
		return fmt.Errorf("parsing the buffer: %w", err)
	}
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		return fmt.Errorf("the buffer has no spec")
	}
	if plan.Version != "" {
		spec["version"] = plan.Version
	}
	if len(plan.Add) > 0 {
		releases, ok := spec["releases"].(map[string]any)
		if !ok {
			return fmt.Errorf("the buffer has no spec.releases")
		}
		catalog, _ := releases["catalog"].([]any)
		for _, e := range plan.Add {
			catalog = append(catalog, map[string]any{"version": e.Version, "digest": e.Digest})
		}
		releases["catalog"] = catalog
	}
	if plan.DropMaxUnavailable {
		if d, ok := spec["disruption"].(map[string]any); ok {
			delete(d, "maxUnavailable")
		}
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o600)
}

// editResult is what a kubectl edit session did.
type editResult struct {
	stdout, stderr string
	err            error
	// buffers are what the editor was shown, in order.
	buffers []string
}

// shown reports whether any reopened buffer (after the first) contains s.
func (r editResult) shown(s string) bool {
	for _, b := range r.buffers[min(1, len(r.buffers)):] {
		if strings.Contains(b, s) {
			return true
		}
	}
	return false
}
