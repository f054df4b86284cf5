// Package v1alpha1 holds the liken.sh/v1alpha1 API: Cluster and Machine.
//
// The doc comments on these types are the reference documentation: every
// field says what it means, its default, and its disruption class (how a
// change to it reaches the machines: Live, RestartK3s, NextBoot or Reboot).
//
// +k8s:deepcopy-gen=package
// +groupName=liken.sh
package v1alpha1
