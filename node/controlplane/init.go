package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/manifests"
)

// TokenFile is the join token's file in the identity (IdentityDir):
// K10<SHA-256 of server-ca.crt>::<id>.<secret>, whose bootstrap token
// <id>.<secret> machines join with.
const TokenFile = "token"

// BootstrapToken returns the bootstrap token (<id>.<secret>) of a join
// token file: what follows its "::", six and sixteen characters of a-z and
// 0-9. Its errors never quote the token.
func BootstrapToken(tokenFile []byte) (id, secret string, err error) {
	_, token, found := strings.Cut(strings.TrimSpace(string(tokenFile)), "::")
	id, secret, dot := strings.Cut(token, ".")
	if !found || !dot || len(id) != 6 || len(secret) != 16 || !tokenChars(id) || !tokenChars(secret) {
		return "", "", errors.New("the join token is not K10<CA hash>::<id>.<secret> with a bootstrap token of 6 and 16 characters of a-z, 0-9")
	}
	return id, secret, nil
}

func tokenChars(s string) bool {
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// BootstrapGroup is the group Kubernetes gives every bootstrap token.
const BootstrapGroup = "system:bootstrappers"

// NodesGroup is the group of every kubelet's client certificate.
const NodesGroup = "system:nodes"

// Binding is a ClusterRoleBinding the control plane needs: Name binds
// Subject to ClusterRole.
type Binding struct {
	// Name is the ClusterRoleBinding's name.
	Name string
	// ClusterRole is the role granted.
	ClusterRole string
	// Subject is who is granted it.
	Subject rbacv1.Subject
}

// JoinBindings let a holder of a join token ask for a kubelet client
// certificate, as kubeadm sets up TLS bootstrap. The token gives no other
// right: cluster-operator approves the request only for the machine the
// token is bound to (controllers/nodeclients), and the controller manager
// signs what it approved.
var JoinBindings = []Binding{
	{Name: "liken:join:create-csr", ClusterRole: "system:node-bootstrapper", Subject: group(BootstrapGroup)},
}

// LeaderBindings are what a leader's control plane needs besides
// JoinBindings: the API server, as KubeletClientUser, reaches kubelets for
// logs, exec and port forwarding.
var LeaderBindings = []Binding{
	{Name: "liken:apiserver:kubelet-api-admin", ClusterRole: "system:kubelet-api-admin", Subject: rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: KubeletClientUser}},
}

// RetiredBindings are bindings an earlier liken made, which Init deletes:
// they let the controller manager approve any node client request of a
// join token, and any renewal, for any machine name.
var RetiredBindings = []string{"liken:join:approve-node-client", "liken:nodes:approve-renewal"}

// DeleteBindings deletes each named ClusterRoleBinding that exists.
func DeleteBindings(ctx context.Context, cs kubernetes.Interface, names []string) error {
	for _, name := range names {
		err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("deleting the retired ClusterRoleBinding %s: %w", name, err)
		default:
			klog.FromContext(ctx).Info("Deleted a retired ClusterRoleBinding: cluster-operator approves machines' certificates now", "name", name)
		}
	}
	return nil
}

func group(name string) rbacv1.Subject {
	return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}
}

// EnsureBindings creates each binding that does not exist. One that exists
// counts as done, whatever it holds: a role reference cannot change, and
// an administrator may have added subjects.
func EnsureBindings(ctx context.Context, cs kubernetes.Interface, bindings []Binding) error {
	log := klog.FromContext(ctx)
	api := cs.RbacV1().ClusterRoleBindings()
	for _, b := range bindings {
		_, err := api.Get(ctx, b.Name, metav1.GetOptions{})
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading the ClusterRoleBinding %s: %w", b.Name, err)
		}
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.ClusterRole},
			Subjects:   []rbacv1.Subject{b.Subject},
		}
		_, err = api.Create(ctx, crb, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			return fmt.Errorf("binding %s %s to %s: %w", b.Subject.Kind, b.Subject.Name, b.ClusterRole, err)
		default:
			log.Info("Created a ClusterRoleBinding", "name", b.Name, "clusterRole", b.ClusterRole, "subject", b.Subject.Kind+":"+b.Subject.Name)
		}
	}
	return nil
}

