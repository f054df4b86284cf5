// Package operator runs cluster-operator: leader election on the Lease
// liken-system/cluster-operator, and the turn, liveness, release and
// machine-certificate controllers under the leader's context.
package operator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/controllers/internal/leadership"
	"liken.sh/liken/controllers/internal/metrics"
	"liken.sh/liken/controllers/liveness"
	"liken.sh/liken/controllers/nodeclients"
	"liken.sh/liken/controllers/promgate"
	"liken.sh/liken/controllers/releases"
	"liken.sh/liken/controllers/turns"
	likenclient "liken.sh/liken/generated/clientset/versioned"
	likenscheme "liken.sh/liken/generated/clientset/versioned/scheme"
	likeninformers "liken.sh/liken/generated/informers/externalversions"
)

// Leader election timing (fixed by the design).
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// ExitLostLease is the exit code of a copy that lost the lease.
const ExitLostLease = 3

// Options configure one copy of cluster-operator.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// Identity names this copy in the Lease.
	Identity string
	// StartupGrace: no turn is granted for this long after leading starts.
	StartupGrace time.Duration
	// MachineLostAfter: a machine whose Node Lease was not seen renewed for
	// this long is Lost.
	MachineLostAfter time.Duration
	// MetricsAddr serves /metrics, /healthz and /readyz; "0" disables.
	MetricsAddr string
	// Version is reported in logs and the user agent.
	Version string
}

