// Package debian installs Debian's packages into a root with mmdebstrap
// (minbase variant, without documentation), cached as a tar archive by
// suite and package list.
package debian

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Root returns the tar archive of a Debian root of suite with packages,
// building it in cache with mmdebstrap (as root) when cache has none for
// this suite, list and hooks. Each hook is an mmdebstrap --essential-hook.
// A build that fails leaves no archive behind.
func Root(cache, suite string, packages, hooks []string, step func(string, ...any)) (string, error) {
	sum := sha256.Sum256([]byte(suite + " " + strings.Join(packages, ",") + " " + strings.Join(hooks, "\n")))
	tarball := filepath.Join(cache, "debian-"+suite+"-"+hex.EncodeToString(sum[:6])+".tar")
	if _, err := os.Stat(tarball); err == nil {
		step("Debian root: cached in %s", tarball)
		return tarball, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return "", errors.New("mmdebstrap is missing: apt-get install mmdebstrap (hack/install-deps.sh does)")
	}
	if os.Geteuid() != 0 {
		return "", errors.New("installing Debian's packages needs root: mmdebstrap runs in its root mode, and the root's files belong to root")
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	step("Installing Debian %s packages with mmdebstrap: %s (a minute or two, once)", suite, strings.Join(packages, " "))
	args := []string{"--mode=root", "--format=tar", "--variant=minbase", "--include=" + strings.Join(packages, ",")}
	for _, h := range hooks {
		args = append(args, "--essential-hook="+h)
	}
	for _, p := range []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*"} {
		args = append(args, "--dpkgopt=path-exclude="+p)
	}
	args = append(args, suite, tarball+".tmp")
	cmd := exec.Command("mmdebstrap", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		os.Remove(tarball + ".tmp")
		return "", fmt.Errorf("mmdebstrap %s: %w", strings.Join(args, " "), err)
	}
	return tarball, os.Rename(tarball+".tmp", tarball)
}