// MemberPromoter lists the members and promotes a learner through one
// member's client URL; EtcdClient is one.
type MemberPromoter interface {
	MemberList(ctx context.Context, clientURL string) ([]Member, error)
	MemberPromote(ctx context.Context, clientURL string, id uint64) ([]Member, error)
}

// DefaultInitTimeout is how long Init tries when InitOptions.Timeout is
// zero: a learner catching up with a large datastore on a slow machine
// takes minutes.
const DefaultInitTimeout = 10 * time.Minute

// LocalEtcd is this leader's etcd member as the machine itself reaches it.
var LocalEtcd = fmt.Sprintf("https://127.0.0.1:%d", EtcdClientPort)

// InitOptions are what Init needs.
type InitOptions struct {
	// Kube is the local API server (LocalAPIServer), as InitUser.
	Kube kubernetes.Interface
	// SharedTokenFile, when set, is the cluster identity's join token file,
	// for a fleet that opted in to one join token for every machine
	// (Config.SharedJoinToken): Init makes it a token of the fleet
	// (FleetToken). Empty, no shared token is made.
	SharedTokenFile string
	// JoinTokens are the machines' own join tokens (JoinTokensFile): Init
	// creates the Secret of each one it never created and that has not
	// expired (EnsureJoinTokens).
	JoinTokens []MachineToken
	// Name is this machine's name, its etcd member's.
	Name string
	// ClientURLs are etcd client URLs to ask, in this order: LocalEtcd,
	// then the other leaders'. etcd refuses a learner every call but its
	// status, so a learner's own URL never serves its promotion.
	ClientURLs []string
	// Etcd lists the members and promotes this machine's.
	Etcd MemberPromoter
	// Data, when set, records the datastore of this machine's member once
	// it votes, if none is recorded (a first leader's new datastore, whose
	// ID exists only once etcd runs): etcd-start then never joins another.
	Data MemberData
	// Addons are the cluster's add-ons (manifests.DNSObjects): each one
	// that does not exist is created; one that exists is left as it is.
	Addons []runtime.Object
	// Documents is the leader's DocumentsFile, the layer's Cluster and
	// Machines: with it, liken's own resources (manifests.Resources) and
	// those documents are created through Dynamic, each once
	// (EnsureResources). A leader installed before liken wrote the file
	// has none: then nothing is created (its fleet's were applied by hand).
	Documents string
	// Dynamic is the local API server as InitUser, for Documents.
	Dynamic dynamic.Interface
	// Timeout bounds Init (DefaultInitTimeout when zero).
	Timeout time.Duration
	// Interval is how long Init waits before it tries again (RetryInterval
	// when zero).
	Interval time.Duration
	// Clock paces the tries and measures Timeout (the real clock when nil).
	Clock clock.Clock
}

