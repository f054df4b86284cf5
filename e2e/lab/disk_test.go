package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
)

// diskChecker re-hashes a slot on the machine's disk as soon as the
// watcher sees its Machine report the slot Active, Staged or Previous
// with a release it did not report there before: the bytes on disk must
// be the release the status names, at every stage, not only at the end of
// a scenario (checkBootedAndStaged). The checks run in their own
// goroutine, so the watch streams never wait on a disk.
type diskChecker struct {
	l    *lab
	w    *watcher
	wake chan struct{}
	done chan struct{}

	mu      sync.Mutex
	queue   []*likenv1.Machine
	checked map[string]bool
	count   int
	stopped bool
}

// newDiskChecker returns a checker of lab l's disks; it queues what it is
// given until start.
func newDiskChecker(l *lab) *diskChecker {
	return &diskChecker{l: l, wake: make(chan struct{}, 1), done: make(chan struct{}), checked: map[string]bool{}}
}

// start checks the queue, and what comes after, reporting to w.
func (d *diskChecker) start(w *watcher) {
	d.w = w
	go d.run()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// enqueue hands a Machine version to the checker; it never blocks.
func (d *diskChecker) enqueue(m *likenv1.Machine) {
	d.mu.Lock()
	d.queue = append(d.queue, m.DeepCopy())
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// stop checks what is queued and returns the number of slot stages
// checked.
func (d *diskChecker) stop() int {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	<-d.done
	return d.count
}

func (d *diskChecker) run() {
	defer close(d.done)
	for range d.wake {
		for {
			d.mu.Lock()
			if len(d.queue) == 0 {
				stopped := d.stopped
				d.mu.Unlock()
				if stopped {
					return
				}
				break
			}
			m := d.queue[0]
			d.queue = d.queue[1:]
			d.mu.Unlock()
			d.check(m)
		}
	}
}

// check hashes every slot m reports Active, Staged or Previous that was
// not checked with that state and release. A mismatch is a problem only if
// the machine, read again after a second hashing, still reports the slot
// so: a machine may have moved on (a withdrawn release is written over)
// between its report and the hashing.
func (d *diskChecker) check(m *likenv1.Machine) {
	for _, s := range m.Status.Slots {
		switch s.State {
		case likenv1.SlotActive, likenv1.SlotStaged, likenv1.SlotPrevious:
		default:
			continue
		}
		key := fmt.Sprintf("%s/%s/%s/%s/%s", m.Name, s.Name, s.State, s.Version, s.Digest)
		if d.checked[key] {
			continue
		}
		d.checked[key] = true
		d.count++
		dir := filepath.Join(d.l.machineDir(m.Name), "disk", "slots", s.Name)
		if verifySlotOnDisk(dir, s.Version, s.Digest) == nil {
			continue
		}
		cur, err := d.l.client.LikenV1alpha1().Machines().Get(context.Background(), m.Name, metav1.GetOptions{})
		if err != nil || !reportsSlot(cur, s) {
			continue
		}
		if err := verifySlotOnDisk(dir, s.Version, s.Digest); err != nil && reportsSlot(cur, s) {
			d.w.report("disk/"+key, fmt.Sprintf("Machine %s@%s reports slot %s %s with %s %s, but its disk does not hold it: %v",
				m.Name, m.ResourceVersion, s.Name, s.State, s.Version, s.Digest, err))
		}
	}
}

// reportsSlot says whether m still reports slot s as it was.
func reportsSlot(m *likenv1.Machine, s likenv1.SlotStatus) bool {
	for _, c := range m.Status.Slots {
		if c.Name == s.Name {
			return c.State == s.State && c.Version == s.Version && c.Digest == s.Digest
		}
	}
	return false
}

// verifySlotOnDisk checks that the slot folder dir holds the release
// document with digest, for version, and every artifact the document
// lists, byte for byte.
func verifySlotOnDisk(dir, version, digest string) error {
	doc, err := os.ReadFile(filepath.Join(dir, "release.yaml"))
	if err != nil {
		return err
	}
	if got := digestOf(doc); got != digest {
		return fmt.Errorf("release.yaml has digest %s", got)
	}
	var rd struct {
		Version   string `json:"version"`
		Artifacts []struct {
			Path   string `json:"path"`
			Size   int64  `json:"size"`
			SHA256 string `json:"sha256"`
		} `json:"artifacts"`
	}
	if err := yaml.Unmarshal(doc, &rd); err != nil {
		return err
	}
	if rd.Version != version {
		return fmt.Errorf("release.yaml is of %s", rd.Version)
	}
	for _, a := range rd.Artifacts {
		sum, size, err := hashPath(filepath.Join(dir, a.Path))
		if err != nil {
			return err
		}
		if sum != a.SHA256 || size != a.Size {
			return fmt.Errorf("%s has sha256 %s and %d bytes; its release document says %s and %d", a.Path, sum, size, a.SHA256, a.Size)
		}
	}
	return nil
}
