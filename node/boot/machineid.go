package boot

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"liken.sh/liken/internal/atomicfile"
)

// MachineIDFile is, in the slot store, the machine's systemd machine ID:
// made at its first boot and kept, so that every boot's journal is under
// one ID (journald keeps a folder per ID, and journalctl, which the
// kubelet's log query runs, reads only the current ID's: earlier boots
// are readable only under the same ID).
const MachineIDFile = "machine/machine-id"

// machineID is what systemd accepts in /etc/machine-id.
var machineID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// EnsureMachineID returns the machine ID kept in the slot store at store
// (MachineIDFile), after making and writing a new one when there is none
// or it is not a machine ID. A power cut while it is written leaves no
// file or the whole one: the next boot makes another.
func EnsureMachineID(store string) (string, error) {
	p := filepath.Join(store, MachineIDFile)
	b, err := os.ReadFile(p)
	if err == nil {
		if id := string(bytes.TrimSpace(b)); machineID.MatchString(id) && id != "00000000000000000000000000000000" {
			return id, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading the machine ID: %w", err)
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	// A random (version 4) ID, as systemd makes them.
	raw[6] = raw[6]&0x0f | 0x40
	raw[8] = raw[8]&0x3f | 0x80
	id := hex.EncodeToString(raw[:])
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	if err := atomicfile.Write(p, []byte(id+"\n"), 0o444); err != nil {
		return "", fmt.Errorf("writing the machine ID: %w", err)
	}
	return id, nil
}

// SetMachineID gives the booted root at root the machine ID kept in the
// slot store mounted at store: its /etc/machine-id (the /etc of a boot is
// in memory, so it is written at every boot).
func SetMachineID(root, store string) error {
	id, err := EnsureMachineID(store)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "etc", "machine-id"), []byte(id+"\n"), 0o444)
}
