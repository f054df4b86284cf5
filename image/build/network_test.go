package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"strings"
	"testing"
	"text/template"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// cniTemplate is the image's CNI configuration template, which containerd
// fills with the Node's pod range (containerd's conf_template).
const cniTemplate = "rootfs/etc/containerd/cni.conflist.tmpl"

// cniTemplateData is what containerd v2.2 gives the template: the Node's
// first range, all its ranges (spec.podCIDRs), and a default route for
// each of their families.
type cniTemplateData struct {
	PodCIDR       string
	PodCIDRRanges []string
	Routes        []string
}

// conflist is the part of a CNI configuration list the image sets.
type conflist struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []struct {
		Type      string          `json:"type"`
		Bridge    string          `json:"bridge"`
		IsGateway bool            `json:"isGateway"`
		Hairpin   bool            `json:"hairpinMode"`
		IPMasq    *bool           `json:"ipMasq"`
		Caps      map[string]bool `json:"capabilities"`
		IPAM      struct {
			Type   string                `json:"type"`
			Ranges [][]map[string]string `json:"ranges"`
			Routes []map[string]string   `json:"routes"`
		} `json:"ipam"`
	} `json:"plugins"`
}

// TestCNITemplate: the pod network containerd writes from the Node's pod
// range gives the machine's pods addresses of that range only, routes
// them out, and masquerades nothing (liken-node's LIKEN-POD-MASQ does).
func TestCNITemplate(t *testing.T) {
	tmpl, err := template.ParseFS(rootfs, cniTemplate)
	assert.NilError(t, err)
	for _, tc := range []struct {
		name   string
		data   cniTemplateData
		ranges [][]map[string]string
		routes []map[string]string
	}{
		{
			name:   "an IPv4 range",
			data:   cniTemplateData{PodCIDR: "10.244.3.0/24", PodCIDRRanges: []string{"10.244.3.0/24"}, Routes: []string{"0.0.0.0/0"}},
			ranges: [][]map[string]string{{{"subnet": "10.244.3.0/24"}}},
			routes: []map[string]string{{"dst": "0.0.0.0/0"}},
		},
		{
			name:   "an IPv6 range",
			data:   cniTemplateData{PodCIDR: "fd00:10:244:7::/64", PodCIDRRanges: []string{"fd00:10:244:7::/64"}, Routes: []string{"::/0"}},
			ranges: [][]map[string]string{{{"subnet": "fd00:10:244:7::/64"}}},
			routes: []map[string]string{{"dst": "::/0"}},
		},
		{
			name:   "two families",
			data:   cniTemplateData{PodCIDR: "10.244.3.0/24", PodCIDRRanges: []string{"10.244.3.0/24", "fd00:10:244:7::/64"}, Routes: []string{"0.0.0.0/0", "::/0"}},
			ranges: [][]map[string]string{{{"subnet": "10.244.3.0/24"}}, {{"subnet": "fd00:10:244:7::/64"}}},
			routes: []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			assert.NilError(t, tmpl.Execute(&out, tc.data))
			assert.Check(t, strings.HasPrefix(out.String(), "{"), "the template's comment is left in: %q", out.String())
			var c conflist
			dec := json.NewDecoder(&out)
			assert.NilError(t, dec.Decode(&c), out.String())
			assert.Check(t, is.Equal(c.CNIVersion, "1.0.0"))
			assert.Check(t, is.Equal(c.Name, "liken"))
			assert.Assert(t, is.Len(c.Plugins, 2))
			// The pods' hostPorts.
			assert.Check(t, is.Equal(c.Plugins[1].Type, "portmap"))
			assert.Check(t, c.Plugins[1].Caps["portMappings"])
			p := c.Plugins[0]
			assert.Check(t, is.Equal(p.Type, "bridge"))
			// 05-liken-pods.network leaves cni0 to the CNI plugin.
			assert.Check(t, is.Equal(p.Bridge, "cni0"))
			assert.Check(t, p.IsGateway)
			assert.Check(t, p.Hairpin, "a pod cannot reach itself through a Service")
			if assert.Check(t, p.IPMasq != nil, "ipMasq is not set: the bridge plugin's default may change") {
				assert.Check(t, !*p.IPMasq, "the bridge masquerades pod traffic, also to the pods of other machines")
			}
			assert.Check(t, is.Equal(p.IPAM.Type, "host-local"))
			assert.Check(t, is.DeepEqual(p.IPAM.Ranges, tc.ranges))
			assert.Check(t, is.DeepEqual(p.IPAM.Routes, tc.routes))
		})
	}
}

// TestNoPodNetworkBeforeTheRange: the image carries no CNI configuration,
// so a machine starts no pod before containerd writes one from its Node's
// range; containerd is told the template, and each kubelet start drops the
// configuration an earlier kubelet asked for.
func TestNoPodNetworkBeforeTheRange(t *testing.T) {
	_, err := fs.Stat(rootfs, "rootfs/etc/cni")
	assert.Check(t, err != nil, "the image carries a CNI configuration folder: pods would start before the Node has its range")
	config, err := fs.ReadFile(rootfs, "rootfs/etc/containerd/config.toml")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(config), "[plugins.'io.containerd.cri.v1.runtime'.cni]\n  # "))
	assert.Check(t, is.Contains(string(config), "\n  conf_template = '/"+strings.TrimPrefix(cniTemplate, "rootfs/")+"'\n"))
	unit, err := fs.ReadFile(rootfs, "rootfs/etc/systemd/system/kubelet.service")
	assert.NilError(t, err)
	// containerd v2.2's name for the file it writes from the template.
	assert.Check(t, is.Contains(string(unit), "\nExecStartPre=/bin/rm -f /etc/cni/net.d/10-containerd-net.conflist\n"))
	kubelet, err := fs.ReadFile(rootfs, "rootfs/etc/kubernetes/kubelet.yaml")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(kubelet), "\nclusterDomain: cluster.local\n"))
}
