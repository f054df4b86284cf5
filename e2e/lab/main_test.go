// Package lab tests liken end to end on `liken lab` fleets: the real liken
// binary and kubectl, driven as a user drives them, with a watcher that
// checks the fleet's invariants at every revision of every Cluster,
// Machine and Node.
//
// The binaries come from $LIKEN_BIN (default: _output/bin of the source
// tree; build them with make build). Each scenario runs its own lab, one
// after another. Their cluster-operator copies wait 5 s before the first
// grant (LIKEN_LAB_STARTUP_GRACE) instead of 40 s; the upgrade guide, the
// user's path, keeps the 40 s.
package lab

import (
	"os"
	"testing"

	"liken.sh/liken/e2e/internal/stuck"
)

func TestMain(m *testing.M) {
	// kubectl edit runs this test binary as its editor (see editor_test.go).
	if os.Getenv(editPlanEnv) != "" {
		os.Exit(runEditor(os.Args[1:]))
	}
	// Say where the tests are stuck if they near go test's -timeout.
	stuck.Main(m)
}
