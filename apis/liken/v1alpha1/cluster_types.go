package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Cluster declares a whole fleet: the release every machine runs, where
// releases come from, the network, the settings every machine shares, and
// the disruption budget under which machines take turns to reboot.
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the operator declares.
	Spec ClusterSpec `json:"spec"`
	// Status is what cluster-operator observes and decides.
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterSpec is the desired state of a fleet.
type ClusterSpec struct {
	// Version is the release every machine runs, in the form YYYY.MM.DD-NNN.
	// It must name an entry of releases.catalog; the API server refuses any
	// other value. Disruption class: Reboot (each machine downloads the
	// release, then takes a turn to reboot into it).
	Version string `json:"version"`
	// Releases says where releases are published and which ones this
	// cluster trusts.
	Releases ReleasesSpec `json:"releases"`
	// Network is the cluster network every machine joins.
	Network NetworkSpec `json:"network"`
	// Settings are shared by every machine of the cluster. Each field has
	// its own disruption class.
	// +optional
	Settings SharedSettings `json:"settings,omitempty"`
	// Disruption bounds how many machines may be down at once and how long
	// each step of a turn may take.
	// +optional
	Disruption DisruptionSpec `json:"disruption,omitempty"`
}

// ReleasesSpec names the release channel and the releases this cluster
// trusts.
type ReleasesSpec struct {
	// Source is the URL (http or https) of the release channel: a directory
	// holding index.yaml and one folder per release. Disruption class: Live
	// (cluster-operator and the machines read the new channel at once).
	Source string `json:"source"`
	// Catalog lists the releases this cluster trusts, each pinned by the
	// digest of its release document. Versions are unique. At most 256
	// entries. Disruption class: Live (only spec.version makes a machine
	// change).
	// +listType=map
	// +listMapKey=version
	Catalog []CatalogEntry `json:"catalog"`
	// PollInterval is how often cluster-operator reads the channel's
	// index.yaml: a duration such as 30m or 1h, at least 10s. Default 1h.
	// Disruption class: Live.
	// +optional
	PollInterval *metav1.Duration `json:"pollInterval,omitempty"`
}

// CatalogEntry pins one release by the digest of its release document.
type CatalogEntry struct {
	// Version is the release version, YYYY.MM.DD-NNN.
	Version string `json:"version"`
	// Digest is "sha256:" followed by the 64 lowercase hex digits of the
	// SHA-256 of the release's release.yaml: the start of the trust chain.
	Digest string `json:"digest"`
}

// NetworkSpec is the network every machine of the cluster joins.
// Disruption class: Reboot for every field (machines rejoin with the new
// values only after a reboot).
type NetworkSpec struct {
	// Endpoint is the address (host:port or URL) of the Kubernetes API that
	// machines join. Disruption class: Reboot.
	Endpoint string `json:"endpoint"`
	// PodCIDR is the range pod addresses come from, such as 10.42.0.0/16
	// (default 10.244.0.0/16). The controller manager gives each Node a /24
	// of it (a /64 of an IPv6 range, which must then be a /48 to a /64), and
	// the pods of that Node's machine take their addresses from it; every
	// machine routes the other machines' ranges to their addresses. Pod
	// traffic to an address outside it leaves with the machine's address.
	// It must not overlap serviceCIDR. A Node keeps the range it was given,
	// and leaders hand out ranges from the value liken install wrote on
	// their disk: set it before the fleet is installed.
	// Disruption class: Reboot.
	// +optional
	PodCIDR string `json:"podCIDR,omitempty"`
	// ServiceCIDR is the range service addresses come from, such as
	// 10.96.0.0/16 (the default); every machine's kube-proxy routes them.
	// Leaders hand out addresses from the value liken install wrote on
	// their disk: set it before the fleet is installed.
	// Disruption class: Reboot.
	// +optional
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// ClusterDNS is the IP address of the cluster's DNS service, inside
	// serviceCIDR; default its tenth address (10.96.0.10 of 10.96.0.0/16).
	// liken's CoreDNS answers there (the Service kube-system/kube-dns), and
	// every machine's kubelet gives it to pods as their name server, with
	// the domain cluster.local. Leaders create that Service with the value
	// liken install wrote on their disk: set it before the fleet is
	// installed. Disruption class: Reboot.
	// +optional
	ClusterDNS string `json:"clusterDNS,omitempty"`
}

