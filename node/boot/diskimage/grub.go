package diskimage

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// hostGRUBDir and hostGRUBEFIDir are where Debian's grub-pc-bin and
// grub-efi-amd64-bin put GRUB's BIOS and EFI builds.
const (
	hostGRUBDir    = "/usr/lib/grub/i386-pc"
	hostGRUBEFIDir = "/usr/lib/grub/x86_64-efi"
)

// GRUBPackages are the Debian packages FindGRUB unpacks when the host has
// no GRUB for both BIOS and EFI.
var GRUBPackages = []string{"grub-pc-bin", "grub-efi-amd64-bin", "grub-common"}

// FindGRUB returns the host's GRUB for BIOS and EFI (grub-mkimage on PATH,
// /usr/lib/grub/i386-pc and /usr/lib/grub/x86_64-efi), or else fetches
// Debian's grub-pc-bin, grub-efi-amd64-bin and grub-common with apt-get
// download into cacheDir and unpacks them there with dpkg -x (nothing is
// installed; a second run reuses them). logf receives progress.
func FindGRUB(cacheDir string, logf func(string, ...any)) (GRUB, error) {
	if mk, err := exec.LookPath("grub-mkimage"); err == nil {
		g := GRUB{Mkimage: mk, Dir: hostGRUBDir, EFIDir: hostGRUBEFIDir}
		if g.complete() {
			return g, nil
		}
	}
	root := filepath.Join(cacheDir, "root")
	g := UnpackedGRUB(root)
	if _, err := os.Stat(g.Mkimage); err == nil && g.complete() {
		return g, nil
	}
	debs := filepath.Join(cacheDir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return GRUB{}, err
	}
	logf("This computer has no GRUB for both BIOS and EFI; fetching Debian's %s into %s", strings.Join(GRUBPackages, " and "), cacheDir)
	cmd := exec.Command("apt-get", append([]string{"download", "-q"}, GRUBPackages...)...)
	cmd.Dir = debs
	if out, err := cmd.CombinedOutput(); err != nil {
		return GRUB{}, fmt.Errorf("no GRUB for both BIOS and EFI on this computer, and apt-get download %s failed (%v): install grub-pc-bin, grub-efi-amd64-bin and grub-common, or run 'apt-get update' and retry:\n%s",
			strings.Join(GRUBPackages, " "), err, out)
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) == 0 {
		return GRUB{}, errors.New("apt-get download left no package in " + debs)
	}
	for _, f := range files {
		if out, err := exec.Command("dpkg", "-x", f, root).CombinedOutput(); err != nil {
			return GRUB{}, fmt.Errorf("dpkg -x %s: %v\n%s", f, err, out)
		}
	}
	if !g.complete() {
		return GRUB{}, fmt.Errorf("the packages unpacked in %s hold no GRUB for both BIOS (%s) and EFI (%s)", root, g.Dir, g.EFIDir)
	}
	return g, nil
}

// complete is true when g has both builds: BIOS's boot.img and EFI's
// modules.
func (g GRUB) complete() bool {
	_, bios := os.Stat(filepath.Join(g.Dir, "boot.img"))
	_, efi := os.Stat(filepath.Join(g.EFIDir, "part_gpt.mod"))
	return bios == nil && efi == nil
}

// UnpackedGRUB is GRUB for BIOS and EFI from grub-pc-bin,
// grub-efi-amd64-bin and grub-common unpacked (dpkg -x) under root.
func UnpackedGRUB(root string) GRUB {
	return GRUB{
		Mkimage: filepath.Join(root, "usr/bin/grub-mkimage"),
		Env: []string{"LD_LIBRARY_PATH=" + strings.Join([]string{
			filepath.Join(root, "usr/lib/x86_64-linux-gnu"), filepath.Join(root, "lib/x86_64-linux-gnu"),
		}, ":")},
		Dir:    filepath.Join(root, "usr/lib/grub/i386-pc"),
		EFIDir: filepath.Join(root, "usr/lib/grub/x86_64-efi"),
	}
}
