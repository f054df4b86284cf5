package install

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"k8s.io/client-go/tools/clientcmd"

	"liken.sh/liken/cli/layer"
	"liken.sh/liken/node/boot"
	"liken.sh/liken/node/boot/diskimage"
	"liken.sh/liken/node/controlplane"
	"liken.sh/liken/node/daemon"
	"liken.sh/liken/release"
)

const v1, v2 = "2026.10.10-001", "2026.10.12-001"

// fixture is a channel with two releases and what a person installing has.
type fixture struct {
	channel string
	targets map[string]release.Target
	files   map[string][]byte // release v1's artifacts
	dir     string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{channel: t.TempDir(), targets: map[string]release.Target{}, files: map[string][]byte{}, dir: t.TempDir()}
	for _, v := range []string{v1, v2} {
		src := t.TempDir()
		var sources []release.Source
		for _, p := range []string{release.RootfsPath, release.KernelPath, release.InitrdPath} {
			b := []byte(strings.Repeat(v+" "+p+"\n", 3000))
			file := filepath.Join(src, filepath.Base(p))
			assert.NilError(t, os.WriteFile(file, b, 0o644))
			sources = append(sources, release.Source{Path: p, File: file})
			if v == v1 {
				f.files[p] = b
			}
		}
		digest, err := release.Build(f.channel, v, sources, time.Now())
		assert.NilError(t, err)
		f.targets[v] = release.Target{Version: v, Digest: digest}
	}
	return f
}

