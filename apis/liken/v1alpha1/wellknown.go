package v1alpha1

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names shared by cluster-operator, the node daemon and the command line.
const (
	// SystemNamespace holds cluster-operator and its leader Lease.
	SystemNamespace = "liken-system"
	// OperatorLeaseName is the Lease cluster-operator copies elect a leader with.
	OperatorLeaseName = "cluster-operator"
	// OperatorDeploymentName is cluster-operator's Deployment in
	// SystemNamespace; its pods carry the label OperatorAppLabel.
	OperatorDeploymentName = "cluster-operator"
	// OperatorAppLabel is the value of app.kubernetes.io/name on the pods
	// of cluster-operator's Deployment.
	OperatorAppLabel = "cluster-operator"

	// AnnotationCheckReleases: a new value makes cluster-operator read the
	// release channel now. The value means nothing.
	AnnotationCheckReleases = "liken.sh/check-releases"
	// AnnotationResumeRollout: a new value on a Cluster lifts a halt
	// (RolloutStalled, TrialFailed or K3sRestartFailed); liken rollout resume sets it.
	AnnotationResumeRollout = "liken.sh/resume-rollout"
	// AnnotationHold on a Cluster stops new turns while it is set; its
	// value is the reason, shown with who set it and when. Turns held go
	// on to their end.
	AnnotationHold = "liken.sh/hold"
	// AnnotationApprovedChange on a Machine holds the status.change value a
	// person approved with liken approve-reboot.
	AnnotationApprovedChange = "liken.sh/approved-change"
	// AnnotationRequestReboot: a new value on a Machine asks for one reboot
	// (liken request-reboot sets it).
	AnnotationRequestReboot = "liken.sh/request-reboot"
	// AnnotationCordoned on a Node records that liken cordoned it, so liken
	// uncordons only nodes it cordoned.
	AnnotationCordoned = "liken.sh/cordoned"
	// LeaderNodeLabel marks the Node of a leader, where cluster-operator
	// runs. A kubelet cannot set a label of the node-restriction.kubernetes.io/
	// prefix on its own Node (NodeRestriction), so a worker cannot claim it:
	// a leader's control-plane init sets it, as an administrator does on a
	// control plane that is not liken's.
	LeaderNodeLabel = "node-restriction.kubernetes.io/liken-leader"
)

// Annotations a person sets on a Leader Machine to say how the other
// leaders reach its control plane. Each holds an https URL with a host and
// a port, such as https://10.0.0.11:6443. Without one, liken layer pack
// takes the Leader's first static address (spec.ports[].addresses) with
// the component's port; a layer with two or more Leaders needs, for every
// Leader, a static address or all three annotations. A Cluster's only
// Leader with neither is reached on 127.0.0.1: it talks only to itself.
// liken install writes them on every Leader's disk from the layer; editing
// them in the cluster changes nothing on a running leader.
const (
	// AnnotationAPIServerURL is the Leader's API server URL. Default: its
	// first static address, port 6443.
	AnnotationAPIServerURL = "liken.sh/apiserver-url"
	// AnnotationEtcdClientURL is the URL etcd's clients reach the Leader's
	// member at. Default: its first static address, port 2379.
	AnnotationEtcdClientURL = "liken.sh/etcd-client-url"
	// AnnotationEtcdPeerURL is the URL the other members reach the
	// Leader's member at. Default: its first static address, port 2380.
	AnnotationEtcdPeerURL = "liken.sh/etcd-peer-url"
)

// Condition types.
const (
	// ConditionReady on a Cluster: every machine runs spec.version; on a
	// Machine: it runs the cluster's version with nothing pending.
	ConditionReady = "Ready"
	// ConditionProgressing on a Cluster: turns can be granted.
	ConditionProgressing = "Progressing"
	// ConditionReleasesAvailable on a Cluster: the channel was read.
	ConditionReleasesAvailable = "ReleasesAvailable"
	// ConditionRebootPending on a Machine: a change waits for a reboot.
	ConditionRebootPending = "RebootPending"
	// ConditionTrialFailed on a Machine: the last trial boot failed.
	ConditionTrialFailed = "TrialFailed"
	// ConditionDrainBlocked on a Machine: the drain cannot finish.
	ConditionDrainBlocked = "DrainBlocked"
	// ConditionReleaseVerified on a Machine: the last download verified, or
	// why it did not.
	ConditionReleaseVerified = "ReleaseVerified"
	// ConditionLayerMatches on a Machine: its spec agrees with the Machine
	// document of the layer it was installed from, in the fields that take
	// effect at boot before liken-node reads the API (its role, its ports).
	ConditionLayerMatches = "LayerMatches"
	// ConditionControlPlaneReady on a leader's Machine: its own etcd member
	// votes and is healthy, and its API server is ready. cluster-operator
	// counts a leader whose condition is False as down.
	ConditionControlPlaneReady = "ControlPlaneReady"
	// ConditionConfigApplied on a Machine: every declared value is in
	// effect or staged; the message lists what waits for a turn or the
	// next boot.
	ConditionConfigApplied = "ConfigApplied"
)

