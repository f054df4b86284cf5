package rollout

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clienttesting "k8s.io/client-go/testing"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/clitest"
	"liken.sh/liken/generated/clientset/versioned/fake"
)

func TestHoldAndUnhold(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset(clitest.Cluster("lab", "1"))
	var out bytes.Buffer

	assert.ErrorContains(t, Hold(ctx, c, "alice", "lab", "  ", &out), "--reason is required")
	assert.ErrorContains(t, Unhold(ctx, c, "lab", &out), "the rollout of cluster lab is not held: there is nothing to lift")

	assert.NilError(t, Hold(ctx, c, "alice", "lab", "change freeze", &out))
	cl, err := c.LikenV1alpha1().Clusters().Get(ctx, "lab", metav1.GetOptions{})
	assert.NilError(t, err)
	assert.Check(t, is.Equal(cl.Annotations[v1alpha1.AnnotationHold], "change freeze"))
	var manager string
	for _, a := range c.Actions() {
		if p, ok := a.(clienttesting.PatchActionImpl); ok {
			manager = p.GetPatchOptions().FieldManager
		}
	}
	assert.Check(t, is.Equal(manager, "liken rollout hold by alice"), "the managed fields say who held it")
	assert.Check(t, is.Contains(out.String(), "Held the rollout of cluster lab: no new turn is granted until you run `liken rollout unhold lab`."))

	out.Reset()
	assert.NilError(t, Unhold(ctx, c, "lab", &out))
	cl, err = c.LikenV1alpha1().Clusters().Get(ctx, "lab", metav1.GetOptions{})
	assert.NilError(t, err)
	_, still := cl.Annotations[v1alpha1.AnnotationHold]
	assert.Check(t, !still)
	assert.Check(t, is.Contains(out.String(), `Lifted the hold on cluster lab (it was "change freeze")`))
}

func TestHoldManagerFitsTheAPIServersLimit(t *testing.T) {
	assert.Check(t, is.Equal(holdManager(""), "liken rollout hold"))
	assert.Check(t, is.Len(holdManager(strings.Repeat("x", 200)), 128))
}
