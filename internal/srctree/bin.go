package srctree

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// BinEnv names the folder of liken's programs when set; it is then the
// only folder looked at, so that one run never mixes two builds.
const BinEnv = "LIKEN_BIN"

// BinDirs returns the folders that may hold liken's programs, in the order
// BinDir searches them: $LIKEN_BIN when set; otherwise the running
// executable's folder, then _output/bin of the source tree that holds the
// working folder (where make build writes them).
func BinDirs() []string {
	if d := os.Getenv(BinEnv); d != "" {
		return []string{d}
	}
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	if tree, err := Find(); err == nil {
		if d := filepath.Join(tree, "_output", "bin"); len(dirs) == 0 || dirs[0] != d {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// BinDir returns the first of BinDirs that holds every named program.
func BinDir(names ...string) (string, error) {
	dirs := BinDirs()
	for _, d := range dirs {
		if holds(d, names) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s not found (looked in %s): run make build in the liken source tree, or set %s to the folder that holds them",
		strings.Join(names, ", "), strings.Join(dirs, ", "), BinEnv)
}

// Binary returns the path of the named program in the first of BinDirs
// that holds it.
func Binary(name string) (string, error) {
	d, err := BinDir(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}

func holds(dir string, names []string) bool {
	for _, n := range names {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || st.IsDir() {
			return false
		}
	}
	return true
}
