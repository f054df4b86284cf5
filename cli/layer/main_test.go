package layer

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// testdata is the absolute path of testdata/, for tests that change
// directory.
var testdata string

// gold is the path of a golden file in testdata/.
func gold(name string) string { return filepath.Join(testdata, name) }

// TestMain bounds the fuzzer's minimization of new inputs unless
// -fuzzminimizetime is given: one run of the reader over a whole layer
// takes milliseconds (every document is checked against the CRDs), so the
// default minute of minimizing would leave a short fuzz run (hack/fuzz-smoke.sh)
// no time to fuzz.
func TestMain(m *testing.M) {
	var err error
	if testdata, err = filepath.Abs("testdata"); err != nil {
		panic(err)
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if !set {
		_ = flag.Set("test.fuzzminimizetime", "20x")
	}
	os.Exit(m.Run())
}