// Run campaigns for the lease and, while leading, runs the controllers.
// It returns nil when ctx ends. A copy that loses the lease calls exit
// with ExitLostLease: whatever it saw before may be stale.
func Run(ctx context.Context, o Options, exit func(code int)) error {
	logger := klog.FromContext(ctx)
	if o.Identity == "" {
		return errors.New("--identity is empty and the host name is unknown: set --identity")
	}
	if o.StartupGrace < 0 || o.MachineLostAfter <= 0 {
		return fmt.Errorf("--startup-grace (%s) must be 0 or more and --machine-lost-after (%s) more than 0", o.StartupGrace, o.MachineLostAfter)
	}
	if o.StartupGrace < o.MachineLostAfter {
		logger.Info("Warning: --startup-grace is shorter than --machine-lost-after: a machine that went down before this copy started leading may not read Lost before the first grants",
			"startupGrace", o.StartupGrace, "machineLostAfter", o.MachineLostAfter)
	}
	cfg := rest.CopyConfig(o.Config)
	cfg.UserAgent = "cluster-operator/" + o.Version
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	liken, err := likenclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the liken client: %w", err)
	}

	m := metrics.New()
	var ready atomic.Bool
	var leading atomic.Bool
	watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	if o.MetricsAddr != "0" && o.MetricsAddr != "" {
		srv, err := serve(ctx, o.MetricsAddr, m, kube.AuthenticationV1(), kube.AuthorizationV1(), watchdog, func() bool { return !leading.Load() || ready.Load() })
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := likenscheme.AddToScheme(scheme); err != nil {
		return err
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("starting the event recorder: %w", err)
	}
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme, "cluster-operator")

	clk := clock.RealClock{}
	var lostLease atomic.Bool
	lost := exitOnLoss(ctx, func() { m.Leading.Set(0) }, &lostLease, exit)
	lock := &leadership.RenewalTracker{
		Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: likenv1.SystemNamespace, Name: likenv1.OperatorLeaseName},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
		},
		Clock: clk,
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: LeaseDuration,
		RenewDeadline: RenewDeadline,
		RetryPeriod:   RetryPeriod,
		// Released below on shutdown only: client-go's release on cancel
		// also runs when the lease was lost, and decides from the holder it
		// last observed, so a copy paused past its lease could clear the
		// Lease of the copy that took over.
		ReleaseOnCancel: false,
		Name:            likenv1.OperatorLeaseName,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				leading.Store(true)
				m.Leading.Set(1)
				term := leadership.Term{
					Identity: o.Identity,
					Since:    clk.Now(),
					Token:    lock.Token(),
					Fence: &leadership.LeaseFence{
						Leases: kube.CoordinationV1(), Namespace: likenv1.SystemNamespace, Name: likenv1.OperatorLeaseName,
						Identity: o.Identity, LeaseDuration: LeaseDuration, Clock: clk, Renewals: lock,
						OnLost: func(what string) {
							lost("the fence found the lease held by another copy before " + what)
						},
					},
				}
				logger.Info("Started leading; granting resumes after the startup grace",
					"identity", o.Identity, "grantFrom", term.Since.Add(o.StartupGrace).UTC().Format(time.RFC3339))
				if err := runControllers(lctx, o, term, kube, liken, recorder, m, clk, &ready); err != nil {
					logger.Error(err, "Controllers stopped")
					lost(err.Error())
				}
			},
			OnStoppedLeading: func() {
				lost("the lease could not be renewed")
			},
			OnNewLeader: func(id string) {
				if id != o.Identity {
					logger.Info("Another copy leads", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("configuring leader election: %w", err)
	}
	logger.Info("Campaigning for the lease", "lease", likenv1.SystemNamespace+"/"+likenv1.OperatorLeaseName, "identity", o.Identity,
		"version", o.Version, "startupGrace", o.StartupGrace, "machineLostAfter", o.MachineLostAfter)
	elector.Run(ctx)
	if ctx.Err() != nil && leading.Load() && !lostLease.Load() {
		// Shutting down while leading: give the Lease up so that another
		// copy takes over at once. Release writes only a Lease that still
		// names this copy.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RenewDeadline)
		defer cancel()
		if released, err := leadership.Release(rctx, kube.CoordinationV1(), likenv1.SystemNamespace, likenv1.OperatorLeaseName, o.Identity, clk.Now()); err != nil {
			logger.Error(err, "Could not release the lease on shutdown; another copy takes over once it expires", "identity", o.Identity)
		} else if released {
			logger.Info("Released the lease on shutdown", "identity", o.Identity)
		}
	}
	return nil
}

// exitOnLoss returns what this copy does, once, when anything finds the
// lease lost: stop leading and, unless ctx ended (a shutdown), record the
// loss in lostLease and exit with ExitLostLease: what it saw may be stale.
func exitOnLoss(ctx context.Context, stopLeading func(), lostLease *atomic.Bool, exit func(code int)) func(why string) {
	var once sync.Once
	return func(why string) {
		once.Do(func() {
			stopLeading()
			if ctx.Err() != nil {
				return
			}
			lostLease.Store(true)
			klog.FromContext(ctx).Info("This copy lost the lease; exiting so that nothing acts on what it saw while it led", "why", why)
			klog.Flush()
			exit(ExitLostLease)
		})
	}
}

// runControllers starts the informers and every controller, and returns
// when ctx ends.
func runControllers(ctx context.Context, o Options, term leadership.Term, kube kubernetes.Interface, liken likenclient.Interface,
	recorder events.EventRecorder, m *metrics.Metrics, clk clock.WithTicker, ready *atomic.Bool) error {
	lf := likeninformers.NewSharedInformerFactory(liken, 5*time.Minute)
	kf := kubeinformers.NewSharedInformerFactory(kube, 0)
	leaseFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace(liveness.LeaseNamespace))
	// Its own Deployment only, which a settling leader's copies are counted
	// against.
	selfFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithNamespace(likenv1.SystemNamespace),
		kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", likenv1.OperatorDeploymentName).String()
		}))
	clusters := lf.Liken().V1alpha1().Clusters()
	machines := lf.Liken().V1alpha1().Machines()

	var turnCtrl *turns.Controller
	liveCtrl, err := liveness.New(liveness.Config{
		Machines: machines, Clusters: clusters, Leases: leaseFactory.Coordination().V1().Leases(),
		LeaseReader: kube.CoordinationV1(), Writer: liken.LikenV1alpha1().Machines(),
		Recovered: func(machine string) { turnCtrl.MachineChanged(machine) },
		Recorder:  recorder, Metrics: m, Clock: clk, Term: term, LostAfter: o.MachineLostAfter,
	})
	if err != nil {
		return err
	}
	prober := promgate.New(clusters.Lister(), &http.Client{}, clk, func(cluster string) { turnCtrl.ClusterChanged(cluster) })
	turnCtrl, err = turns.New(turns.Config{
		Clusters: clusters, Machines: machines, Nodes: kf.Core().V1().Nodes(),
		Pods: kf.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, _ time.Duration) cache.SharedIndexInformer {
			return turns.NewPodInformer(c)
		}),
		Budgets: kf.Policy().V1().PodDisruptionBudgets(),
		Copies:  selfFactory.Apps().V1().Deployments(),
		Writer:  liken.LikenV1alpha1().Clusters(), Recorder: recorder, Metrics: m, Clock: clk,
		Term: term, StartupGrace: o.StartupGrace, Liveness: liveCtrl, Prometheus: prober,
	})
	if err != nil {
		return err
	}
	csrFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kube, 0, kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = nodeclients.SignerFieldSelector
	}))
	approver, err := nodeclients.New(nodeclients.Config{
		Requests: csrFactory.Certificates().V1().CertificateSigningRequests(), Machines: machines,
		MachineReader: liken.LikenV1alpha1().Machines(), Writer: kube.CertificatesV1().CertificateSigningRequests(),
		Recorder: recorder, Clock: clk,
	})
	if err != nil {
		return err
	}
	relCtrl, err := releases.New(releases.Config{
		Clusters: clusters, Client: liken.LikenV1alpha1().Clusters(), HTTP: &http.Client{},
		Recorder: recorder, Metrics: m, Clock: clk,
	})
	if err != nil {
		return err
	}
	lf.Start(ctx.Done())
	kf.Start(ctx.Done())
	leaseFactory.Start(ctx.Done())
	selfFactory.Start(ctx.Done())
	csrFactory.Start(ctx.Done())
	defer lf.Shutdown()
	defer csrFactory.Shutdown()
	defer kf.Shutdown()
	defer leaseFactory.Shutdown()
	defer selfFactory.Shutdown()

	runs := []struct {
		name    string
		run     func(context.Context, int) error
		workers int
	}{
		{"turns", turnCtrl.Run, 1},
		{"liveness", liveCtrl.Run, 2},
		{"releases", relCtrl.Run, 2},
		{"nodeclients", approver.Run, 1},
		{"promgate", func(ctx context.Context, _ int) error { prober.Run(ctx); return nil }, 1},
	}
	errs := make(chan error, len(runs))
	for _, r := range runs {
		go func() {
			if err := r.run(ctx, r.workers); err != nil {
				errs <- fmt.Errorf("%s controller: %w", r.name, err)
				return
			}
			errs <- nil
		}()
	}
	// Ready once every informer synced.
	go func() {
		lf.WaitForCacheSync(ctx.Done())
		kf.WaitForCacheSync(ctx.Done())
		leaseFactory.WaitForCacheSync(ctx.Done())
		csrFactory.WaitForCacheSync(ctx.Done())
		if ctx.Err() == nil {
			ready.Store(true)
			klog.FromContext(ctx).Info("Informer caches synced; controllers running")
		}
	}()
	var first error
	for range runs {
		if err := <-errs; err != nil && first == nil && ctx.Err() == nil {
			first = err
		}
	}
	return first
}

// serve answers /metrics (to identities the API server authorizes) and
// /healthz and /readyz (to anyone: the kubelet probes them, and they tell
// nothing about the fleet) on addr.
func serve(ctx context.Context, addr string, m *metrics.Metrics, authn authenticationv1client.TokenReviewsGetter, authz authorizationv1client.SubjectAccessReviewsGetter,
	watchdog *leaderelection.HealthzAdaptor, isReady func() bool) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Guard(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}), authn, authz, clock.RealClock{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := watchdog.Check(r); err != nil {
			http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !isReady() {
			http.Error(w, "leading, informer caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-bind-address %s: %w", addr, err)
	}
	klog.FromContext(ctx).Info("Serving /metrics, /healthz and /readyz", "address", ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped")
		}
	}()
	return srv, nil
}

// Hostname is the default identity.
func Hostname() string {
	h, _ := os.Hostname()
	return h
}
