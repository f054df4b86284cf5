package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// A trial boot of a newer release rewrites the state file; when its trial
// fails, the proven slot's older daemon must read it (and a newer daemon
// must read an older one's), or the machine never comes back.
func TestStateReadAcrossReleases(t *testing.T) {
	armed := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		file string
		want *diskState
		err  string
	}{
		{
			name: "written by a newer daemon, with fields this one does not know",
			file: `{"formatVersion": 2, "bootID": "b-2", "futureField": {"x": 1},
				"trial": {"slot": "B", "version": "2026.11.20-001", "digest": "sha256:ab", "timeout": "10m0s",
					"armedAt": "2026-11-20T10:00:00Z", "armedBootID": "b-1", "failure": "the node is not Ready", "watchdogSeconds": 60}}`,
			want: &diskState{FormatVersion: stateFormat, BootID: "b-2", Trial: &trialRecord{Slot: "B", Version: "2026.11.20-001", Digest: "sha256:ab",
				Timeout: Duration(10 * time.Minute), ArmedAt: armed, ArmedBootID: "b-1", Failure: "the node is not Ready"}},
		},
		{
			name: "written by an older daemon, without the newer fields",
			file: `{"formatVersion": 1, "bootID": "b-1"}`,
			want: &diskState{FormatVersion: stateFormat, BootID: "b-1"},
		},
		{
			name: "a failed trial written by an older daemon: its resume value is the one it reported",
			file: `{"formatVersion": 1, "trialFailure": {"slot": "B", "version": "2026.11.20-001", "digest": "sha256:ab",
				"reason": "the node is not Ready", "at": "2026-11-20T10:00:00Z", "resume": "r1"}}`,
			want: &diskState{FormatVersion: stateFormat, TrialFailure: &trialFailure{Slot: "B", Version: "2026.11.20-001", Digest: "sha256:ab",
				Reason: "the node is not Ready", At: armed, Resume: "r1"}},
		},
		{name: "not JSON", file: `{"formatVersion": 1,`, err: "is unreadable"},
		{name: "no format version", file: `{"bootID": "b-1"}`, err: "has no format version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			assert.NilError(t, os.MkdirAll(filepath.Join(root, "state"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(root, StateFile), []byte(tc.file), 0o644))
			st, err := loadState(root)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, st, tc.want)
		})
	}
}

// TestK3sFailureMessageNamesWhatFailed holds the message a person reads on
// a Machine whose restart of k3s was rolled back: it names the fields, or
// the declared configuration when no field differed.
func TestK3sFailureMessageNamesWhatFailed(t *testing.T) {
	cases := []struct {
		name   string
		fields []string
		want   string
	}{
		{name: "one field", fields: []string{"settings.k3sArgs"}, want: "the restart of k3s for settings.k3sArgs (change c1) did not bring the node back Ready within 10m0s (the Node is NotReady); liken restarted k3s with the configuration it ran before, and no other machine restarts k3s for this change. Correct settings.k3sArgs in the Machine or Cluster prod, or run `liken rollout resume prod` to try the same value again"},
		{name: "two fields", fields: []string{"settings.k3sArgs", "settings.registryMirrors"}, want: "the restart of k3s for settings.k3sArgs, settings.registryMirrors (change c1)"},
		{name: "no field differed", want: "the restart of k3s for the declared configuration (change c1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &k3sFailure{Change: "c1", Fields: tc.fields, Reason: "the Node is NotReady", Timeout: Duration(10 * time.Minute)}
			got := f.message("prod")
			assert.Assert(t, strings.HasPrefix(got, tc.want), "got %q", got)
			assert.Assert(t, !strings.Contains(got, "for  ") && !strings.Contains(got, "Correct  in"), "a field list is empty in %q", got)
		})
	}
}
