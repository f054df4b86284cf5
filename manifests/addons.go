package manifests

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"net/netip"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// DNSFile is the cluster DNS add-on's manifest: CoreDNS's ServiceAccount,
// role and binding, Corefile, Deployment and the Service kube-dns.
const DNSFile = "addons/coredns.yaml"

// DNSServiceName is the cluster DNS's Service in kube-system, the name
// Kubernetes' own tools look for.
const DNSServiceName = "kube-dns"

//go:embed addons/*.yaml
var addons embed.FS

// DNSObjects returns the cluster DNS add-on's objects as DNSFile declares
// them, in the order to create them, with the Service's address set to
// clusterDNS (the Cluster's spec.network.clusterDNS or its default).
func DNSObjects(clusterDNS string) ([]runtime.Object, error) {
	ip, err := netip.ParseAddr(clusterDNS)
	if err != nil {
		return nil, fmt.Errorf("the cluster DNS address %q is not an IP address", clusterDNS)
	}
	objs, err := decodeAll(DNSFile)
	if err != nil {
		return nil, err
	}
	found := false
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok && s.Name == DNSServiceName {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip.String(), []string{ip.String()}
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no Service %s", DNSFile, DNSServiceName)
	}
	return objs, nil
}

// DNSDeployment returns CoreDNS's Deployment as DNSFile declares it. Its
// container's image is the one liken's OS image preloads (make image reads
// it from here).
func DNSDeployment() (*appsv1.Deployment, error) {
	objs, err := decodeAll(DNSFile)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok && len(d.Spec.Template.Spec.Containers) == 1 {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%s: no Deployment with one container", DNSFile)
}

// decodeAll decodes every document of an add-on file into typed objects.
func decodeAll(name string) ([]runtime.Object, error) {
	b, err := addons.ReadFile(name)
	if err != nil {
		return nil, err
	}
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		objs = append(objs, obj)
	}
}
