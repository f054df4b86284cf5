package daemon

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestRoomFor(t *testing.T) {
	const gib, mibs = int64(1 << 30), int64(1 << 20)
	disk := fsSpace{Size: 10 * gib}
	for _, tc := range []struct {
		name      string
		need      int64
		free      int64
		datastore int64
		want      string // "" fits
	}{
		{name: "a worker with room", need: 300 * mibs, free: 5 * gib},
		{name: "a worker whose download would cross the eviction threshold", need: 300 * mibs, free: 1800 * mibs,
			want: "the release needs 300 MiB more on the slot store, and liken keeps 1792 MiB free besides (1536 MiB, the kubelet's eviction threshold of 15% of 10240 MiB, and a margin of 256 MiB), but 1800 MiB is free"},
		{name: "exactly the reserve left", need: 300 * mibs, free: 300*mibs + 1792*mibs},
		{name: "a leader keeps room for etcd", need: 300 * mibs, free: 2600 * mibs, datastore: 1000 * mibs,
			want: "1000 MiB for etcd to reach its quota"},
		{name: "a leader whose etcd has room", need: 300 * mibs, free: 4 * gib, datastore: 1000 * mibs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := disk
			fs.Free = tc.free
			err := roomFor(tc.need, fs, tc.datastore)
			if tc.want == "" {
				assert.NilError(t, err)
				return
			}
			assert.Assert(t, is.ErrorContains(err, tc.want))
			assert.Assert(t, is.ErrorContains(err, "the machine waits and retries"))
		})
	}
}
