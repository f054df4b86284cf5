package manifests

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	corev1 "k8s.io/api/core/v1"
)

// TestOperatorRunsThePreloadedImage: cluster-operator's pods run the image
// liken's OS image preloads, as a user that is not root, and never try a
// registry (none is reachable from a liken machine).
func TestOperatorRunsThePreloadedImage(t *testing.T) {
	d, err := OperatorDeployment()
	assert.NilError(t, err)
	c := d.Spec.Template.Spec.Containers[0]
	assert.Assert(t, strings.HasPrefix(c.Image, "liken.sh/cluster-operator:"), c.Image)
	assert.Equal(t, c.ImagePullPolicy, corev1.PullNever)
	assert.Assert(t, c.SecurityContext != nil && c.SecurityContext.RunAsNonRoot != nil && *c.SecurityContext.RunAsNonRoot)
}