// Init readies a leader's control plane, and is idempotent: it promotes
// this machine's etcd member if it is a learner, then creates the join
// tokens' Secrets it never created (EnsureJoinTokens), JoinBindings and
// LeaderBindings, deletes RetiredBindings, creates the Addons that do not
// exist, labels this leader's Node (MarkLeaderNode), and last creates the
// Resources that do not exist (liken's manifests and the layer's
// documents). The promotion comes first: the API server reaches only
// its own member, and a learner serves it nothing, so the API is not ready
// before. Each step is tried again every Interval until it succeeds (etcd
// refuses a promotion while the learner lags; the API answers once its
// member votes) or Timeout passes.
func Init(ctx context.Context, o InitOptions) error {
	switch {
	case o.Kube == nil || o.Etcd == nil:
		return errors.New("control plane init: the API client and the etcd client are required")
	case o.Name == "" || len(o.ClientURLs) == 0:
		return errors.New("control plane init: the machine's name and the etcd client URLs are required")
	}
	tokens := o.JoinTokens
	if o.SharedTokenFile != "" {
		b, err := os.ReadFile(o.SharedTokenFile)
		if err != nil {
			return fmt.Errorf("reading the cluster identity's join token: %w", err)
		}
		id, secret, err := BootstrapToken(b)
		if err != nil {
			return fmt.Errorf("%s: %w", o.SharedTokenFile, err)
		}
		tokens = append([]MachineToken{FleetToken(id + "." + secret)}, tokens...)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Interval <= 0 {
		o.Interval = RetryInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultInitTimeout
	}
	r := retrier{clock: o.Clock, interval: o.Interval, deadline: o.Clock.Now().Add(o.Timeout), timeout: o.Timeout}
	if err := r.do(ctx, "promoting this machine's etcd member", func() error { return promote(ctx, o) }); err != nil {
		return err
	}
	if err := r.do(ctx, "recording which datastore this machine's etcd member belongs to", func() error { return recordDatastore(ctx, o) }); err != nil {
		return err
	}
	if err := r.do(ctx, "creating the join tokens and the control plane's bindings", func() error {
		if err := EnsureJoinTokens(ctx, o.Kube, tokens, o.Clock.Now()); err != nil {
			return err
		}
		if err := EnsureBindings(ctx, o.Kube, JoinBindings); err != nil {
			return err
		}
		if err := EnsureBindings(ctx, o.Kube, LeaderBindings); err != nil {
			return err
		}
		return DeleteBindings(ctx, o.Kube, RetiredBindings)
	}); err != nil {
		return err
	}
	if err := r.do(ctx, "creating the cluster's add-ons", func() error { return EnsureObjects(ctx, o.Kube, o.Addons) }); err != nil {
		return err
	}
	if err := r.do(ctx, "marking this leader's Node", func() error { return MarkLeaderNode(ctx, o.Kube, o.Name) }); err != nil {
		return err
	}
	if o.Documents == "" {
		return nil
	}
	return r.do(ctx, "creating liken's resources and the layer's Cluster and Machines", func() error {
		docs, err := ReadDocuments(o.Documents)
		if err != nil {
			return permanent(err)
		}
		if len(docs) == 0 {
			return nil
		}
		if o.Dynamic == nil {
			return permanent(errors.New("creating liken's resources needs the dynamic client"))
		}
		objs, err := manifests.Resources()
		if err != nil {
			return permanent(err)
		}
		return EnsureResources(ctx, o.Kube, o.Dynamic, append(objs, docs...))
	})
}

// MarkLeaderNode gives the leader's Node likenv1.LeaderNodeLabel, which
// its kubelet cannot set itself (NodeRestriction): cluster-operator runs
// only on Nodes that have it. The Node appears once the leader's kubelet
// registers it; until then this fails, and Init tries again.
func MarkLeaderNode(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("this leader's Node %s is not registered yet (its kubelet registers it)", name)
	case err != nil:
		return fmt.Errorf("reading this leader's Node %s: %w", name, err)
	}
	if _, ok := n.Labels[likenv1.LeaderNodeLabel]; ok {
		return nil
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, likenv1.LeaderNodeLabel)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: InitFieldManager}); err != nil {
		return fmt.Errorf("labelling this leader's Node %s %s: %w", name, likenv1.LeaderNodeLabel, err)
	}
	klog.FromContext(ctx).Info("Marked this leader's Node: cluster-operator may run on it", "node", name, "label", likenv1.LeaderNodeLabel)
	return nil
}

// InitFieldManager is the field manager of what control-plane init creates.
const InitFieldManager = "liken-control-plane-init"

