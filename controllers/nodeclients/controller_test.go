package nodeclients

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"liken.sh/liken/controllers/internal/testutil"
	likenfake "liken.sh/liken/generated/clientset/versioned/fake"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

// TestControllerWritesTheVerdict runs the controller on fake clients: it
// approves a machine's own request, denies another machine's name with a
// Warning event on the Machine asked for, and keeps a request for a name no
// Machine has pending until the Machine is created.
func TestControllerWritesTheVerdict(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w1User, w1Groups := token("worker-1")
	w9User, w9Groups := token("worker-9")
	kube := kubefake.NewClientset(
		named(csr(kubeletRequest(t, "worker-1"), w1User, w1Groups...), "own"),
		named(csr(kubeletRequest(t, "leader-2"), w1User, w1Groups...), "other"),
		named(csr(kubeletRequest(t, "worker-9"), w9User, w9Groups...), "missing"),
	)
	liken := likenfake.NewSimpleClientset(testutil.Machine("worker-1"), testutil.Machine("leader-2"))
	rec := events.NewFakeRecorder(10)
	kf := kubeinformers.NewSharedInformerFactory(kube, 0)
	lf := likeninformers.NewSharedInformerFactory(liken, 0)
	c, err := New(Config{
		Requests: kf.Certificates().V1().CertificateSigningRequests(), Machines: lf.Liken().V1alpha1().Machines(),
		MachineReader: liken.LikenV1alpha1().Machines(), Writer: kube.CertificatesV1().CertificateSigningRequests(),
		Recorder: rec, Clock: clocktesting.NewFakeClock(time.Now()),
	})
	assert.NilError(t, err)
	kf.Start(ctx.Done())
	lf.Start(ctx.Done())
	go func() { _ = c.Run(ctx, 1) }()

	verdict := func(name string) *certificatesv1.CertificateSigningRequestCondition {
		got, err := kube.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		assert.NilError(t, err)
		if len(got.Status.Conditions) == 0 {
			return nil
		}
		return &got.Status.Conditions[0]
	}
	for _, name := range []string{"own", "other"} {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if verdict(name) == nil {
				return poll.Continue("request %s is not decided yet", name)
			}
			return poll.Success()
		}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	}
	assert.Check(t, is.Equal(verdict("own").Type, certificatesv1.CertificateApproved))
	assert.Check(t, is.Equal(verdict("own").Reason, ReasonOwnJoinToken))
	assert.Check(t, is.Equal(verdict("other").Type, certificatesv1.CertificateDenied))
	assert.Check(t, is.Equal(verdict("other").Reason, ReasonAnotherMachine))
	assert.Check(t, verdict("missing") == nil, "a request for a Machine not created yet was decided")
	_, err = liken.LikenV1alpha1().Machines().Create(ctx, testutil.Machine("worker-9"), metav1.CreateOptions{})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if verdict("missing") == nil {
			return poll.Continue("the request for worker-9 waits")
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(10*time.Millisecond))
	assert.Check(t, is.Equal(verdict("missing").Type, certificatesv1.CertificateApproved))
	assert.Check(t, is.Equal(verdict("missing").Reason, ReasonOwnJoinToken))
	select {
	case ev := <-rec.Events:
		assert.Check(t, is.Contains(ev, corev1.EventTypeWarning+" "+EventCertificateRefused))
		assert.Check(t, is.Contains(ev, "Certificate signing request other from system:bootstrap:abcdef asked for this machine's certificate"))
	default:
		t.Error("no event was recorded about the request for leader-2's name")
	}
	assert.Check(t, is.Len(rec.Events, 0), "one event only: the request for a missing Machine's name concerns no Machine")
}

func named(c *certificatesv1.CertificateSigningRequest, name string) *certificatesv1.CertificateSigningRequest {
	c.Name = name
	return c
}
