package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"liken.sh/liken/e2e/internal/fleetsim"
)

// Echo is the baseline of the grant latency: the smallest controller that
// can be, on the same API server at the same moment. It watches the
// ConfigMap bench-ping and copies each new sequence number into
// bench-pong; a third watch sees the copy. Its latency, from the ping
// write returning to the pong arriving, is the path a grant takes (the
// machine's write, the operator's watch, the operator's write, the
// machine's watch) without the operator's decision and its lease check.
type Echo struct {
	ctx  context.Context
	kube kubernetes.Interface

	mu        sync.Mutex
	seq       int
	ping      *corev1.ConfigMap
	sent      map[string]time.Time
	latencies []time.Duration
	err       error
}

const echoNamespace = "default"

// StartEcho creates the two ConfigMaps and starts the copier and the
// observer; they stop with ctx.
func StartEcho(ctx context.Context, cfg *rest.Config) (*Echo, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	e := &Echo{ctx: ctx, kube: kube, sent: map[string]time.Time{}}
	cms := kube.CoreV1().ConfigMaps(echoNamespace)
	if e.ping, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bench-ping"}, Data: map[string]string{"seq": "0"}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	pong, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bench-pong"}, Data: map[string]string{"seq": "0"}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	watch := func(name string, fn func(*corev1.ConfigMap)) error {
		f := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace(echoNamespace),
			kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			}))
		inf := f.Core().V1().ConfigMaps().Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) {
			if cm, ok := n.(*corev1.ConfigMap); ok {
				fn(cm)
			}
		}}); err != nil {
			return err
		}
		f.Start(ctx.Done())
		if !fleetsim.WaitForSync(ctx, inf.HasSynced) {
			return fmt.Errorf("the watch of ConfigMap %s did not sync", name)
		}
		return nil
	}
	// The copier: one write per ping seen.
	if err := watch("bench-ping", func(cm *corev1.ConfigMap) {
		next := pong.DeepCopy()
		next.Data = map[string]string{"seq": cm.Data["seq"]}
		out, err := cms.Update(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			e.setErr(fmt.Errorf("echo: writing bench-pong: %w", err))
			return
		}
		pong = out
	}); err != nil {
		return nil, err
	}
	// The observer.
	if err := watch("bench-pong", func(cm *corev1.ConfigMap) {
		at := time.Now()
		e.mu.Lock()
		defer e.mu.Unlock()
		if sent, ok := e.sent[cm.Data["seq"]]; ok {
			e.latencies = append(e.latencies, at.Sub(sent))
			delete(e.sent, cm.Data["seq"])
		}
	}); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Echo) setErr(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil && e.ctx.Err() == nil {
		e.err = err
	}
}

// Ping writes the next sequence number into bench-ping.
func (e *Echo) Ping() error {
	e.mu.Lock()
	e.seq++
	seq := strconv.Itoa(e.seq)
	next := e.ping.DeepCopy()
	e.mu.Unlock()
	next.Data = map[string]string{"seq": seq}
	out, err := e.kube.CoreV1().ConfigMaps(echoNamespace).Update(e.ctx, next, metav1.UpdateOptions{})
	at := time.Now()
	if err != nil {
		return fmt.Errorf("echo: writing bench-ping: %w", err)
	}
	e.mu.Lock()
	e.ping = out
	e.sent[seq] = at
	e.mu.Unlock()
	return nil
}

// PingEvery pings every interval until ctx ends.
func (e *Echo) PingEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := e.Ping(); err != nil {
				e.setErr(err)
			}
		}
	}
}

// Latencies returns the round trips measured so far and forgets them,
// with the first error met.
func (e *Echo) Latencies() ([]time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.latencies
	e.latencies = nil
	return out, e.err
}
