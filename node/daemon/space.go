package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Room a download leaves free on the slot store, which it shares with
// containerd's images, the kubelet's files and, on a leader, etcd.
const (
	// imageEvictionPercent is the kubelet's default hard eviction
	// threshold for its image file system (imagefs.available<15%; the
	// node file system's is 10%): below it the kubelet evicts pods,
	// ignoring their PodDisruptionBudgets.
	imageEvictionPercent = 15
	// spaceMargin is kept free on top of the thresholds.
	spaceMargin = 256 << 20
)

// fsSpace is what statfs says of a file system.
type fsSpace struct {
	// Free is what an unprivileged writer may still use; Size the whole.
	Free, Size int64
}

// statSpace reads the space of the file system that holds path.
func statSpace(path string) (fsSpace, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsSpace{}, fmt.Errorf("reading the free space of the slot store: %w", err)
	}
	return fsSpace{Free: int64(st.Bavail) * st.Bsize, Size: int64(st.Blocks) * st.Bsize}, nil
}

// roomFor says whether need more bytes may go into a slot on a file
// system with space fs: what stays free after them must cover the
// kubelet's eviction threshold, datastore (what etcd may still grow to,
// on a leader) and a margin. The error says what is missing and what to
// do.
func roomFor(need int64, fs fsSpace, datastore int64) error {
	eviction := fs.Size * imageEvictionPercent / 100
	reserve := eviction + max(datastore, 0) + spaceMargin
	if fs.Free-need >= reserve {
		return nil
	}
	etcd := ""
	if datastore > 0 {
		etcd = fmt.Sprintf(", %s for etcd to reach its quota", mib(datastore))
	}
	return fmt.Errorf("the release needs %s more on the slot store, and liken keeps %s free besides (%s, the kubelet's eviction threshold of %d%% of %s%s, and a margin of %s), but %s is free: "+
		"downloading would make the kubelet evict pods. Free space (unused images, logs) or give the machine a larger disk; the machine waits and retries",
		mib(need), mib(reserve), mib(eviction), imageEvictionPercent, mib(fs.Size), etcd, mib(spaceMargin), mib(fs.Free))
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
