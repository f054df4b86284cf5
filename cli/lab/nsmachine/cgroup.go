package nsmachine

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hierarchy is one cgroup hierarchy the caller belongs to.
type hierarchy struct {
	mountPoint string // where the host mounts it, such as /sys/fs/cgroup/cpu
	path       string // the caller's cgroup in it
	fstype     string // cgroup or cgroup2
	options    string // cgroup v1's mount options: its controllers, or none,name=NAME
}

// dir is the cgroup rel below the caller's in h, or below h's root when
// rel starts with a slash.
func (h hierarchy) dir(rel string) string {
	if strings.HasPrefix(rel, "/") {
		return filepath.Join(h.mountPoint, rel)
	}
	return filepath.Join(h.mountPoint, h.path, rel)
}

// hierarchies lists the caller's cgroup hierarchies and where the host
// mounts them, from /proc/self/cgroup and /proc/self/mountinfo.
func hierarchies() ([]hierarchy, error) {
	type mnt struct{ point, fstype, opts string }
	var mounts []mnt
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+3 >= len(fields) || fields[3] != "/" {
			continue
		}
		if t := fields[sep+1]; t == "cgroup" || t == "cgroup2" {
			mounts = append(mounts, mnt{point: fields[4], fstype: t, opts: fields[sep+3]})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var hs []hierarchy
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("/proc/self/cgroup: unexpected line %q", line)
		}
		controllers, path := parts[1], parts[2]
		found := false
		for _, m := range mounts {
			opts := strings.Split(m.opts, ",")
			switch {
			case controllers == "" && m.fstype == "cgroup2":
			case controllers != "" && m.fstype == "cgroup" && containsAll(opts, strings.Split(controllers, ",")):
			default:
				continue
			}
			o := controllers
			if strings.HasPrefix(o, "name=") {
				o = "none," + o
			}
			hs = append(hs, hierarchy{mountPoint: m.point, path: path, fstype: m.fstype, options: o})
			found = true
			break
		}
		if !found && controllers != "" {
			return nil, fmt.Errorf("the cgroup hierarchy %s is not mounted on this host", controllers)
		}
	}
	return hs, nil
}

func containsAll(set, want []string) bool {
	for _, w := range want {
		if !slices.Contains(set, w) {
			return false
		}
	}
	return true
}

// joinCgroup moves the calling process into the cgroup rel below its own,
// in every hierarchy, making it first.
func joinCgroup(hs []hierarchy, rel string) error {
	for _, h := range hs {
		dir := h.dir(rel)
		if err := makeCgroup(h, dir); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0o644); err != nil {
			return fmt.Errorf("joining the cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// makeCgroup makes dir and the cgroups above it; in the cpuset hierarchy
// each gets its parent's CPUs and memory nodes, without which no process
// may join it (ENOSPC). A cgroup that exists may still have none: the
// machines of a lab start at once, and another one may have made a
// common parent without having given it its CPUs yet, so each level is
// checked, from the hierarchy's root down.
func makeCgroup(h hierarchy, dir string) error {
	cpuset := strings.Contains(h.options, "cpuset")
	if dir == h.mountPoint || !strings.HasPrefix(dir, h.mountPoint+"/") {
		return nil
	}
	_, statErr := os.Stat(dir)
	if statErr == nil && !cpuset {
		return nil
	}
	if err := makeCgroup(h, filepath.Dir(dir)); err != nil {
		return err
	}
	if statErr != nil {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("making the cgroup %s: %w", dir, err)
		}
	}
	if !cpuset {
		return nil
	}
	for _, name := range []string{"cpuset.cpus", "cpuset.mems"} {
		own, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if len(strings.TrimSpace(string(own))) > 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), name))
		if err != nil {
			return err
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			return fmt.Errorf("giving the cgroup %s its parent's %s: the parent has none", dir, name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("giving the cgroup %s its parent's %s: %w", dir, name, err)
		}
	}
	return nil
}

// RemoveCgroup removes the machine's cgroups once its processes are gone,
// waiting up to timeout for the last of them to exit after a power-off.
func (m *Machine) RemoveCgroup(timeout time.Duration) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for _, h := range hs {
		for {
			err := removeTree(h.dir(m.Cgroup))
			if err == nil || time.Now().After(deadline) {
				if err != nil {
					return fmt.Errorf("machine %s's processes are still in its cgroup after %s: %w", m.Name, timeout, err)
				}
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// removeTree removes a cgroup and the cgroups below it, deepest first.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// CgroupProcs lists the host's process IDs of every process in the
// machine's cgroup, in any hierarchy: none once the machine is off.
func (m *Machine) CgroupProcs() ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var pids []int
	for _, h := range hs {
		err := filepath.WalkDir(h.dir(m.Cgroup), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("machine %s's cgroup: %w", m.Name, err)
		}
	}
	return pids, nil
}

// WaitOff waits up to timeout until no process is left in the machine's
// cgroup. A power cut kills the machine's init at once, and the kernel
// kills the rest of its PID namespace a moment later: until then its
// kubelet may still write to its disk.
func (m *Machine) WaitOff(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		procs, err := m.CgroupProcs()
		if err != nil {
			return err
		}
		if len(procs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("machine %s is not off after %s: processes %v are still in its cgroup", m.Name, timeout, procs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
