// Package debpkg fetches Debian packages with apt-get download and unpacks them into a folder: programs for tests, nothing installed, no root needed.
package debpkg

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Unpack downloads pkgs with apt-get download into dir/debs and unpacks
// them into dir/root, which it returns, unless dir/root already holds
// exactly this set. logf receives progress lines.
func Unpack(dir string, pkgs []string, logf func(string, ...any)) (string, error) {
	root := filepath.Join(dir, "root")
	debs := filepath.Join(dir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", err
	}
	stamp := filepath.Join(root, ".liken-packages")
	if have, _ := os.ReadFile(stamp); string(have) == strings.Join(pkgs, "\n")+"\n" {
		return root, nil
	}
	logf("fetching Debian packages into %s: %s", debs, strings.Join(pkgs, " "))
	// apt-get download writes into the working folder; remove older
	// versions of the same packages first so each name maps to one file.
	old, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	for _, f := range old {
		os.Remove(f)
	}
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, pkgs...)...)
		cmd.Dir = debs
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && AptUpdate(logf) {
		out, err = download()
	}
	if err != nil {
		return "", fmt.Errorf("apt-get download %s failed (%v): run 'apt-get update' (hack/install-deps.sh does) and retry:\n%s", strings.Join(pkgs, " "), err, out)
	}
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) < len(pkgs) {
		return "", fmt.Errorf("apt-get download left %d packages in %s, want %d", len(files), debs, len(pkgs))
	}
	logf("unpacking %d packages into %s", len(files), root)
	for _, f := range files {
		if out, err := exec.Command("dpkg", "-x", f, root).CombinedOutput(); err != nil {
			return "", fmt.Errorf("dpkg -x %s: %v\n%s", f, err, out)
		}
	}
	return root, os.WriteFile(stamp, []byte(strings.Join(pkgs, "\n")+"\n"), 0o644)
}

// AptUpdate refreshes Debian's package lists when this process may (as
// root), once per process; it reports whether it did.
func AptUpdate(logf func(string, ...any)) bool {
	if os.Geteuid() != 0 {
		return false
	}
	first := false
	aptUpdate.Do(func() { first = true })
	if !first {
		return false
	}
	logf("refreshing Debian's package lists (apt-get update)")
	out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput()
	if err != nil {
		logf("apt-get update failed: %v\n%s", err, out)
		return false
	}
	return true
}

var aptUpdate sync.Once