// SharedSettings are applied on every machine of the cluster.
type SharedSettings struct {
	// DNSServers are the name servers machines resolve names with, each an
	// IP address with an optional port (192.0.2.53, 192.0.2.53:5353,
	// [2001:db8::53]:53), in order; at most 8. Empty: the servers DHCP
	// gives, if any. Pods whose dnsPolicy is Default and the cluster DNS's
	// forwarding reach them through the machine's own resolver.
	// Disruption class: Live.
	// +optional
	DNSServers []string `json:"dnsServers,omitempty"`
	// CABundle holds PEM certificates of certificate authorities that
	// machines and cluster-operator trust besides the public ones the image
	// carries: for a release channel or a registry mirror whose certificate
	// a private CA signed. Disruption class: Live (liken-node and
	// cluster-operator read the channel with it, and containerd pulls from
	// an https registry mirror with it, from their next try; containerd
	// trusts it for other registries from its next start).
	// +optional
	CABundle string `json:"caBundle,omitempty"`
	// NTPServers are the time servers machines synchronise with.
	// Disruption class: Live.
	// +optional
	NTPServers []string `json:"ntpServers,omitempty"`
	// Sysctls are kernel parameters set at run time (name to value).
	// Disruption class: Live.
	// +optional
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// RegistryMirrors redirect image pulls for a registry to mirrors, tried
	// in order before the registry itself; containerd reads them at every
	// pull, so a change needs no restart. Disruption class: Live.
	// +optional
	// +listType=map
	// +listMapKey=registry
	RegistryMirrors []RegistryMirror `json:"registryMirrors,omitempty"`
	// K3sArgs are extra arguments for the node agent on every machine:
	// liken's image passes each item to kubelet as one argument, after its
	// own. Disruption class: RestartK3s.
	// +optional
	K3sArgs []string `json:"k3sArgs,omitempty"`
	// KernelArgs are extra kernel command-line arguments, one per item,
	// at most 24 and 1024 bytes in all: printable ASCII without white space
	// or any of " ' \ * ? [ ], and no --, liken.* or panic=.
	// Disruption class: Reboot.
	// +optional
	KernelArgs []string `json:"kernelArgs,omitempty"`
	// Banner is the text machines print on their console at boot.
	// Disruption class: NextBoot.
	// +optional
	Banner string `json:"banner,omitempty"`
}

// RegistryMirror sends pulls for one registry to its mirrors.
type RegistryMirror struct {
	// Registry is the registry host, such as docker.io or
	// registry.example:5000, or * for every registry. Disruption class:
	// Live, as its list.
	Registry string `json:"registry"`
	// Endpoints are the mirror URLs, tried in order. Disruption class:
	// Live, as its list.
	Endpoints []string `json:"endpoints"`
}

// DisruptionSpec is the disruption budget and the time limits of a turn.
type DisruptionSpec struct {
	// MaxUnavailable is how many machines may be unavailable at once: an
	// integer, or a percentage of the cluster's machines that rounds down
	// but never below 1 (unless it is 0, which pauses every turn). Machines
	// that hold a turn and machines that are Lost or NotReady count.
	// Default 1. Disruption class: Live (cluster-operator applies it at its
	// next decision).
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// DrainTimeout is how long a drain may be blocked before the machine
	// reports DrainBlocked. The drain never forces. A duration such as 10m;
	// default 10m. Disruption class: Live (from the next drain).
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`
	// TrialTimeout is how long a trial boot has to start the OS and rejoin
	// the cluster before the machine returns to its proven slot, and how
	// long a restart of k3s for a RestartK3s change has to bring the node
	// back Ready before k3s restarts with the configuration it ran before.
	// A duration such as 10m; default 10m. Disruption class: Live (from the
	// next trial or restart).
	// +optional
	TrialTimeout *metav1.Duration `json:"trialTimeout,omitempty"`
	// StallTimeout is how long a turn may last before cluster-operator
	// halts the rollout with RolloutStalled. A duration such as 30m;
	// default 30m. Disruption class: Live.
	// +optional
	StallTimeout *metav1.Duration `json:"stallTimeout,omitempty"`
	// Settle is how long, at the least, a machine that came back from its
	// turn keeps its place under maxUnavailable before the place goes to
	// another machine. The machine is settled once this time has passed
	// since it came back, every PodDisruptionBudget its drain took
	// disruptions from has all of its pods healthy again, and the
	// DaemonSet pods on it are Ready (after a reboot, with containers
	// started since the turn was granted). Until then it counts against maxUnavailable, and
	// a leader as a leader that is down. A machine not settled within the
	// stall timeout of its return halts the rollout with RolloutStalled. A
	// duration such as 30s or 5m, shorter than stallTimeout; 0s waits for
	// the workloads alone. Default 30s, or half of stallTimeout when that
	// is shorter. Disruption class: Live.
	// +optional
	Settle *metav1.Duration `json:"settle,omitempty"`
	// Canary, when set, makes the first machine of each rollout a canary:
	// once it is back on the new release, no other machine gets a turn to
	// that release until the canary ran it, settled, for the canary's
	// duration. If the canary turns unhealthy in that time (NotReady, Lost,
	// Degraded, or no longer on the release), the rollout halts with
	// CanaryFailed, as for a failed trial. Unset: no canary. Disruption
	// class: Live (from the next rollout).
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`
	// Gates are conditions that must be open for a machine to get a turn.
	// At most 16. Disruption class: Live.
	// +optional
	// +listType=atomic
	Gates []Gate `json:"gates,omitempty"`
	// Windows are the maintenance windows: the only times cluster-operator
	// grants reboot turns. A turn granted inside a window goes on to its end
	// after the window closes. Machines download and stage releases at any
	// time; only their turns wait. Windows may overlap: a turn may be granted
	// while any of them is open. No windows: turns are granted at any time.
	// At most 32 windows. Disruption class: Live (cluster-operator applies
	// them at its next decision).
	// +optional
	// +listType=atomic
	Windows []MaintenanceWindow `json:"windows,omitempty"`
}

