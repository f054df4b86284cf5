package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// Resources returns liken's own resources, the manifests applied to a
// cluster (*.yaml, in file-name order): the namespace, the CRDs, the RBAC
// of cluster-operator and of the machines, the machines' admission policy
// and cluster-operator's Deployment. A leader's control-plane init creates
// those that do not exist.
func Resources() ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(FS, "*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, name := range names {
		b, err := FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		objs, err := DecodeAll(name, b)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// DecodeAll decodes the YAML (or JSON) documents of b, named name in
// errors, skipping empty ones; each must have an apiVersion, a kind and a
// name.
func DecodeAll(name string, b []byte) ([]*unstructured.Unstructured, error) {
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(doc), len(doc)).Decode(&obj.Object); err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", name, i, err)
		}
		if obj.Object == nil {
			continue // only comments
		}
		if obj.GetAPIVersion() == "" || obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("%s, document %d: an object needs an apiVersion, a kind and a metadata.name", name, i)
		}
		out = append(out, obj)
	}
}
