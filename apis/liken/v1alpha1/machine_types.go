package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// Machine declares one machine of a Cluster: its role, reboot policy and
// hardware. Its name is the machine's node name. The machine itself writes
// the status.
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the operator declares.
	Spec MachineSpec `json:"spec"`
	// Status is what the machine reports.
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// MachineRole is Leader or Worker.
type MachineRole string

// Machine roles.
const (
	// RoleLeader runs the datastore and the control plane.
	RoleLeader MachineRole = "Leader"
	// RoleWorker runs workloads only.
	RoleWorker MachineRole = "Worker"
)

// RebootPolicy says whether a machine waits for a person before a reboot.
type RebootPolicy string

// Reboot policies.
const (
	// RebootManual waits for liken approve-reboot before each reboot.
	RebootManual RebootPolicy = "Manual"
	// RebootAuto takes its turn as soon as cluster-operator grants it.
	RebootAuto RebootPolicy = "Auto"
)

// MachineSpec is the desired state of one machine.
type MachineSpec struct {
	// Cluster is the name of the machine's Cluster. It cannot change.
	Cluster string `json:"cluster"`
	// Role is Leader (runs the datastore and the control plane) or Worker.
	// It cannot change: to change a machine's role, delete its Machine and
	// install the machine again with the other role. Disruption class:
	// Reboot.
	Role MachineRole `json:"role"`
	// RebootPolicy is Manual (default: each reboot waits for liken
	// approve-reboot) or Auto. Disruption class: Live.
	// +optional
	RebootPolicy RebootPolicy `json:"rebootPolicy,omitempty"`
	// Disks are the data disks to format and mount. The boot disk is not
	// listed. Disruption class: NextBoot (disks are prepared at boot, never
	// under a running workload).
	// +optional
	// +listType=map
	// +listMapKey=device
	Disks []Disk `json:"disks,omitempty"`
	// Ports are the network ports and their addresses.
	// Disruption class: Reboot.
	// +optional
	// +listType=map
	// +listMapKey=name
	Ports []Port `json:"ports,omitempty"`
	// KernelModules are loaded at boot, with their parameters.
	// Disruption class: Reboot.
	// +optional
	// +listType=map
	// +listMapKey=name
	KernelModules []KernelModule `json:"kernelModules,omitempty"`
}

// Disk is one data disk.
type Disk struct {
	// Device is the disk's stable path, such as /dev/disk/by-id/....
	Device string `json:"device"`
	// MountPoint is where the disk is mounted, under /var.
	MountPoint string `json:"mountPoint"`
	// Filesystem is ext4 (default) or xfs.
	// +optional
	Filesystem string `json:"filesystem,omitempty"`
}

// Port is one network port.
type Port struct {
	// Name is the interface name, such as eth0.
	Name string `json:"name"`
	// MAC, when set, selects the port by its hardware address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// DHCP takes the address from DHCP.
	// +optional
	DHCP bool `json:"dhcp,omitempty"`
	// Addresses are static addresses in CIDR form.
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// Gateway is the default gateway reached through this port.
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// MTU of the port. Default 1500.
	// +optional
	MTU int32 `json:"mtu,omitempty"`
}

// KernelModule is one kernel module to load at boot.
type KernelModule struct {
	// Name is the module name.
	Name string `json:"name"`
	// Parameters are the module's parameters, each "key=value".
	// +optional
	Parameters []string `json:"parameters,omitempty"`
}

// MachinePhase is the one-word state of a machine (the STATUS column).
type MachinePhase string

// Machine phases.
const (
	// MachineReady runs the cluster's version with nothing pending.
	MachineReady MachinePhase = "Ready"
	// MachineDownloading fetches and verifies a release into its other slot.
	MachineDownloading MachinePhase = "Downloading"
	// MachineUpdatePending has a release staged and waits for its turn or
	// for approval.
	MachineUpdatePending MachinePhase = "UpdatePending"
	// MachineRebootPending has another change staged that needs a reboot,
	// and waits for its turn or for approval; or changes of class Live or
	// RestartK3s that wait for a turn to apply them in place.
	MachineRebootPending MachinePhase = "RebootPending"
	// MachineUpdating holds a turn to reboot into a new release: cordon,
	// drain, reboot, trial.
	MachineUpdating MachinePhase = "Updating"
	// MachineRebooting holds a turn for a reboot that is not a release
	// change, or a RestartK3s turn: k3s restarts in place and the turn
	// ends once the Node is Ready again.
	MachineRebooting MachinePhase = "Rebooting"
	// MachineLost has sent no heartbeat for 40 s (written by
	// cluster-operator).
	MachineLost MachinePhase = "Lost"
	// MachineDegraded needs a person; the conditions say why.
	MachineDegraded MachinePhase = "Degraded"
)

// DisruptionClass says how a change reaches a machine.
type DisruptionClass string

// Disruption classes, from least to most disruptive.
const (
	// ClassLive is applied in place, with no restart, in a Live turn
	// under the disruption budget (rebootPolicy at once).
	ClassLive DisruptionClass = "Live"
	// ClassRestartK3s restarts k3s in place; pods stay up.
	ClassRestartK3s DisruptionClass = "RestartK3s"
	// ClassNextBoot is applied at the next boot, whatever causes it.
	ClassNextBoot DisruptionClass = "NextBoot"
	// ClassReboot is staged and waits for a reboot turn.
	ClassReboot DisruptionClass = "Reboot"
)

