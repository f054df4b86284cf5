// Package controlplane runs the Kubernetes control plane on a leader machine: its configuration, certificates, component flags and the datastore's start.
package controlplane
