// Package clitest builds Clusters and Machines in the states the liken commands are tested against, for unit and end-to-end tests alike.
package clitest

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/internal/rules"
)

// Version1 and Version2 are the two releases of Cluster's catalog.
const (
	Version1 = "2026.10.10-001"
	Version2 = "2026.10.12-001"
)

// Cluster returns a Cluster named name on Version2 whose catalog holds
// Version1 and Version2, with maxUnavailable mu. Tests of the commands use
// it, against fakes and the real API server alike.
func Cluster(name, mu string) *v1alpha1.Cluster {
	m := intstr.Parse(mu)
	return &v1alpha1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ClusterSpec{
			Version: Version2,
			Releases: v1alpha1.ReleasesSpec{
				Source: "https://releases.example.com",
				Catalog: []v1alpha1.CatalogEntry{
					{Version: Version1, Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111"},
					{Version: Version2, Digest: "sha256:2222222222222222222222222222222222222222222222222222222222222222"},
				},
			},
			Network:    v1alpha1.NetworkSpec{Endpoint: "https://10.0.0.10:6443"},
			Disruption: v1alpha1.DisruptionSpec{MaxUnavailable: &m},
		},
	}
}

// Machine returns a Machine of cluster with the given role and policy,
// and no status.
func Machine(name, cluster string, role v1alpha1.MachineRole, policy v1alpha1.RebootPolicy) *v1alpha1.Machine {
	return &v1alpha1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.MachineSpec{Cluster: cluster, Role: role, RebootPolicy: policy},
	}
}

// Since is the fixed time test statuses use.
var Since = metav1.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// SetReady makes the status read Ready on version.
func SetReady(m *v1alpha1.Machine, version string) {
	m.Status = v1alpha1.MachineStatus{
		Phase: v1alpha1.MachineReady, Version: version, Slot: "A",
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "runs " + version, LastTransitionTime: Since}},
	}
}

// SetStaged makes the status read UpdatePending with target staged as
// change, waiting for approval (Manual) or for its turn (Auto or approved).
func SetStaged(m *v1alpha1.Machine, from, target, change string) {
	reason, msg := v1alpha1.ReasonAwaitingTurn, "waits for a reboot turn"
	if !rules.Cleared(m, change) {
		reason, msg = v1alpha1.ReasonAwaitingApproval, "waits for approval: liken approve-reboot "+m.Spec.Cluster+" "+m.Name
	}
	m.Status = v1alpha1.MachineStatus{
		Phase: v1alpha1.MachineUpdatePending, Version: from, Slot: "A", Staged: target, Change: change,
		Pending: []v1alpha1.PendingChange{{Field: "cluster.spec.version", Class: v1alpha1.ClassReboot, Since: Since}},
		Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "UpdatePending", Message: "staged " + target, LastTransitionTime: Since},
			{Type: v1alpha1.ConditionRebootPending, Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: Since},
		},
	}
}
