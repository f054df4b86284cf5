// Package controlplane runs the Kubernetes control plane on a leader machine: its configuration, certificates, component flags, the datastore's start, and init: the join token, the bindings and the promotion of a learner.
package controlplane