// Condition reasons.
const (
	ReasonRolloutStalled   = "RolloutStalled"
	ReasonTrialFailed      = "TrialFailed"
	ReasonStartupGrace     = "StartupGrace"
	ReasonPaused           = "Paused"
	ReasonGranting         = "Granting"
	ReasonIdle             = "Idle"
	ReasonAwaitingApproval = "AwaitingApproval"
	ReasonAwaitingTurn     = "AwaitingTurn"
	// ReasonOutsideWindow: machines wait for a turn, and no maintenance
	// window (spec.disruption.windows) is open.
	ReasonOutsideWindow = "OutsideWindow"
	// ReasonDrainBlocked: no turn is held or granted, and machines that
	// could have had one were passed over because PodDisruptionBudgets
	// would block their drain now; the message names the budgets and
	// their pods.
	ReasonDrainBlocked = "DrainBlocked"
	// ReasonInvalidWindow: a maintenance window cannot be read (such as a
	// time zone cluster-operator does not know); nothing is granted.
	ReasonInvalidWindow = "InvalidWindow"
	// ReasonK3sRestartFailed: on a Machine's ConfigApplied, a restart of
	// k3s in its turn did not bring the node back Ready within the trial
	// timeout, and the machine restarted k3s again with the configuration
	// it ran before; on a Cluster's Progressing, the halt that follows: no
	// machine restarts k3s until the value changes or a person resumes.
	ReasonK3sRestartFailed = "K3sRestartFailed"
	// ReasonSettling: on a Cluster's Progressing, machines wait for a turn
	// while machines that came back from theirs settle
	// (spec.disruption.settle); the message names what each waits for.
	ReasonSettling = "Settling"
	// ReasonHeld: on a Cluster's Progressing, the annotation liken.sh/hold
	// stops new turns; the message gives its reason, who set it and when.
	ReasonHeld = "Held"
	// ReasonGateClosed: on a Cluster's Progressing, no turn is held or
	// granted and the machines that wait were passed over by a gate of
	// spec.disruption.gates; the message names each and the gate.
	ReasonGateClosed = "GateClosed"
	// ReasonInvalidGate: on a Cluster's Progressing, a gate of
	// spec.disruption.gates cannot be read; nothing is granted.
	ReasonInvalidGate = "InvalidGate"
	// ReasonCanary: on a Cluster's Progressing, the canary of the rollout
	// runs the new release; no other machine gets a turn to it before the
	// message's time.
	ReasonCanary = "Canary"
	// ReasonCanaryFailed: on a Cluster's Progressing, the canary turned
	// unhealthy on the new release; as for TrialFailed, no machine gets a
	// turn to it until spec.version changes or a person resumes.
	ReasonCanaryFailed = "CanaryFailed"
)

// Defaults of optional fields.
const (
	DefaultPollInterval = time.Hour
	DefaultDrainTimeout = 10 * time.Minute
	DefaultTrialTimeout = 10 * time.Minute
	DefaultStallTimeout = 30 * time.Minute
	DefaultSettle       = 30 * time.Second
	// DefaultServiceCIDR is the service range when spec.network.serviceCIDR
	// is unset.
	DefaultServiceCIDR = "10.96.0.0/16"
	// DefaultPodCIDR is the pod range when spec.network.podCIDR is unset.
	DefaultPodCIDR = "10.244.0.0/16"
)

