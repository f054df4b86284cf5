package nodeclients

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	likeninformers "liken.sh/liken/generated/informers/externalversions/liken/v1alpha1"
	likenlisters "liken.sh/liken/generated/listers/liken/v1alpha1"
	"liken.sh/liken/internal/worker"
)

// SignerFieldSelector selects the requests this controller decides; give
// it to the request informer's list options.
const SignerFieldSelector = "spec.signerName=" + certificatesv1.KubeAPIServerClientKubeletSignerName

// EventCertificateRefused is the event reason, on the Machine whose name
// was asked for, when a request for its certificate is denied: someone
// other than the machine tried to act as it.
const EventCertificateRefused = "CertificateRefused"

// ApprovalWriter is the one write the controller makes: a request's
// Approved or Denied condition.
type ApprovalWriter interface {
	UpdateApproval(ctx context.Context, name string, csr *certificatesv1.CertificateSigningRequest, opts metav1.UpdateOptions) (*certificatesv1.CertificateSigningRequest, error)
}

// MachineReader reads one Machine from the API server.
type MachineReader interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*likenv1.Machine, error)
}

// Config is what the controller needs.
type Config struct {
	// Requests must list only kubelet client requests (SignerFieldSelector).
	Requests certificatesinformers.CertificateSigningRequestInformer
	Machines likeninformers.MachineInformer
	// MachineReader confirms with the API server that a Machine is missing
	// before a request for its name is denied.
	MachineReader MachineReader
	Writer        ApprovalWriter
	Recorder      events.EventRecorder
	Clock         clock.WithTicker
}

// Controller is the approver of kubelet client certificates.
type Controller struct {
	cfg      Config
	requests certificateslisters.CertificateSigningRequestLister
	machines likenlisters.MachineLister
	queue    *worker.Queue
	synced   []cache.DoneChecker
}

// New wires the controller to its informers. Call before they start.
func New(cfg Config) (*Controller, error) {
	c := &Controller{cfg: cfg, requests: cfg.Requests.Lister(), machines: cfg.Machines.Lister()}
	c.queue = worker.New("nodeclients", cfg.Clock, c.sync)
	enqueue := func(obj any) {
		if k, ok := worker.KeyOf(obj); ok {
			c.queue.Add(k)
		}
	}
	reqs, err := cfg.Requests.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
	})
	if err != nil {
		return nil, err
	}
	// A new Machine may be what a pending request waits for.
	machines, err := cfg.Machines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.requeuePending() },
	})
	if err != nil {
		return nil, err
	}
	c.synced = []cache.DoneChecker{reqs.HasSyncedChecker(), machines.HasSyncedChecker()}
	return c, nil
}

// requeuePending queues every request not decided yet.
func (c *Controller) requeuePending() {
	reqs, err := c.requests.List(labels.Everything())
	if err != nil {
		return
	}
	for _, r := range reqs {
		if !decided(r) {
			c.queue.Add(r.Name)
		}
	}
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return c.queue.Run(ctx, workers, c.synced...)
}

// Exists reports whether a Machine has this name, in the informer's cache.
func (c *Controller) Exists(name string) bool {
	_, err := c.machines.Get(name)
	return err == nil
}

// BoundTo names the Machine whose join token authenticates in group.
func (c *Controller) BoundTo(group string) string {
	ms, err := c.machines.List(labels.Everything())
	if err != nil {
		return ""
	}
	for _, m := range ms {
		if likenv1.JoinGroup(m.Name) == group {
			return m.Name
		}
	}
	return ""
}

func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	csr, err := c.requests.Get(key)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, ok := Decide(csr, c)
	if !ok {
		return 0, nil
	}
	if v.Wait {
		// The cache may not hold a Machine created a moment ago: ask the
		// API server. A Machine created later queues the request again.
		_, err := c.cfg.MachineReader.Get(ctx, v.Machine, metav1.GetOptions{})
		switch {
		case err == nil:
			return time.Second, nil
		case !apierrors.IsNotFound(err):
			return 0, fmt.Errorf("reading Machine %s: %w", v.Machine, err)
		}
		klog.FromContext(ctx).Info("A certificate request waits for its Machine", "request", csr.Name, "requester", csr.Spec.Username, "machine", v.Machine, "message", v.Message)
		return 0, nil
	}
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type:           certificatesv1.CertificateDenied,
		Status:         corev1.ConditionTrue,
		Reason:         v.Reason,
		Message:        v.Message,
		LastUpdateTime: metav1.NewTime(c.cfg.Clock.Now()),
	}
	if v.Approve {
		cond.Type = certificatesv1.CertificateApproved
	}
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	if _, err := c.cfg.Writer.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("writing the %s condition of certificate signing request %s: %w", cond.Type, csr.Name, err)
	}
	log := klog.FromContext(ctx).WithValues("request", csr.Name, "requester", csr.Spec.Username, "machine", v.Machine, "reason", v.Reason)
	if v.Approve {
		log.Info("Approved a machine's client certificate")
		return 0, nil
	}
	log.Info("Denied a client certificate request", "message", v.Message)
	if m, err := c.machines.Get(v.Machine); err == nil && v.Reason == ReasonAnotherMachine {
		c.cfg.Recorder.Eventf(m, nil, corev1.EventTypeWarning, EventCertificateRefused, "Deny",
			"Certificate signing request %s from %s asked for this machine's certificate and was denied (%s). If this machine is being installed again, give it its own layer; otherwise someone holds another machine's credentials", csr.Name, csr.Spec.Username, v.Message)
	}
	return 0, nil
}
