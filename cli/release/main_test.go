package release

import (
	"os"
	"path/filepath"
	"testing"
)

// testdataDir is the absolute path of testdata/: the tests change directory.
var testdataDir string

func TestMain(m *testing.M) {
	var err error
	if testdataDir, err = filepath.Abs("testdata"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}