// The size of each Node's pod range: the controller manager gives every
// Node a range of this prefix length out of spec.network.podCIDR. An IPv4
// /24 holds 254 pods, more than the kubelet's 110; the controller manager
// takes at most 16 bits of IPv6 ranges (so an IPv6 podCIDR is /48 to /64).
// The Cluster's schema (manifests/10-crd-cluster.yaml) refuses the same
// podCIDRs as NodePodCIDRPrefix.
const (
	NodePodCIDRPrefixIPv4 = 24
	NodePodCIDRPrefixIPv6 = 64
	// maxNodeRangeBits is how many bits the controller manager can number
	// IPv6 Node ranges with.
	maxNodeRangeBits = 16
)

// PodCIDROrDefault is spec.network.podCIDR, or its default.
func (n *NetworkSpec) PodCIDROrDefault() string {
	if n.PodCIDR == "" {
		return DefaultPodCIDR
	}
	return n.PodCIDR
}

// NodePodCIDRPrefix is the prefix length of each Node's pod range out of
// podCIDR: NodePodCIDRPrefixIPv4 or NodePodCIDRPrefixIPv6. The error says
// why podCIDR cannot hold Node ranges: it is not a CIDR, is smaller than
// one Node's range, or (IPv6) larger than the controller manager numbers.
func NodePodCIDRPrefix(podCIDR string) (int, error) {
	p, err := netip.ParsePrefix(podCIDR)
	if err != nil {
		return 0, fmt.Errorf("%q is not a CIDR such as %s", podCIDR, DefaultPodCIDR)
	}
	if p.Addr().Is4() {
		if p.Bits() > NodePodCIDRPrefixIPv4 {
			return 0, fmt.Errorf("%s is smaller than one machine's pod range, a /%d: give a /%d or larger, such as %s", podCIDR, NodePodCIDRPrefixIPv4, NodePodCIDRPrefixIPv4, DefaultPodCIDR)
		}
		return NodePodCIDRPrefixIPv4, nil
	}
	switch {
	case p.Bits() > NodePodCIDRPrefixIPv6:
		return 0, fmt.Errorf("%s is smaller than one machine's pod range, a /%d: give a /%d to /%d", podCIDR, NodePodCIDRPrefixIPv6, NodePodCIDRPrefixIPv6-maxNodeRangeBits, NodePodCIDRPrefixIPv6)
	case NodePodCIDRPrefixIPv6-p.Bits() > maxNodeRangeBits:
		return 0, fmt.Errorf("%s holds more than the %d machine ranges of /%d the controller manager can number: give a /%d to /%d", podCIDR, 1<<maxNodeRangeBits, NodePodCIDRPrefixIPv6, NodePodCIDRPrefixIPv6-maxNodeRangeBits, NodePodCIDRPrefixIPv6)
	}
	return NodePodCIDRPrefixIPv6, nil
}

// ServiceCIDROrDefault is spec.network.serviceCIDR, or its default.
func (n *NetworkSpec) ServiceCIDROrDefault() string {
	if n.ServiceCIDR == "" {
		return DefaultServiceCIDR
	}
	return n.ServiceCIDR
}

// ClusterDNSOrDefault is spec.network.clusterDNS, or its default: the
// tenth address of the service range (10.96.0.10 of 10.96.0.0/16). The
// error says why the service range holds no such address.
func (n *NetworkSpec) ClusterDNSOrDefault() (string, error) {
	if n.ClusterDNS != "" {
		return n.ClusterDNS, nil
	}
	return DefaultClusterDNS(n.ServiceCIDROrDefault())
}

// DefaultClusterDNS is the tenth address of serviceCIDR, the cluster DNS
// address when spec.network.clusterDNS is unset.
func DefaultClusterDNS(serviceCIDR string) (string, error) {
	p, err := netip.ParsePrefix(serviceCIDR)
	if err != nil {
		return "", fmt.Errorf("serviceCIDR %q is not a CIDR such as %s", serviceCIDR, DefaultServiceCIDR)
	}
	a := p.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	if !p.Contains(a) {
		return "", fmt.Errorf("serviceCIDR %s holds no tenth address for the cluster DNS: give a larger range, or set clusterDNS", serviceCIDR)
	}
	return a.String(), nil
}

