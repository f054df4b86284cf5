package manifests

import (
	"bytes"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// OperatorFile is the manifest of cluster-operator's Deployment.
const OperatorFile = "30-operator.yaml"

// OperatorDeployment returns cluster-operator's Deployment as OperatorFile
// declares it. Its container's image is the one liken's OS image
// preloads (make image reads it from here), so the Deployment needs no
// registry.
func OperatorDeployment() (*appsv1.Deployment, error) {
	b, err := FS.ReadFile(OperatorFile)
	if err != nil {
		return nil, err
	}
	d := &appsv1.Deployment{}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(d); err != nil {
		return nil, fmt.Errorf("%s: %w", OperatorFile, err)
	}
	if d.Kind != "Deployment" || len(d.Spec.Template.Spec.Containers) != 1 {
		return nil, fmt.Errorf("%s: the first document is not cluster-operator's Deployment with one container", OperatorFile)
	}
	return d, nil
}