// CanarySpec is how long the first machine of a rollout runs the new
// release before the others follow.
type CanarySpec struct {
	// Duration is how long the canary runs the new release, settled and
	// healthy, before a second machine gets a turn to it: a duration such
	// as 30m or 2h, at least 1m and at most 7 days (168h).
	Duration metav1.Duration `json:"duration"`
}

// Gate is a condition turns wait for. It has exactly one kind.
type Gate struct {
	// BlockingPods passes over every machine that runs a pod (not finished)
	// its selector matches: such a machine gets no turn while the pod runs
	// there, and the next machine in order takes the turn.
	// +optional
	BlockingPods *BlockingPodsGate `json:"blockingPods,omitempty"`
	// Prometheus shuts every turn while an alert it names fires on a
	// Prometheus server, or while the server does not answer.
	// +optional
	Prometheus *PrometheusGate `json:"prometheus,omitempty"`
}

// PrometheusGate names a Prometheus server and the alerts that hold the
// rollout.
type PrometheusGate struct {
	// URL of the Prometheus server's HTTP API, http or https, such as
	// http://prometheus.monitoring:9090. cluster-operator reads its firing
	// alerts (/api/v1/alerts) every 30 s, and again before it grants.
	URL string `json:"url"`
	// Alerts is a regular expression (RE2) that the whole name of a firing
	// alert must match to shut the gate, such as "Kube.*|Etcd.*". Unset:
	// every firing alert shuts it.
	// +optional
	Alerts string `json:"alerts,omitempty"`
	// Timeout is how long cluster-operator waits for the server's answer;
	// no answer (or an error) keeps the gate shut. A duration from 1s to
	// 1m; default 10s.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// BlockingPodsGate names the pods that keep their machine from a turn.
type BlockingPodsGate struct {
	// Selector matches the labels of the pods that block, in every
	// namespace (or in Namespaces). It must select something: an empty
	// selector is refused.
	Selector metav1.LabelSelector `json:"selector"`
	// Namespaces limits the gate to pods of these namespaces; none: every
	// namespace.
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`
}

// MaintenanceWindow is a time of the week when cluster-operator may grant
// reboot turns: it opens on each of its days at its start time, on the
// clock of its time zone, and stays open for its duration.
type MaintenanceWindow struct {
	// Days are the days of the week the window opens on, in its time zone:
	// one or more of Mon, Tue, Wed, Thu, Fri, Sat and Sun, each once. A
	// window that runs past midnight belongs to the day it opened on.
	// +listType=set
	Days []string `json:"days"`
	// Start is the time of day the window opens, "HH:MM" on a 24-hour clock
	// in its time zone, such as "22:00". When the clocks skip that time (the
	// change to summer time), the window opens the moment they skip it;
	// when they pass it twice (the change back), it opens the first time.
	Start string `json:"start"`
	// Duration is how long the window stays open, read on the clock of its
	// time zone: a duration such as 4h, 90m or 2h30m, more than 0 and at
	// most 7 days (168h). A window from 22:00 for 4h closes at 02:00 on the
	// clock, even on the night the clocks change, when it is open 3 or 5
	// hours of real time.
	Duration metav1.Duration `json:"duration"`
	// TimeZone is the IANA name of the time zone the window's days and
	// start are read in, such as Europe/Berlin, America/New_York or UTC.
	// The API server checks only the form of the name; a name
	// cluster-operator does not know stops every grant (Progressing False,
	// reason InvalidWindow) until it is fixed, and liken layer pack refuses
	// it.
	TimeZone string `json:"timeZone"`
}

// ClusterPhase is the one-word state of a Cluster.
type ClusterPhase string

// Cluster phases.
const (
	// ClusterReady means every machine runs spec.version with nothing staged.
	ClusterReady ClusterPhase = "Ready"
	// ClusterUpdating means a rollout or a reboot is in progress.
	ClusterUpdating ClusterPhase = "Updating"
)

// ClusterStatus is what cluster-operator observes and decides.
type ClusterStatus struct {
	// Phase is Ready when every machine runs spec.version with nothing
	// staged, Updating while a rollout or a reboot is in progress.
	// +optional
	Phase ClusterPhase `json:"phase,omitempty"`
	// Machines is "ready/total": machines that are Ready and run
	// spec.version, out of all machines of the cluster.
	// +optional
	Machines string `json:"machines,omitempty"`
	// Leaders names the cluster's leader machines.
	// +optional
	Leaders []string `json:"leaders,omitempty"`
	// Term is the leadership term of the cluster-operator copy that last
	// decided for this Cluster ("<lease transitions>/<identity>"). A copy
	// that starts leading writes its term first, before any decision, so
	// that a write of an earlier leader, decided on what it read before,
	// conflicts and adds no turn.
	// +optional
	Term string `json:"term,omitempty"`
	// Endpoint is the API endpoint machines join (spec.network.endpoint).
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// RebootTurns is the turn ledger: every machine that holds a reboot
	// turn. A machine acts on a turn only while it is listed here.
	// +optional
	// +listType=map
	// +listMapKey=machine
	RebootTurns []RebootTurn `json:"rebootTurns,omitempty"`
	// Turns lists the machines that hold a turn, comma-separated.
	// +optional
	Turns string `json:"turns,omitempty"`
	// Releases is what cluster-operator knows of the catalog and the
	// channel.
	// +optional
	Releases ReleasesStatus `json:"releases,omitempty"`
	// Settling are the machines that came back from a turn and are not
	// settled yet (spec.disruption.settle). Each keeps its place under
	// maxUnavailable until it is.
	// +optional
	// +listType=map
	// +listMapKey=machine
	Settling []SettlingMachine `json:"settling,omitempty"`
	// Canary is the canary of the rollout of spec.version (or of the last
	// rollout), when spec.disruption.canary is set.
	// +optional
	Canary *CanaryStatus `json:"canary,omitempty"`
	// Halt, when set, stops new turns until a person acts: a turn that
	// stalled, or a trial that failed.
	// +optional
	Halt *RolloutHalt `json:"halt,omitempty"`
	// ObservedResume is the last value of the liken.sh/resume-rollout
	// annotation that cluster-operator acted on.
	// +optional
	ObservedResume string `json:"observedResume,omitempty"`
	// Conditions are Ready (True when every machine is Ready on
	// spec.version), Progressing (False with reason RolloutStalled,
	// TrialFailed, Paused or InvalidWindow when no turn can be granted, and
	// the message says what to do; reason StartupGrace while a new
	// cluster-operator leader waits before granting; reason OutsideWindow
	// while machines wait for the next maintenance window, and the message
	// says when it opens; reason DrainBlocked when no turn is held or
	// granted because PodDisruptionBudgets would block the drain of the
	// machines next in line, and the message names the budgets and their
	// pods) and ReleasesAvailable (whether the channel could be read).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// TurnReason says why a machine holds a turn.
type TurnReason string

// Turn reasons.
const (
	// TurnRelease is a turn to reboot into a new release.
	TurnRelease TurnReason = "Release"
	// TurnReboot is a turn for any other reboot: a staged change of class
	// Reboot, or a reboot a person requested.
	TurnReboot TurnReason = "Reboot"
	// TurnRestartK3s is a turn to restart k3s in place for a change of
	// class RestartK3s: no cordon, no drain, no reboot. Turns are granted
	// within maxUnavailable, and leaders take them one at a time, so the
	// datastore keeps its majority.
	TurnRestartK3s TurnReason = "RestartK3s"
	// TurnLive is a turn to apply changes of class Live (sysctls, DNS and
	// NTP servers, the CA bundle, registry mirrors) in place: no cordon,
	// no drain, no reboot. Granted like a RestartK3s turn, so a value
	// that breaks machines reaches at most maxUnavailable of them.
	TurnLive TurnReason = "Live"
)

// InPlace tells whether a turn of reason r changes the machine without a
// reboot: no approval, no cordon, no drain.
func (r TurnReason) InPlace() bool {
	return r == TurnRestartK3s || r == TurnLive
}

// RebootTurn is one entry of the turn ledger.
type RebootTurn struct {
	// Machine holds the turn.
	Machine string `json:"machine"`
	// Reason is Release, Reboot, Live or RestartK3s.
	Reason TurnReason `json:"reason"`
	// Change is the change the turn was granted for (the machine's
	// status.change when the turn was granted).
	// +optional
	Change string `json:"change,omitempty"`
	// Leader is true when the machine is a leader.
	// +optional
	Leader bool `json:"leader,omitempty"`
	// BootID is the machine's boot ID when the turn was granted; a
	// Release or Reboot turn is done once the machine reports Ready from a
	// later boot.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// Version is, for a Release turn, the release the machine staged when
	// the turn was granted: the release its trial proves or fails. A
	// Release turn that ends on a new boot running another release is a
	// failed trial.
	// +optional
	Version string `json:"version,omitempty"`
	// GrantedAt is when the turn was recorded.
	GrantedAt metav1.Time `json:"grantedAt"`
	// Budgets are the PodDisruptionBudgets (namespace/name) the machine's
	// drain was to take disruptions from when the turn was granted: once
	// the machine is back, each must have all of its pods healthy again
	// before the machine is settled. At most 32, the first by name.
	// +optional
	// +listType=atomic
	Budgets []string `json:"budgets,omitempty"`
}

// CanaryStatus is where the canary of a rollout stands.
type CanaryStatus struct {
	// Machine is the canary: the first machine granted a turn to Version.
	Machine string `json:"machine"`
	// Version is the release the canary tries for the rest of the fleet.
	Version string `json:"version"`
	// ReturnedAt is when the canary came back on Version; unset while its
	// turn lasts.
	// +optional
	ReturnedAt *metav1.Time `json:"returnedAt,omitempty"`
	// PassedAt is when the canary passed: it ran Version, settled and
	// healthy, for the canary's duration. From then on the rollout goes
	// on as usual.
	// +optional
	PassedAt *metav1.Time `json:"passedAt,omitempty"`
}

// SettlingMachine is a machine that came back from its turn and whose
// workloads are not settled yet.
type SettlingMachine struct {
	// Machine came back from its turn.
	Machine string `json:"machine"`
	// Reason is the reason of the turn it came back from.
	Reason TurnReason `json:"reason"`
	// Leader is true when the machine is a leader.
	// +optional
	Leader bool `json:"leader,omitempty"`
	// Budgets are the PodDisruptionBudgets its drain took disruptions
	// from (the turn's budgets).
	// +optional
	// +listType=atomic
	Budgets []string `json:"budgets,omitempty"`
	// GrantedAt is when its turn was granted: after a reboot, its
	// DaemonSet pods must have started since then.
	GrantedAt metav1.Time `json:"grantedAt"`
	// ReturnedAt is when its turn ended.
	ReturnedAt metav1.Time `json:"returnedAt"`
}

// ReleasesStatus is what cluster-operator knows of releases.
type ReleasesStatus struct {
	// Newest is the newest version in spec.releases.catalog.
	// +optional
	Newest string `json:"newest,omitempty"`
	// Available is the newest version the channel announces.
	// +optional
	Available string `json:"available,omitempty"`
	// AvailableDigest is the digest the channel announces for Available.
	// +optional
	AvailableDigest string `json:"availableDigest,omitempty"`
	// CheckedAt is when the channel was last read, successfully or not.
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
	// Error is why the last read of the channel failed; empty after a
	// successful read.
	// +optional
	Error string `json:"error,omitempty"`
	// ObservedCheckRequest is the last value of the liken.sh/check-releases
	// annotation that cluster-operator acted on.
	// +optional
	ObservedCheckRequest string `json:"observedCheckRequest,omitempty"`
}

// RolloutHalt records why granting stopped.
type RolloutHalt struct {
	// Reason is RolloutStalled, TrialFailed, CanaryFailed or
	// K3sRestartFailed.
	Reason string `json:"reason"`
	// Machine is the machine that stalled, failed its trial or failed
	// its restart of k3s.
	Machine string `json:"machine"`
	// Version is the release that failed its trial (TrialFailed), or the
	// cluster's spec.version when the rollout stalled (RolloutStalled) or
	// a restart of k3s failed (K3sRestartFailed).
	// +optional
	Version string `json:"version,omitempty"`
	// Message says what happened and what to do.
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when the rollout halted.
	Since metav1.Time `json:"since"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// ClusterList is a list of Clusters.
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Clusters.
	Items []Cluster `json:"items"`
}