// EndpointURL is spec.network.endpoint as an https URL with a port:
// host:port becomes https://host:port, a URL without a port gets its
// scheme's (443 for https), and a lone trailing / goes. Anything else is
// left as it is, for the control plane's configuration check to judge.
func (n *NetworkSpec) EndpointURL() string {
	s := n.Endpoint
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" {
		return s
	}
	if u.Port() == "" && u.Scheme == "https" && !strings.HasSuffix(u.Host, ":") {
		u.Host = net.JoinHostPort(u.Hostname(), "443")
	}
	if u.Path == "/" {
		u.Path = ""
	}
	return u.String()
}

// FirstServiceIP is the first address of the service range serviceCIDR,
// which the kubernetes Service takes: 10.96.0.1 for 10.96.0.0/16. Host
// bits of serviceCIDR are ignored.
func FirstServiceIP(serviceCIDR string) (net.IP, error) {
	p, err := netip.ParsePrefix(serviceCIDR)
	if err != nil {
		return nil, fmt.Errorf("%q is not a CIDR such as 10.96.0.0/16", serviceCIDR)
	}
	p = p.Masked()
	first := p.Addr().Next()
	if !first.IsValid() || !p.Contains(first) {
		return nil, fmt.Errorf("%q holds no address for the kubernetes Service; give a larger range", serviceCIDR)
	}
	return net.IP(first.AsSlice()), nil
}

// PollIntervalOrDefault is spec.releases.pollInterval, or its default.
func (r *ReleasesSpec) PollIntervalOrDefault() time.Duration {
	if r.PollInterval == nil || r.PollInterval.Duration <= 0 {
		return DefaultPollInterval
	}
	return r.PollInterval.Duration
}

// DrainTimeoutOrDefault is spec.disruption.drainTimeout, or its default.
func (d *DisruptionSpec) DrainTimeoutOrDefault() time.Duration {
	if d.DrainTimeout == nil || d.DrainTimeout.Duration <= 0 {
		return DefaultDrainTimeout
	}
	return d.DrainTimeout.Duration
}

// TrialTimeoutOrDefault is spec.disruption.trialTimeout, or its default.
func (d *DisruptionSpec) TrialTimeoutOrDefault() time.Duration {
	if d.TrialTimeout == nil || d.TrialTimeout.Duration <= 0 {
		return DefaultTrialTimeout
	}
	return d.TrialTimeout.Duration
}

// StallTimeoutOrDefault is spec.disruption.stallTimeout, or its default.
func (d *DisruptionSpec) StallTimeoutOrDefault() time.Duration {
	if d.StallTimeout == nil || d.StallTimeout.Duration <= 0 {
		return DefaultStallTimeout
	}
	return d.StallTimeout.Duration
}

// SettleOrDefault is spec.disruption.settle, or its default: 30 s, or half
// of the stall timeout when that is shorter, so that a machine is not
// stalled by its settle time alone.
func (d *DisruptionSpec) SettleOrDefault() time.Duration {
	if d.Settle == nil || d.Settle.Duration < 0 {
		return min(DefaultSettle, d.StallTimeoutOrDefault()/2)
	}
	return d.Settle.Duration
}

// MaxUnavailableFor resolves spec.disruption.maxUnavailable for a cluster
// of total machines: an integer as it is; a percentage of total rounded
// down, but never below 1 unless the percentage is 0 (which pauses every
// turn). Unset means 1.
func (d *DisruptionSpec) MaxUnavailableFor(total int) (int, error) {
	if d.MaxUnavailable == nil {
		return 1, nil
	}
	v := *d.MaxUnavailable
	if v.Type == intstr.Int {
		if v.IntVal < 0 {
			return 0, errNegative
		}
		return int(v.IntVal), nil
	}
	digits, ok := strings.CutSuffix(v.StrVal, "%")
	if !ok {
		return 0, fmt.Errorf("maxUnavailable %q is neither a whole number nor a percentage such as 20%%", v.StrVal)
	}
	pct, err := strconv.Atoi(digits)
	if err != nil {
		return 0, fmt.Errorf("maxUnavailable %q is not a whole percentage such as 20%%", v.StrVal)
	}
	if pct < 0 {
		return 0, errNegative
	}
	if pct == 0 || total <= 0 {
		return 0, nil
	}
	// Integer arithmetic rounds down exactly (no float error at 100%).
	n := pct * total / 100
	if n < 1 {
		n = 1
	}
	return n, nil
}

type constError string

func (e constError) Error() string { return string(e) }

const errNegative = constError("maxUnavailable must not be negative")
