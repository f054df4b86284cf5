package userlab

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	likenv1 "liken.sh/liken/apis/liken/v1alpha1"
	clilab "liken.sh/liken/cli/lab"
	"liken.sh/liken/cli/lab/controlplane"
)

// NetworkAcrossMachines checks that a lab's fleet is an ordinary
// Kubernetes cluster: each Node has its own address and its own pod range
// of the Cluster's podCIDR; the kubernetes Service's endpoints are the
// leaders' API servers; a Deployment of two replicas, one on the first
// leader and one on the last machine, and a Service in front of it: a pod
// on each of the two reaches each replica by its pod address (on its own
// machine and across the segment), the Service by its ClusterIP and by
// its name through the cluster DNS, the NodePort on every machine's
// address, the kubernetes Service's name and a name outside the cluster
// (the lab's channel, through the machine's resolver); kubectl logs
// reaches both machines; and cluster-operator, in a pod, reaches the API
// through the kubernetes Service and reads the release channel over https
// by name with the Cluster's CA bundle.
func NetworkAcrossMachines(t *testing.T, l *Lab) {
	ctx := t.Context()

	nodes, err := l.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.NilError(t, err)
	podCIDR := netip.MustParsePrefix(likenv1.DefaultPodCIDR)
	addresses, ranges := map[string]string{}, map[string]bool{}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				addresses[n.Name] = a.Address
			}
		}
		r, err := netip.ParsePrefix(n.Spec.PodCIDR)
		assert.NilError(t, err, "Node %s's pod range", n.Name)
		assert.Assert(t, podCIDR.Contains(r.Addr()) && r.Bits() > podCIDR.Bits(), "Node %s's range %s is not of the Cluster's %s", n.Name, r, podCIDR)
		assert.Assert(t, !ranges[r.String()], "two Nodes have the range %s", r)
		ranges[r.String()] = true
	}
	assert.Equal(t, len(addresses), len(l.St.Machines), "each Node has an internal address: %v", addresses)
	seen := map[string]string{}
	var want []string
	for _, m := range l.St.Machines {
		a := addresses[m.Name]
		assert.Assert(t, seen[a] == "", "%s and %s share the address %s", seen[a], m.Name, a)
		seen[a] = m.Name
		if m.Role == string(likenv1.RoleLeader) {
			want = append(want, a+":6443")
		}
	}
	slices.Sort(want)
	// The replicas' two machines: the first leader and the last machine.
	first, last := l.St.Machines[0].Name, l.St.Machines[len(l.St.Machines)-1].Name

	// The kubernetes Service's endpoints are the leaders' API servers at
	// their Nodes' addresses: kube-proxy routes the Service as any other.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		eps, err := l.Kube.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
		if err != nil {
			return poll.Continue("the kubernetes Service's EndpointSlices: %v", err)
		}
		var got []string
		for _, s := range eps.Items {
			for _, e := range s.Endpoints {
				for _, p := range s.Ports {
					got = append(got, fmt.Sprintf("%s:%d", strings.Join(e.Addresses, ","), ptr.Deref(p.Port, 0)))
				}
			}
		}
		if slices.Sort(got); !slices.Equal(got, want) {
			return poll.Continue("the kubernetes Service's endpoints are %v, not the leaders' API servers %v", got, want)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(time.Second))

	// Two replicas, one on each machine, and their Services.
	labels := map[string]string{"app": "net"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "net", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Affinity: &corev1.Affinity{
						NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
							NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
								Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{first, last},
							}}}},
						}},
						PodAntiAffinity: &corev1.PodAntiAffinity{
							RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
								LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: corev1.LabelHostname,
							}},
						},
					},
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "workload", Image: "liken.sh/workload:1.0", ImagePullPolicy: corev1.PullNever,
						Ports:          []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 2},
					}},
				},
			},
		},
	}
	_, err = l.Kube.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{})
	assert.NilError(t, err)
	port := []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}
	svc, err := l.Kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "net", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: port},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)
	np, err := l.Kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "net-nodeport", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: port, Type: corev1.ServiceTypeNodePort},
	}, metav1.CreateOptions{})
	assert.NilError(t, err)

	pods := map[string]corev1.Pod{} // by machine
	start := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ps, err := l.Kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=net"})
		if err != nil {
			return poll.Continue("the pods: %v", err)
		}
		clear(pods)
		for _, p := range ps.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			}
			if !ready {
				return poll.Continue("pod %s on %q is %s, not ready", p.Name, p.Spec.NodeName, p.Status.Phase)
			}
			pods[p.Spec.NodeName] = p
		}
		if len(pods) != 2 {
			return poll.Continue("ready pods on %d machines", len(pods))
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(2*time.Second))
	t.Logf("a replica ready on each machine %s after the Deployment", time.Since(start).Round(time.Second))

	// get runs the workload's client in pod from and returns what url
	// answers: the name of the pod that answered.
	get := func(from corev1.Pod, url string) (string, error) {
		out, err := controlplane.Kubectl(ctx, l.Kubeconfig, "exec", "-n", "default", from.Name, "--", "/workload", "get", url)
		return strings.TrimSpace(out), err
	}
	start = time.Now()
	for machine, from := range pods {
		// Each replica by its pod address: one on this machine, one
		// across the segment.
		for other, to := range pods {
			got, err := get(from, fmt.Sprintf("http://%s:8080", to.Status.PodIP))
			assert.NilError(t, err, "a pod on %s reaching the pod on %s at %s", machine, other, to.Status.PodIP)
			assert.Equal(t, got, to.Name)
		}
		// The Service by its ClusterIP, until each replica answered.
		answered := map[string]bool{}
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			got, err := get(from, fmt.Sprintf("http://%s", svc.Spec.ClusterIP))
			if err != nil {
				return poll.Continue("the Service's ClusterIP %s from %s: %v", svc.Spec.ClusterIP, machine, err)
			}
			answered[got] = true
			if len(answered) < 2 {
				return poll.Continue("replicas that answered at the ClusterIP from %s: %v", machine, answered)
			}
			return poll.Success()
		}, poll.WithTimeout(2*time.Minute), poll.WithDelay(100*time.Millisecond))
		// The NodePort on each machine's address, once that machine's
		// kube-proxy has the Service.
		for other, addr := range addresses {
			url := fmt.Sprintf("http://%s:%d", addr, np.Spec.Ports[0].NodePort)
			var got string
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				var err error
				if got, err = get(from, url); err != nil {
					return poll.Continue("the NodePort of %s (%s) from a pod on %s: %v", other, url, machine, err)
				}
				return poll.Success()
			}, poll.WithTimeout(2*time.Minute), poll.WithDelay(time.Second))
			assert.Assert(t, got == pods[first].Name || got == pods[last].Name, "the NodePort of %s answered %q", other, got)
		}
		// Names: the Service's by the cluster DNS (short, through the
		// pod's search path, and whole), the API's Service, and a name of
		// the lab's own name server, which CoreDNS forwards to the
		// machine's resolver.
		for name, want := range map[string]string{
			"net":                           svc.Spec.ClusterIP,
			"net.default.svc.cluster.local": svc.Spec.ClusterIP,
			"kubernetes.default.svc":        "10.96.0.1",
			clilab.ChannelName:              l.St.ServersAddress(),
		} {
			var got string
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				out, err := controlplane.Kubectl(ctx, l.Kubeconfig, "exec", "-n", "default", from.Name, "--", "/workload", "lookup", name)
				if got = strings.TrimSpace(out); err != nil {
					return poll.Continue("resolving %s from a pod on %s: %v", name, machine, err)
				}
				return poll.Success()
			}, poll.WithTimeout(2*time.Minute), poll.WithDelay(time.Second))
			assert.Equal(t, got, want, "%s from a pod on %s", name, machine)
		}
		got, err := get(from, "http://net")
		assert.NilError(t, err, "the Service by its name from a pod on %s", machine)
		assert.Assert(t, got == pods[first].Name || got == pods[last].Name, "the Service by name answered %q", got)
		// kubectl logs reaches the machine's kubelet.
		_, err = controlplane.Kubectl(ctx, l.Kubeconfig, "logs", "-n", "default", from.Name)
		assert.NilError(t, err, "kubectl logs of the pod on %s", machine)
	}
	t.Logf("from a pod on each machine: both replicas by pod address, both through the ClusterIP, the NodePort on both machines, the names, in %s", time.Since(start).Round(time.Second))

	// cluster-operator, in a pod of the fleet, reads the lab's release
	// channel over https by its name, trusting the Cluster's CA bundle.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := l.Liken.LikenV1alpha1().Clusters().Get(ctx, l.St.Name, metav1.GetOptions{})
		if err != nil {
			return poll.Continue("the Cluster: %v", err)
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, likenv1.ConditionReleasesAvailable)
		if cond == nil || cond.Reason != "ChannelRead" {
			return poll.Continue("ReleasesAvailable: %+v", cond)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(2*time.Second))
	assert.Assert(t, strings.HasPrefix(l.St.Channel, "https://"+clilab.ChannelName+":"), "the lab's channel %s", l.St.Channel)
}