// layer packs a layer whose Cluster catalogues entries, with the leader
// node-1 and the worker node-2, and returns its path.
func (f *fixture) layer(t *testing.T, catalog ...release.Target) string {
	t.Helper()
	var entries strings.Builder
	for _, c := range catalog {
		fmt.Fprintf(&entries, "    - version: %q\n      digest: %s\n", c.Version, c.Digest)
	}
	docs := fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Cluster
metadata:
  name: mycluster
spec:
  version: %q
  releases:
    source: https://releases.example.com
    catalog:
%s  network:
    endpoint: https://10.0.0.10:6443
---
`, catalog[0].Version, entries.String())
	for i, m := range []string{"node-1", "node-2"} {
		role := map[int]string{0: "Leader", 1: "Worker"}[i]
		docs += fmt.Sprintf(`apiVersion: liken.sh/v1alpha1
kind: Machine
metadata:
  name: %s
spec:
  cluster: mycluster
  role: %s
  rebootPolicy: Auto
  ports:
  - name: eth0
    addresses: [10.0.0.1%d/24]
---
`, m, role, i+1)
	}
	parsed, errs := layer.ParseDocuments("fleet.yaml", strings.NewReader(docs))
	assert.Assert(t, is.Len(errs, 0), "%v", errs)
	cluster, machines, errs := layer.CheckFleet(parsed)
	assert.Assert(t, is.Len(errs, 0), "%v", errs)
	id, err := layer.GenerateIdentity(layer.GenerateOptions{Cluster: "mycluster"})
	assert.NilError(t, err)
	tokens, err := layer.MachineTokens(machines, time.Now().Add(layer.DefaultJoinTokenTTL), nil)
	assert.NilError(t, err)
	p := filepath.Join(t.TempDir(), "layer.tgz")
	assert.NilError(t, (&layer.Layer{Cluster: cluster, Machines: machines, Identity: id, Tokens: tokens}).WriteFile(p, false))
	return p
}

// testBootCode stands for GRUB: recognisable bytes where GRUB's go, and
// the BIOS core image's block list starting at sector 2, as grub-mkimage
// leaves it.
var testBootCode = func() *BootCode {
	core := bytes.Repeat([]byte("core"), 8000)
	binary.LittleEndian.PutUint64(core[diskimage.SectorSize-12:], 2)
	return &BootCode{BootImg: bytes.Repeat([]byte{0xb0}, diskimage.SectorSize), CoreImg: core, EFIImg: bytes.Repeat([]byte("efi!"), 5000)}
}()

func (f *fixture) options(t *testing.T, layerFile string) Options {
	return Options{
		Disk: filepath.Join(t.TempDir(), "disk.img"), Release: filepath.Join(f.channel, v1), Layer: layerFile, Machine: "node-1",
		GRUB: testBootCode, TempDir: t.TempDir(),
		host: host{mountinfo: writeFile(t, "mountinfo", ""), swaps: writeFile(t, "swaps", "Filename\tType\tSize\tUsed\tPriority\n"), sysfs: t.TempDir()},
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// partFile reads a file from the ext file system of partition i with
// debugfs.
func partFile(t *testing.T, disk string, p diskimage.GPTPartition, path string) []byte {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+path, fmt.Sprintf("%s?offset=%d", disk, int64(p.First)*diskimage.SectorSize)).Output()
	assert.NilError(t, err, "debugfs cat %s", path)
	return out
}

func partList(t *testing.T, disk string, p diskimage.GPTPartition, dir string) []string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "ls "+dir, fmt.Sprintf("%s?offset=%d", disk, int64(p.First)*diskimage.SectorSize)).Output()
	assert.NilError(t, err, "debugfs ls %s", dir)
	var names []string
	for _, n := range strings.Fields(string(out)) {
		if strings.HasPrefix(n, "(") || n == "." || n == ".." || strings.Trim(n, "0123456789") == "" {
			continue
		}
		names = append(names, n)
	}
	return names
}

// TestInstallImage writes an image file and reads back what a machine
// boots from: the partition table, GRUB, the boot partition, the layer and
// slot A, each file system checked by e2fsck.
func TestInstallImage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		http     bool // the release from a channel on the web
		machine  string
		leader   bool
		external bool // Options.ExternalControlPlane
	}{
		{"leader, release folder", false, "node-1", true, false},
		{"leader, release URL", true, "node-1", true, false},
		{"worker, release folder", false, "node-2", false, false},
		{"leader of a control plane on the host", false, "node-1", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			lay := f.layer(t, f.targets[v1], f.targets[v2])
			o := f.options(t, lay)
			o.Machine = tc.machine
			o.ExternalControlPlane = tc.external
			if tc.http {
				srv := httptest.NewServer(http.FileServer(http.Dir(f.channel)))
				defer srv.Close()
				o.Release = srv.URL + "/" + v1 + "/"
			}
			var progress bytes.Buffer
			o.Progress = &progress
			res, err := Install(context.Background(), o)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(res.Version, v1))
			assert.Check(t, is.Contains(progress.String(), "Partition 3 of 3, liken-slots"))

			fi, err := os.Stat(o.Disk)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(fi.Size(), res.Size))
			disk, err := os.ReadFile(o.Disk)
			assert.NilError(t, err)

			// The partition table and GRUB for both firmwares.
			gpt, err := diskimage.ReadGPT(bytes.NewReader(disk), int64(len(disk)))
			assert.NilError(t, err)
			parts := gpt.Partitions
			assert.DeepEqual(t, parts, res.Partitions)
			assert.Assert(t, is.Len(parts, 5))
			size := func(p diskimage.GPTPartition) int64 { return int64(p.Last-p.First+1) * 512 }
			for i, want := range []struct {
				name  string
				typ   diskimage.GUID
				bytes int64
			}{
				PartBoot:     {BootLabel, diskimage.GUIDLinuxFS, BootSize},
				PartLayer:    {LayerLabel, diskimage.GUIDLinuxFS, LayerSize},
				PartSlots:    {SlotsLabel, diskimage.GUIDLinuxFS, size(parts[PartSlots])},
				PartBIOSBoot: {"BIOS boot", diskimage.GUIDBIOSBoot, (2048 - 34) * 512},
				PartESP:      {"EFI system", diskimage.GUIDESP, ESPSize},
			} {
				assert.Check(t, is.Equal(parts[i].Name, want.name))
				assert.Check(t, is.Equal(parts[i].Type, want.typ), want.name)
				assert.Check(t, is.Equal(size(parts[i]), want.bytes), want.name)
			}
			assert.Check(t, is.Equal(parts[PartBIOSBoot].First, uint64(34)), "the BIOS boot partition right after the GPT")
			assert.Check(t, is.Equal(parts[PartESP].First, uint64(2048)))
			assert.Check(t, is.Equal(parts[PartBoot].First, parts[PartESP].Last+1))
			assert.Check(t, fi.Size()-int64(parts[PartSlots].Last+1)*512 < 2<<20, "the slot store takes the rest of the disk but the backup GPT's MiB")
			// BIOS: boot.img in the protective MBR, reading the core image
			// from the BIOS boot partition; its block list continues there.
			assert.Check(t, bytes.Equal(disk[:0x5c], testBootCode.BootImg[:0x5c]), "boot.img in the MBR")
			assert.Check(t, is.Equal(binary.LittleEndian.Uint64(disk[0x5c:]), uint64(34)), "boot.img reads the core image from sector 34")
			core := disk[34*512 : 34*512+len(testBootCode.CoreImg)]
			assert.Check(t, is.Equal(binary.LittleEndian.Uint64(core[512-12:]), uint64(35)), "the core image's block list from sector 35")
			assert.Check(t, bytes.Equal(core[512:], testBootCode.CoreImg[512:]), "the core image")
			// UEFI: a FAT32 file system on the EFI system partition
			// holding GRUB's EFI image (e2e/boot boots it with OVMF).
			esp := disk[parts[PartESP].First*512 : (parts[PartESP].Last+1)*512]
			assert.Check(t, is.Equal(string(esp[82:90]), "FAT32   "))
			assert.Check(t, bytes.Contains(esp, testBootCode.EFIImg), "GRUB's EFI image on the EFI system partition")

			for i, p := range parts[:PartSlots+1] {
				out, err := exec.Command("e2fsck", "-fn", fmt.Sprintf("%s?offset=%d", o.Disk, int64(p.First)*512)).CombinedOutput()
				assert.Check(t, err, "partition %d: %s", i+1, out)
			}

			// The boot partition.
			boots := parts[0]
			assert.Check(t, bytes.Equal(partFile(t, o.Disk, boots, "/grub/grub.cfg"), boot.GrubConfig()))
			for _, env := range []string{"/grub/grubenv", "/grub/grubenv.bak"} {
				st, err := boot.Decode(partFile(t, o.Disk, boots, env))
				assert.NilError(t, err)
				assert.Check(t, is.Equal(st, boot.State{Proven: boot.SlotA}), env)
			}
			assert.Check(t, bytes.Equal(partFile(t, o.Disk, boots, "/A/vmlinuz"), f.files[release.KernelPath]))
			assert.Check(t, bytes.Equal(partFile(t, o.Disk, boots, "/A/initrd.img"), f.files[release.InitrdPath]))
			assert.Check(t, is.Len(partList(t, o.Disk, boots, "/B"), 0))

			// The layer partition: a leader's holds the whole identity and
			// every machine's join token, a worker's the certificates and
			// its own join token, no private key and no other's token.
			l, err := layer.ReadFile(lay, layer.DefaultLimits)
			assert.NilError(t, err)
			onDisk, err := layer.Read(bytes.NewReader(partFile(t, o.Disk, parts[1], "/"+LayerFile)), layer.DefaultLimits)
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(onDisk.Cluster.YAML, l.Cluster.YAML))
			assert.Check(t, is.Equal(onDisk.Identity.HasPrivateKeys(), tc.leader))
			for name, b := range l.Identity.Files {
				got, ok := onDisk.Identity.Files[name]
				if (strings.HasSuffix(name, ".key") || name == layer.TokenFile) && !tc.leader {
					assert.Check(t, !ok, "a worker's disk holds the identity's %s", name)
					continue
				}
				assert.Check(t, ok && bytes.Equal(got, b), "%s on the disk differs from the layer's", name)
			}
			assert.Check(t, is.Equal(string(partFile(t, o.Disk, parts[1], "/"+MachineFile)), tc.machine+"\n"))
			// Its Machine document, as liken-node reads it.
			docFile := filepath.Join(t.TempDir(), MachineDocFile)
			assert.NilError(t, os.WriteFile(docFile, partFile(t, o.Disk, parts[1], "/"+MachineDocFile), 0o600))
			lm, err := daemon.ReadLayerMachine(docFile)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(lm.Name, tc.machine))
			// The machine's own static address, which applies before it
			// joins.
			address := map[string]string{"node-1": "10.0.0.11/24", "node-2": "10.0.0.12/24"}[tc.machine]
			assert.Check(t, is.DeepEqual(partList(t, o.Disk, parts[1], "/"+NetworkDir), []string{"50-liken-eth0.network"}))
			assert.Check(t, is.Contains(string(partFile(t, o.Disk, parts[1], "/"+NetworkDir+"/50-liken-eth0.network")), "Name=eth0\n\n[Network]\nAddress="+address+"\n"))
			// The kubelet checks the API server's client certificate
			// (kubectl logs, exec) against the identity's client CA.
			assert.Check(t, bytes.Equal(partFile(t, o.Disk, parts[1], "/"+ClientCAFile), l.Identity.Files["client-ca.crt"]))
			own, ok := l.Token(tc.machine)
			assert.Assert(t, ok)
			if tc.leader {
				assert.Check(t, is.DeepEqual(onDisk.Tokens, l.Tokens))
			} else {
				assert.Check(t, is.DeepEqual(onDisk.Tokens, []controlplane.MachineToken{own}))
			}
			// What kubelet and liken-node join with: the Cluster's
			// endpoint, the server CA, the machine's own join token;
			// readable by root only.
			join, err := clientcmd.Load(partFile(t, o.Disk, parts[1], "/"+BootstrapFile))
			assert.NilError(t, err)
			ctx := join.Contexts[join.CurrentContext]
			assert.Assert(t, ctx != nil)
			assert.Check(t, is.Equal(join.Clusters[ctx.Cluster].Server, "https://10.0.0.10:6443"))
			assert.Check(t, bytes.Equal(join.Clusters[ctx.Cluster].CertificateAuthorityData, l.Identity.Files["server-ca.crt"]))
			assert.Check(t, is.Equal(join.AuthInfos[ctx.AuthInfo].Token, own.Token))
			stat, err := exec.Command("debugfs", "-R", "stat /"+BootstrapFile, fmt.Sprintf("%s?offset=%d", o.Disk, int64(parts[1].First)*512)).Output()
			assert.NilError(t, err)
			assert.Check(t, is.Contains(string(stat), "Mode:  0600"))

			// A leader's control plane: leader/ with its configuration and
			// the identity, as liken-node's control plane setup reads them.
			if !tc.leader || tc.external {
				assert.Check(t, !slices.Contains(partList(t, o.Disk, parts[1], "/"), LeaderDir), "a disk with no control plane of its own has %s/", LeaderDir)
			} else {
				checkLeaderDir(t, o.Disk, parts[1], l)
			}

			// The slot store: A holds the release, B is empty.
			slotsPart := parts[2]
			for p, b := range f.files {
				assert.Check(t, bytes.Equal(partFile(t, o.Disk, slotsPart, "/slots/A/"+p), b), p)
			}
			doc := partFile(t, o.Disk, slotsPart, "/slots/A/release.yaml")
			assert.Check(t, is.Equal(release.Digest(doc), f.targets[v1].Digest))
			assert.Check(t, is.Len(partList(t, o.Disk, slotsPart, "/slots/B"), 0))
			var st struct {
				Slots []struct{ Name, State, Version string }
			}
			assert.NilError(t, json.Unmarshal(partFile(t, o.Disk, slotsPart, "/state/slots.json"), &st))
			assert.Check(t, is.Len(st.Slots, 2))
			assert.Check(t, is.Equal(st.Slots[0].State+" "+st.Slots[0].Version, "Active "+v1))
			assert.Check(t, is.Equal(st.Slots[1].State, "Empty"))
		})
	}
}

// checkLeaderDir reads a Leader's leader/ from its layer partition: its
// folders 0700 and files 0600, a config.yaml that controlplane.Load
// accepts with this leader's configuration, and the identity, with which
// controlplane.Setup issues the control plane's certificates.
func checkLeaderDir(t *testing.T, disk string, p diskimage.GPTPartition, l *layer.Layer) {
	t.Helper()
	mode := func(file string) string {
		out, err := exec.Command("debugfs", "-R", "stat "+file, fmt.Sprintf("%s?offset=%d", disk, int64(p.First)*diskimage.SectorSize)).Output()
		assert.NilError(t, err)
		_, m, _ := strings.Cut(string(out), "Mode:  ")
		return strings.Fields(m)[0]
	}
	local := t.TempDir()
	read := func(name string) {
		file := "/" + LeaderDir + "/" + name
		assert.Check(t, is.Equal(mode(file), "0600"), file)
		dst := filepath.Join(local, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(dst), 0o700))
		assert.NilError(t, os.WriteFile(dst, partFile(t, disk, p, file), 0o600))
	}
	for _, d := range []string{"", "/" + controlplane.IdentityDir, "/" + controlplane.IdentityDir + "/etcd"} {
		assert.Check(t, is.Equal(mode("/"+LeaderDir+d), "0700"), "/%s%s", LeaderDir, d)
	}
	read(controlplane.ConfigFile)
	for _, name := range layer.IdentityFiles() {
		read(controlplane.IdentityDir + "/" + name)
	}
	cfg, err := controlplane.Load(filepath.Join(local, controlplane.ConfigFile))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(cfg, controlplane.Config{
		Machine: "node-1", Endpoint: "https://10.0.0.10:6443", ServiceCIDR: "10.96.0.0/16", PodCIDR: "10.244.0.0/16", ClusterDNS: "10.96.0.10", FirstLeader: "node-1",
		Leaders: []controlplane.Leader{{Name: "node-1", APIServer: "https://10.0.0.11:6443", EtcdClient: "https://10.0.0.11:2379", EtcdPeer: "https://10.0.0.11:2380"}},
	}))
	for _, name := range layer.IdentityFiles() {
		b, err := os.ReadFile(filepath.Join(local, controlplane.IdentityDir, filepath.FromSlash(name)))
		assert.NilError(t, err)
		assert.Check(t, bytes.Equal(b, l.Identity.Files[name]), "%s/%s differs from the layer's", controlplane.IdentityDir, name)
	}
	assert.Check(t, controlplane.Setup(cfg, filepath.Join(local, controlplane.IdentityDir), t.TempDir(), time.Now()))
	// Every machine's join token, which the leader's init makes tokens of
	// the cluster.
	read(controlplane.JoinTokensFile)
	tokens, err := controlplane.LoadJoinTokens(filepath.Join(local, controlplane.JoinTokensFile))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(tokens.Tokens, l.Tokens))
	// The layer's documents, which the first leader's init creates.
	read(controlplane.DocumentsFile)
	docs, err := controlplane.ReadDocuments(filepath.Join(local, controlplane.DocumentsFile))
	assert.NilError(t, err)
	var names []string
	for _, d := range docs {
		names = append(names, d.GetKind()+" "+d.GetName())
	}
	assert.Check(t, is.DeepEqual(names, []string{"Cluster " + l.Cluster.Name, "Machine node-1", "Machine node-2"}))
}

// TestInstallRefuses: what liken install refuses, and that it writes
// nothing to the disk then.
func TestInstallRefuses(t *testing.T) {
	f := newFixture(t)
	good := f.layer(t, f.targets[v1])
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, o *Options)
		want   string
		inUse  bool // about a disk in use: no new file can be
	}{
		{
			name:   "a machine the layer does not have",
			change: func(t *testing.T, o *Options) { o.Machine = "node-9" },
			want:   `machine "node-9" is not in the layer ` + good + ` (it holds node-1, node-2)`,
		},
		{
			name:   "a release the Cluster does not catalogue",
			change: func(t *testing.T, o *Options) { o.Release = filepath.Join(f.channel, v2) },
			want:   "release " + v2 + " (" + filepath.Join(f.channel, v2) + ") is not in Cluster mycluster's catalog (spec.releases.catalog lists " + v1 + ")",
		},
		{
			name: "a release catalogued with another digest",
			change: func(t *testing.T, o *Options) {
				o.Layer = f.layer(t, release.Target{Version: v1, Digest: f.targets[v2].Digest})
			},
			want: "but Cluster mycluster catalogues release " + v1 + " with digest " + f.targets[v2].Digest,
		},
		{
			name: "a layer of two leaders, one that cannot be reached",
			change: func(t *testing.T, o *Options) {
				// Packed by a liken that did not check reach URLs.
				l, err := layer.ReadFile(good, layer.DefaultLimits)
				assert.NilError(t, err)
				m, err := layer.ValidateDocument("machines/node-3.yaml", []byte("apiVersion: liken.sh/v1alpha1\nkind: Machine\nmetadata: {name: node-3}\nspec: {cluster: mycluster, role: Leader}\n"))
				assert.NilError(t, err)
				l.Machines = append(l.Machines, m)
				o.Layer = filepath.Join(t.TempDir(), "old.tgz")
				assert.NilError(t, l.WriteFile(o.Layer, false))
			},
			want: "Machine node-3: is one of 2 Leaders but has no static address (spec.ports[].addresses) and lacks the annotations liken.sh/apiserver-url, liken.sh/etcd-client-url, liken.sh/etcd-peer-url",
		},
		{
			name: "an image file attached to a loop device",
			change: func(t *testing.T, o *Options) {
				dir := filepath.Join(o.host.sysfs, "block", "loop3", "loop")
				assert.NilError(t, os.MkdirAll(dir, 0o755))
				assert.NilError(t, os.WriteFile(filepath.Join(dir, "backing_file"), []byte(o.Disk+"\n"), 0o644))
			},
			want:  "disk.img is in use: it is attached to /dev/loop3",
			inUse: true,
		},
		{
			name: "a mounted image file",
			change: func(t *testing.T, o *Options) {
				o.host.mountinfo = writeFile(t, "mountinfo", "36 35 0:45 / /mnt/my\\040disk rw,relatime shared:1 - ext4 "+o.Disk+" rw\n")
			},
			want:  `disk.img is in use: it is mounted on /mnt/my disk`,
			inUse: true,
		},
		{
			name: "no GRUB to be found",
			change: func(t *testing.T, o *Options) {
				o.GRUB = nil
				t.Setenv("PATH", t.TempDir())
				t.Setenv("XDG_CACHE_HOME", t.TempDir())
			},
			want: "no GRUB for both BIOS and EFI on this computer",
		},
		{
			name:   "an image file too small",
			change: func(t *testing.T, o *Options) { o.Size = 100 << 20 },
			want:   "--size 100.0 MiB is too small",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := f.options(t, good)
			old := []byte("the disk's old content")
			assert.NilError(t, os.WriteFile(o.Disk, old, 0o644))
			tc.change(t, &o)
			_, err := Install(context.Background(), o)
			assert.Check(t, is.ErrorContains(err, tc.want))
			b, err := os.ReadFile(o.Disk)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(string(b), string(old)), "the disk was written")
		})
		if tc.inUse {
			continue
		}
		t.Run(tc.name+", new image file", func(t *testing.T) {
			o := f.options(t, good)
			tc.change(t, &o)
			_, err := Install(context.Background(), o)
			assert.Check(t, is.ErrorContains(err, tc.want))
			_, err = os.Stat(o.Disk)
			assert.Check(t, os.IsNotExist(err), "a new image file is removed when the install fails")
		})
	}
}

// fakeDevice is the FileInfo of a block device with a device number.
type fakeDevice struct {
	os.FileInfo
	rdev uint64
}

func (d fakeDevice) Sys() any { return &syscall.Stat_t{Rdev: d.rdev} }

// TestDeviceInUse: a block device is refused when it or a partition of it
// is mounted, swap, or held by another device, and a partition is refused
// outright. The kernel's view is a fake /sys and mountinfo.
func TestDeviceInUse(t *testing.T) {
	// sdb is 8:16, its partitions 8:17 and 8:18.
	sysfs := func(t *testing.T) string {
		root := t.TempDir()
		disk := filepath.Join(root, "devices", "sdb")
		for i, dev := range []string{"8:17", "8:18"} {
			p := filepath.Join(disk, fmt.Sprintf("sdb%d", i+1))
			assert.NilError(t, os.MkdirAll(filepath.Join(p, "holders"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(p, "dev"), []byte(dev+"\n"), 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(p, "partition"), []byte(fmt.Sprint(i+1)), 0o644))
			assert.NilError(t, os.MkdirAll(filepath.Join(root, "dev", "block"), 0o755))
			assert.NilError(t, os.Symlink(p, filepath.Join(root, "dev", "block", dev)))
		}
		assert.NilError(t, os.MkdirAll(filepath.Join(disk, "holders"), 0o755))
		assert.NilError(t, os.Symlink(disk, filepath.Join(root, "dev", "block", "8:16")))
		return root
	}
	fi, err := os.Stat(t.TempDir())
	assert.NilError(t, err)
	mk := func(major, minor uint64) fakeDevice { return fakeDevice{fi, major<<8 | minor} }
	for _, tc := range []struct {
		name      string
		dev       fakeDevice
		mountinfo string
		setup     func(t *testing.T, sys string)
		want      string
	}{
		{name: "free", dev: mk(8, 16), mountinfo: "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"},
		{name: "a partition mounted", dev: mk(8, 16), mountinfo: "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 8:18 / /data rw - ext4 /dev/sdb2 rw\n",
			want: "/dev/sdb is in use: /dev/sdb2 is mounted on /data; unmount it first"},
		{name: "the disk mounted", dev: mk(8, 16), mountinfo: "40 22 8:16 / /media/usb rw - vfat /dev/sdb rw\n",
			want: "/dev/sdb is in use: /dev/sdb is mounted on /media/usb"},
		{name: "held by the device mapper", dev: mk(8, 16), setup: func(t *testing.T, sys string) {
			assert.NilError(t, os.Mkdir(filepath.Join(sys, "devices", "sdb", "sdb1", "holders", "dm-0"), 0o755))
		}, want: "/dev/sdb is in use: /dev/sdb1 is held by dm-0 (device mapper, RAID or LVM)"},
		{name: "a partition given", dev: mk(8, 17), want: "/dev/sdb is a partition: give the whole disk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := host{mountinfo: writeFile(t, "mountinfo", tc.mountinfo), swaps: writeFile(t, "swaps", "Filename\n"), sysfs: sysfs(t)}
			if tc.setup != nil {
				tc.setup(t, h.sysfs)
			}
			err := h.deviceInUse("/dev/sdb", tc.dev)
			if tc.want == "" {
				assert.NilError(t, err)
				return
			}
			assert.Check(t, is.ErrorContains(err, tc.want))
		})
	}
}

// TestInstallFolder: a machine's folder (Options.Folder) holds the same
// content as the disk's three partitions, appears only once complete, and
// an existing folder is refused untouched.
func TestInstallFolder(t *testing.T) {
	f := newFixture(t)
	lay := f.layer(t, f.targets[v1], f.targets[v2])
	o := f.options(t, lay)
	o.Disk = ""
	o.Machine = "node-2"
	o.Folder = filepath.Join(t.TempDir(), "node-2")
	res, err := Install(context.Background(), o)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(res.Version, v1))

	names, err := os.ReadDir(filepath.Dir(o.Folder))
	assert.NilError(t, err)
	assert.Check(t, is.Len(names, 1), "nothing but the machine's folder is left beside it")
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(o.Folder, p))
		assert.NilError(t, err)
		return b
	}
	st, err := boot.Decode(read(BootLabel + "/grub/grubenv"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st, boot.State{Proven: boot.SlotA}))
	assert.Check(t, bytes.Equal(read(BootLabel+"/A/vmlinuz"), f.files[release.KernelPath]))
	assert.Check(t, is.Equal(string(read(LayerLabel+"/"+MachineFile)), "node-2\n"))
	for p, b := range f.files {
		assert.Check(t, bytes.Equal(read(SlotsLabel+"/slots/A/"+p), b), p)
	}
	_, err = os.Stat(filepath.Join(o.Folder, "download"))
	assert.Check(t, os.IsNotExist(err))

	// A second install into the same folder changes nothing.
	before := read(LayerLabel + "/" + MachineFile)
	o.Machine = "node-1"
	_, err = Install(context.Background(), o)
	assert.Check(t, is.ErrorContains(err, o.Folder+" already exists"))
	assert.Check(t, bytes.Equal(read(LayerLabel+"/"+MachineFile), before))

	o.Disk = filepath.Join(t.TempDir(), "disk.img")
	_, err = Install(context.Background(), o)
	assert.Check(t, is.ErrorContains(err, "give a disk or a folder, not both"))
}
