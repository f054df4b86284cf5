package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
)

// Join tokens (docs/design/image.md#joining-the-cluster). A machine joins
// with a Kubernetes bootstrap token of its own, which authenticates in the
// extra group JoinGroup(machine); cluster-operator approves a kubelet
// client certificate for system:node:<machine> only for a token in that
// group, or for the machine's own current certificate.
const (
	// JoinGroupPrefix begins the extra group of a join token bound to one
	// machine: the token's auth-extra-groups hold JoinGroup(machine).
	JoinGroupPrefix = "system:bootstrappers:liken:machine:"
	// FleetJoinGroup is the extra group of a fleet's shared join token, for
	// fleets that opt in to one token for every machine: it may ask for
	// the certificate of any Machine.
	FleetJoinGroup = "system:bootstrappers:liken:fleet"
)

// JoinGroup is the extra group of the join token bound to machine:
// JoinGroupPrefix and the first 32 hexadecimal digits of the SHA-256 of the
// name. A group may not hold a name's dots, so the name is hashed.
func JoinGroup(machine string) string {
	sum := sha256.Sum256([]byte(machine))
	return JoinGroupPrefix + hex.EncodeToString(sum[:16])
}
