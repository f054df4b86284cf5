// Package initramfs writes the initramfs archives liken's kernels unpack: an init, kernel modules in load order, and files.
package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// ResolveModules returns the files of the named kernel modules under
// modulesDir (a kernel's /lib/modules/<version>), with their dependencies,
// each after the modules it needs. Modules built into the kernel are left
// out; a module that is neither is an error naming it.
func ResolveModules(modulesDir string, names []string) ([]string, error) {
	paths := map[string]string{}
	err := filepath.WalkDir(modulesDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			paths[modName(strings.TrimSuffix(d.Name(), ".ko"))] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modulesDir, "modules.builtin")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			builtin[modName(strings.TrimSuffix(filepath.Base(l), ".ko"))] = true
		}
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) error
	visit = func(name string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("kernel module dependency cycle at %s", name)
		case 2:
			return nil
		}
		state[name] = 1
		p, ok := paths[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			return fmt.Errorf("kernel module %s not found under %s", name, modulesDir)
		}
		deps, err := depends(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, m := range names {
		if err := visit(modName(m)); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// depends reads the depends= entry of a module's .modinfo section.
func depends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading kernel module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("kernel module %s has no .modinfo", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, modName(d))
			}
		}
	}
	sort.Strings(deps)
	return deps, nil
}

// Archive is an initramfs being written: the "newc" cpio format the
// kernel unpacks.
type Archive struct {
	buf bytes.Buffer
	ino int
}

// New returns an archive with the folders and the console device every
// init needs.
func New() *Archive {
	a := &Archive{}
	for _, dir := range []string{"dev", "proc", "sys", "lib", "lib/modules"} {
		a.Dir(dir)
	}
	a.entry("dev/console", 0o020600, 5, 1, nil)
	return a
}

func (a *Archive) entry(name string, mode uint32, rmajor, rminor int, data []byte) {
	a.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	fmt.Fprintf(&a.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		a.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	a.buf.WriteString(name)
	a.buf.WriteByte(0)
	a.pad()
	a.buf.Write(data)
	a.pad()
}

func (a *Archive) pad() {
	for a.buf.Len()%4 != 0 {
		a.buf.WriteByte(0)
	}
}

// Dir adds a folder.
func (a *Archive) Dir(name string) { a.entry(name, 0o040755, 0, 0, nil) }

// File adds a regular file.
func (a *Archive) File(name string, perm uint32, b []byte) { a.entry(name, 0o100000|perm, 0, 0, b) }

// Modules adds the module files under lib/modules and their load order as
// /modules.order (names relative to /lib/modules), which the init reads.
func (a *Archive) Modules(files []string) error {
	var order []string
	for _, m := range files {
		b, err := os.ReadFile(m)
		if err != nil {
			return err
		}
		a.File("lib/modules/"+filepath.Base(m), 0o644, b)
		order = append(order, filepath.Base(m))
	}
	a.File("modules.order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	return nil
}

// LoadModules loads, in an init, the modules an archive's Modules listed:
// the files under /lib/modules named in /modules.order, in order. An
// archive without modules loads none; a module already loaded is fine.
// The modules in the order up to the one named first (such as "softdog")
// load, then between runs (nil: no call), then the rest load: liken-boot
// lists the watchdog's module first, so that only it and what it needs
// load before between arms it, and a hang while any other driver probes
// its hardware is ended. Without a module named first, between runs after
// them all.
func LoadModules(first string, between func() error) error {
	f, err := os.Open("/modules.order")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name := strings.TrimSpace(sc.Text()); name != "" {
			names = append(names, name)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	early, rest := names, []string(nil)
	if i := slices.IndexFunc(names, func(n string) bool { return modName(strings.TrimSuffix(n, ".ko")) == first }); i >= 0 {
		early, rest = names[:i+1], names[i+1:]
	}
	if err := loadModules(early); err != nil {
		return err
	}
	if between != nil {
		if err := between(); err != nil {
			return err
		}
	}
	return loadModules(rest)
}

// loadModules loads the module files named (under /lib/modules), in order.
func loadModules(names []string) error {
	for _, name := range names {
		m, err := os.Open(filepath.Join("/lib/modules", name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// Gzip ends the archive and returns it gzip-compressed. Compressed, GRUB
// reads a third of the bytes through the BIOS, which is the slow part of a
// boot under emulation.
func (a *Archive) Gzip() ([]byte, error) {
	a.entry("TRAILER!!!", 0, 0, 0, nil)
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(a.buf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return z.Bytes(), nil
}