// SlotState is the state of one boot slot.
type SlotState string

// Slot states.
const (
	// SlotActive is the slot the machine booted and proved.
	SlotActive SlotState = "Active"
	// SlotStaged holds a verified release waiting for its trial.
	SlotStaged SlotState = "Staged"
	// SlotDownloading is being written; it is never bootable.
	SlotDownloading SlotState = "Downloading"
	// SlotPrevious holds the release the machine ran before.
	SlotPrevious SlotState = "Previous"
	// SlotEmpty holds nothing.
	SlotEmpty SlotState = "Empty"
	// SlotFailed holds a release whose trial failed, or bytes that did not
	// verify.
	SlotFailed SlotState = "Failed"
)

// MachineStatus is what the machine reports about itself.
type MachineStatus struct {
	// Phase is the machine's one-word state (the STATUS column).
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`
	// Version is the release the machine runs.
	// +optional
	Version string `json:"version,omitempty"`
	// Slot is the slot the machine booted from: A or B.
	// +optional
	Slot string `json:"slot,omitempty"`
	// Staged is the version staged in the other slot, if any.
	// +optional
	Staged string `json:"staged,omitempty"`
	// Slots is the state of each boot slot.
	// +optional
	// +listType=map
	// +listMapKey=name
	Slots []SlotStatus `json:"slots,omitempty"`
	// Download is the progress of the download under way.
	// +optional
	Download *DownloadProgress `json:"download,omitempty"`
	// Pending are the changes that wait for a turn: staged ones for a
	// reboot turn, Live and RestartK3s ones for a turn in place.
	// +optional
	Pending []PendingChange `json:"pending,omitempty"`
	// Change identifies the set of staged changes (a release and pending
	// changes). liken approve-reboot approves exactly this value; a newer
	// change needs a new approval.
	// +optional
	Change string `json:"change,omitempty"`
	// ObservedRebootRequest is the last value of the
	// liken.sh/request-reboot annotation the machine acted on.
	// +optional
	ObservedRebootRequest string `json:"observedRebootRequest,omitempty"`
	// Observed is what the machine sees of its own hardware and boot.
	// +optional
	Observed ObservedState `json:"observed,omitempty"`
	// Conditions are Ready (the machine runs the Cluster's version with
	// nothing pending), RebootPending (a staged change waits: reason
	// AwaitingApproval names the liken approve-reboot command to run,
	// AwaitingTurn waits for cluster-operator), TrialFailed (the last trial
	// boot failed and the machine is back on its proven slot; the reason
	// says why), DrainBlocked (the drain is blocked past drainTimeout; the
	// message names the pods and PodDisruptionBudgets), ReleaseVerified
	// (the last download verified, or why it did not) and ConfigApplied
	// (whether the declared configuration could be applied).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SlotStatus is the state of one boot slot.
type SlotStatus struct {
	// Name is A or B.
	Name string `json:"name"`
	// State is Active, Staged, Downloading, Previous, Empty or Failed.
	State SlotState `json:"state"`
	// Version is the release in the slot.
	// +optional
	Version string `json:"version,omitempty"`
	// Digest is the digest of the slot's release document.
	// +optional
	Digest string `json:"digest,omitempty"`
}

// DownloadProgress is the progress of a download.
type DownloadProgress struct {
	// Version is the release being downloaded.
	Version string `json:"version"`
	// BytesDone is how many bytes are written and verified so far.
	BytesDone int64 `json:"bytesDone"`
	// BytesTotal is the size of every artifact of the release.
	BytesTotal int64 `json:"bytesTotal"`
}

// PendingKernelArgs is the field of a PendingChange of the Cluster's
// settings.kernelArgs.
const PendingKernelArgs = "cluster.spec.settings.kernelArgs"

// PendingChange is one staged change that waits for a reboot.
type PendingChange struct {
	// Field is the changed field, such as spec.kernelModules or
	// cluster.spec.version.
	Field string `json:"field"`
	// Class is the field's disruption class.
	Class DisruptionClass `json:"class"`
	// Since is when the change was staged.
	Since metav1.Time `json:"since"`
}

// ObservedState is what a machine sees of itself.
type ObservedState struct {
	// Disks are the disks the machine found.
	// +optional
	Disks []ObservedDisk `json:"disks,omitempty"`
	// Ports are the network ports the machine found.
	// +optional
	Ports []ObservedPort `json:"ports,omitempty"`
	// Modules are the loaded kernel modules.
	// +optional
	Modules []string `json:"modules,omitempty"`
	// BootID identifies the current boot.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// LastBoot is when the machine last booted.
	// +optional
	LastBoot *metav1.Time `json:"lastBoot,omitempty"`
}

// ObservedDisk is a disk a machine found.
type ObservedDisk struct {
	// Device is the disk's path.
	Device string `json:"device"`
	// SizeBytes is the disk's size.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// MountPoint is where it is mounted, if it is.
	// +optional
	MountPoint string `json:"mountPoint,omitempty"`
}

// ObservedPort is a network port a machine found.
type ObservedPort struct {
	// Name is the interface name.
	Name string `json:"name"`
	// MAC is its hardware address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// Addresses are its addresses in CIDR form.
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// Up is true when the link is up.
	// +optional
	Up bool `json:"up,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// MachineList is a list of Machines.
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Machines.
	Items []Machine `json:"items"`
}