// EnsureObjects creates each object that does not exist, in order, and
// leaves one that exists as it is: what a person changed in an add-on
// (its Corefile, its replicas) stays. It knows the kinds of liken's
// add-ons; any other is an error.
func EnsureObjects(ctx context.Context, cs kubernetes.Interface, objs []runtime.Object) error {
	log := klog.FromContext(ctx)
	for _, obj := range objs {
		m, err := meta.Accessor(obj)
		if err != nil {
			return permanent(err)
		}
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if kind == "" {
			kind = strings.TrimPrefix(fmt.Sprintf("%T", obj), "*v1.")
		}
		opts := metav1.CreateOptions{FieldManager: InitFieldManager}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *corev1.ConfigMap:
			_, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
		case *corev1.Service:
			// Read first: the API server allocates a Service's address
			// before it checks the name, so creating one that exists
			// fails with "provided IP is already allocated", not as
			// existing.
			got, gerr := cs.CoreV1().Services(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			switch {
			case gerr == nil:
				if o.Spec.ClusterIP != "" && got.Spec.ClusterIP != o.Spec.ClusterIP {
					log.Info("The Service exists at another address than the Cluster's; it is left as it is: delete it for a leader's next boot to create it at the new one",
						"service", klog.KObj(o), "address", got.Spec.ClusterIP, "cluster", o.Spec.ClusterIP)
				}
				continue
			case !apierrors.IsNotFound(gerr):
				return fmt.Errorf("reading %s %s: %w", kind, klog.KObj(m), gerr)
			}
			_, err = cs.CoreV1().Services(o.Namespace).Create(ctx, o, opts)
		case *appsv1.Deployment:
			_, err = cs.AppsV1().Deployments(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		default:
			return permanent(fmt.Errorf("an add-on of kind %s (%s) is not one liken creates", kind, m.GetName()))
		}
		switch {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			return fmt.Errorf("creating %s %s: %w", kind, klog.KObj(m), err)
		default:
			log.Info("Created an add-on's object", "kind", kind, "object", klog.KObj(m))
		}
	}
	return nil
}

// promote makes this machine's member a voter if it is a learner, through
// the first client URL that answers the member list (a voter: a learner
// answers no list).
func promote(ctx context.Context, o InitOptions) error {
	log := klog.FromContext(ctx).WithValues("member", o.Name)
	members, from, err := listMembers(ctx, o.Etcd, o.ClientURLs)
	if err != nil {
		return fmt.Errorf("no etcd member answers the member list: %w", err)
	}
	self := named(members, o.Name)
	if self == nil {
		return fmt.Errorf("etcd at %s lists no member %s: etcd on this machine has not started, or its member was removed (then etcd-start joins it again)", from, o.Name)
	}
	if !self.IsLearner {
		log.V(1).Info("This machine's etcd member votes", "id", fmt.Sprintf("%x", self.ID))
		return nil
	}
	if _, err := o.Etcd.MemberPromote(ctx, from, self.ID); err != nil {
		return fmt.Errorf("etcd does not promote learner %s (%x) yet, as it does not while the learner lags: %w", o.Name, self.ID, err)
	}
	log.Info("Promoted this machine's etcd member from learner to voter", "id", fmt.Sprintf("%x", self.ID), "through", from)
	return nil
}

// recordDatastore records the datastore this machine's own member answers
// for, if Data has none recorded. A recorded one that differs is left as
// it is and reported: etcd-start keeps the member to it.
func recordDatastore(ctx context.Context, o InitOptions) error {
	lister, ok := o.Etcd.(interface {
		ClusterMembers(ctx context.Context, clientURL string) (uint64, []Member, error)
	})
	if o.Data == nil || !ok {
		return nil
	}
	recorded, err := o.Data.Datastore()
	if err != nil {
		return permanent(err)
	}
	cluster, _, err := lister.ClusterMembers(ctx, o.ClientURLs[0])
	switch {
	case err != nil:
		return fmt.Errorf("asking this machine's etcd member for its datastore: %w", err)
	case cluster == 0 || cluster == recorded:
		return nil
	case recorded != 0:
		klog.FromContext(ctx).Error(nil, "This machine's etcd member answers for another datastore than the one recorded; etcd-start keeps it to the recorded one", "recorded", fmt.Sprintf("%x", recorded), "answered", fmt.Sprintf("%x", cluster))
		return nil
	}
	if err := o.Data.Remember(cluster); err != nil {
		return permanent(err)
	}
	klog.FromContext(ctx).Info("Recorded the datastore this machine's etcd member belongs to", "datastore", fmt.Sprintf("%x", cluster))
	return nil
}

// permanentError is an error trying again does not mend.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

func permanent(err error) error { return permanentError{err} }

// retrier tries a step every interval until it succeeds, fails for good,
// ctx ends or the deadline passes.
type retrier struct {
	clock    clock.Clock
	interval time.Duration
	deadline time.Time
	timeout  time.Duration
}

func (r retrier) do(ctx context.Context, what string, try func() error) error {
	log := klog.FromContext(ctx)
	last := ""
	for {
		err := try()
		var p permanentError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &p):
			return fmt.Errorf("%s: %w", what, err)
		case !r.clock.Now().Before(r.deadline):
			return fmt.Errorf("%s: gave up after %s: %w", what, r.timeout, err)
		}
		if err.Error() != last {
			log.Info("Trying again", "step", what, "reason", err.Error(), "retryAfter", r.interval)
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
		case <-r.clock.After(r.interval):
		}
	}
}
