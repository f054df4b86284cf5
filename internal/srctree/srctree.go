// Package srctree finds the liken source tree that a command or a test runs in.
package srctree

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
)

// Find returns the closest folder at or above the working folder whose
// go.mod declares the module liken.sh/liken.
func Find() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(b, []byte("module liken.sh/liken\n")) {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", errors.New("no liken source tree (a go.mod of module liken.sh/liken) above " + wd)
		}
	}
}
