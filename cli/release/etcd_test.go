package release

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	noderelease "liken.sh/liken/release"
)

// published is a release already in the channel: its version and its
// packages.txt ("" publishes none).
type published struct{ version, packages string }

// channelWith publishes releases into a new channel directory, as earlier
// runs of liken release would have.
func channelWith(t *testing.T, releases ...published) string {
	t.Helper()
	dir := t.TempDir()
	channel := filepath.Join(dir, "channel")
	assert.NilError(t, os.Mkdir(channel, 0o755))
	img := image(t, dir, "rootfs.img", "data")
	for _, r := range releases {
		sources := []noderelease.Source{{Path: noderelease.RootfsPath, File: img}}
		if r.packages != "" {
			p := filepath.Join(dir, "packages-"+r.version+".txt")
			assert.NilError(t, os.WriteFile(p, []byte(r.packages), 0o644))
			sources = append(sources, noderelease.Source{Path: noderelease.PackagesPath, File: p})
		}
		_, err := noderelease.Build(channel, r.version, sources, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
		assert.NilError(t, err)
	}
	return channel
}

// pkgs is a packages.txt as make image writes it, naming etcd version v
// ("" names no etcd).
func pkgs(v string) string {
	s := "bash 5.2.15-2+b7\nbuilt:containerd v2.1.4\n"
	if v != "" {
		s += "built:etcd " + v + "\n"
	}
	return s + "built:kubelet v1.37.2\nsystemd 252.38-1~deb12u1\n"
}

func TestCheckEtcd(t *testing.T) {
	const v = "2026.12.05-001"
	for _, tc := range []struct {
		name     string
		channel  []published
		packages string // the new release's packages.txt; "-" carries none
		allow    bool
		damage   func(t *testing.T, channel string)
		want     EtcdCheck // Message is checked by wantText
		wantText []string  // in the message, or in the error with wantErr
		wantErr  bool
	}{
		{
			name:     "empty channel",
			packages: pkgs("v3.7.0"),
			want:     EtcdCheck{Outcome: EtcdNoPreviousRelease, Etcd: "v3.7.0"},
			wantText: []string{"no release before release 2026.12.05-001 (etcd v3.7.0)", "no etcd version to compare with"},
		},
		{
			name:     "only later releases",
			channel:  []published{{"2026.12.06-001", pkgs("v3.6.0")}},
			packages: pkgs("v3.7.0"),
			want:     EtcdCheck{Outcome: EtcdNoPreviousRelease, Etcd: "v3.7.0"},
			wantText: []string{"no release before"},
		},
		{
			name:     "same minor, newer patch",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.7.2"),
			want:     EtcdCheck{Outcome: EtcdSameMinor, Etcd: "v3.7.2", Previous: "2026.12.01-001", PreviousEtcd: "v3.7.0"},
			wantText: []string{"etcd v3.7.2 keeps the minor version 3.7 of the channel's previous release 2026.12.01-001 (etcd v3.7.0)"},
		},
		{
			name:     "the previous release is the highest below, not the newest",
			channel:  []published{{"2026.12.01-001", pkgs("v3.6.0")}, {"2026.12.02-001", pkgs("v3.7.0")}, {"2026.12.09-001", pkgs("v3.8.0")}},
			packages: pkgs("v3.7.1"),
			want:     EtcdCheck{Outcome: EtcdSameMinor, Etcd: "v3.7.1", Previous: "2026.12.02-001", PreviousEtcd: "v3.7.0"},
			wantText: []string{"2026.12.02-001"},
		},
		{
			name:     "newer minor",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.8.0"),
			wantErr:  true,
			wantText: []string{
				"release 2026.12.05-001 carries etcd v3.8.0 and the channel's previous release 2026.12.01-001 carries etcd v3.7.0",
				"from 3.7 to 3.8", "cluster version and storage schema", "cannot go back to the older etcd of its proven slot",
				"Publish a release with etcd 3.7.x", "--allow-etcd-minor-change",
			},
		},
		{
			name:     "newer minor allowed",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.8.0"),
			allow:    true,
			want:     EtcdCheck{Outcome: EtcdChangeAllowed, Etcd: "v3.8.0", Previous: "2026.12.01-001", PreviousEtcd: "v3.7.0"},
			wantText: []string{"changes from 3.7 (etcd v3.7.0 in 2026.12.01-001) to 3.8 (etcd v3.8.0); --allow-etcd-minor-change allowed it"},
		},
		{
			name:     "older minor",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.6.9"),
			wantErr:  true,
			wantText: []string{"etcd v3.6.9", "etcd v3.7.0", "from 3.7 to 3.6", "--allow-etcd-minor-change"},
		},
		{
			name:     "newer major",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v4.0.0"),
			wantErr:  true,
			wantText: []string{"from 3.7 to 4.0"},
		},
		{
			name:     "the previous release carries no packages.txt",
			channel:  []published{{"2026.12.01-001", ""}},
			packages: pkgs("v3.8.0"),
			want:     EtcdCheck{Outcome: EtcdPreviousUnknown, Etcd: "v3.8.0", Previous: "2026.12.01-001"},
			wantText: []string{"previous release 2026.12.01-001 does not say its etcd version (it carries no packages.txt)", "without comparing"},
		},
		{
			name:     "the previous release's packages.txt names no etcd",
			channel:  []published{{"2026.12.01-001", pkgs("")}},
			packages: pkgs("v3.8.0"),
			want:     EtcdCheck{Outcome: EtcdPreviousUnknown, Etcd: "v3.8.0", Previous: "2026.12.01-001"},
			wantText: []string{"its packages.txt has no built:etcd line"},
		},
		{
			name:     "the previous release's directory is gone",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.8.0"),
			damage: func(t *testing.T, channel string) {
				assert.NilError(t, os.RemoveAll(filepath.Join(channel, "2026.12.01-001")))
			},
			want:     EtcdCheck{Outcome: EtcdPreviousUnknown, Etcd: "v3.8.0", Previous: "2026.12.01-001"},
			wantText: []string{"the index lists it, but", "release.yaml is missing"},
		},
		{
			name:     "neither says",
			channel:  []published{{"2026.12.01-001", ""}},
			packages: "-",
			want:     EtcdCheck{Outcome: EtcdPreviousUnknown, Previous: "2026.12.01-001"},
			wantText: []string{"release 2026.12.05-001 was published without comparing"},
		},
		{
			name:     "the new release carries no packages.txt after one that names etcd",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: "-",
			wantErr:  true,
			wantText: []string{"release 2026.12.05-001 carries no packages.txt, so its etcd version cannot be compared",
				"previous release 2026.12.01-001 carries etcd v3.7.0", "--artifact packages.txt=FILE", "--allow-etcd-minor-change"},
		},
		{
			name:     "the new release carries no packages.txt, allowed",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: "-",
			allow:    true,
			want:     EtcdCheck{Outcome: EtcdChangeAllowed, Previous: "2026.12.01-001", PreviousEtcd: "v3.7.0"},
			wantText: []string{"was not compared with 2026.12.01-001's (v3.7.0); --allow-etcd-minor-change allowed it"},
		},
		{
			name:     "the new release's packages.txt names no etcd",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs(""),
			wantErr:  true,
			wantText: []string{"has a packages.txt without a built:etcd line", "--allow-etcd-minor-change"},
		},
		{
			name:     "the new release's etcd is no version",
			packages: pkgs("main"),
			wantErr:  true,
			wantText: []string{`names etcd "main", which is not a version such as v3.7.0`},
		},
		{
			name:     "the previous release's packages.txt was changed",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.8.0"),
			allow:    true,
			damage: func(t *testing.T, channel string) {
				p := filepath.Join(channel, "2026.12.01-001", "packages.txt")
				assert.NilError(t, os.WriteFile(p, []byte(pkgs("v3.8.0")), 0o644))
			},
			wantErr:  true,
			wantText: []string{"previous release 2026.12.01-001 is damaged", "does not match the release document", "restore"},
		},
		{
			name:     "the previous release's document was changed",
			channel:  []published{{"2026.12.01-001", pkgs("v3.7.0")}},
			packages: pkgs("v3.7.0"),
			damage: func(t *testing.T, channel string) {
				p := filepath.Join(channel, "2026.12.01-001", "release.yaml")
				b, err := os.ReadFile(p)
				assert.NilError(t, err)
				assert.NilError(t, os.WriteFile(p, append(b, "# edited\n"...), 0o644))
			},
			wantErr:  true,
			wantText: []string{"previous release 2026.12.01-001 is damaged", "index.yaml gives"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			channel := channelWith(t, tc.channel...)
			if tc.damage != nil {
				tc.damage(t, channel)
			}
			packages := ""
			if tc.packages != "-" {
				packages = filepath.Join(t.TempDir(), "packages.txt")
				assert.NilError(t, os.WriteFile(packages, []byte(tc.packages), 0o644))
			}
			got, err := checkEtcd(channel, v, packages, tc.allow)
			if tc.wantErr {
				assert.Assert(t, err != nil, "want a refusal, got %+v", got)
				for _, w := range tc.wantText {
					assert.Check(t, is.Contains(err.Error(), w))
				}
				return
			}
			assert.NilError(t, err)
			for _, w := range tc.wantText {
				assert.Check(t, is.Contains(got.Message, w))
			}
			got.Message = ""
			assert.DeepEqual(t, *got, tc.want)
		})
	}
}

// liken release refuses a release that changes etcd's minor version and
// writes nothing; --allow-etcd-minor-change publishes it and says so.
func TestReleaseEtcdMinorChange(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	img := image(t, ".", "rootfs.img", "data")
	assert.NilError(t, os.WriteFile("packages-3.7.txt", []byte(pkgs("v3.7.0")), 0o644))
	assert.NilError(t, os.WriteFile("packages-3.8.txt", []byte(pkgs("v3.8.0")), 0o644))

	_, stderr, err := runStreams(t, img, "--channel", "channel", "--artifact", "packages.txt=packages-3.7.txt")
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(stderr, "no release before release 2026.11.30-001 (etcd v3.7.0)"))
	_, stderr, err = runStreams(t, img, "--channel", "channel", "--artifact", "packages.txt=packages-3.7.txt")
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(stderr, "etcd v3.7.0 keeps the minor version 3.7 of the channel's previous release 2026.11.30-001"))
	index, err := os.ReadFile("channel/index.yaml")
	assert.NilError(t, err)

	_, err = run(t, img, "--channel", "channel", "--artifact", "packages.txt=packages-3.8.txt")
	assert.ErrorContains(t, err, "release 2026.11.30-003 carries etcd v3.8.0 and the channel's previous release 2026.11.30-002 carries etcd v3.7.0")
	assert.ErrorContains(t, err, "--allow-etcd-minor-change")
	after, err := os.ReadFile("channel/index.yaml")
	assert.NilError(t, err)
	assert.Equal(t, string(after), string(index), "a refused release must not reach the index")
	_, err = os.Stat("channel/2026.11.30-003")
	assert.Assert(t, os.IsNotExist(err), "a refused release must not be written")

	out, stderr, err := runStreams(t, img, "--channel", "channel", "--artifact", "packages.txt=packages-3.8.txt", "--allow-etcd-minor-change", "-o", "yaml")
	assert.NilError(t, err)
	assert.Assert(t, strings.HasPrefix(out, "- version: \"2026.11.30-003\"\n"), out)
	assert.Assert(t, is.Contains(stderr, "changes from 3.7 (etcd v3.7.0 in 2026.11.30-002) to 3.8 (etcd v3.8.0); --allow-etcd-minor-change allowed it"))
}
