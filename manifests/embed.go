// Package manifests embeds liken's Kubernetes manifests, so the liken
// command can install them (liken lab up) without a source tree.
package manifests

import "embed"

// FS holds the manifests applied to a cluster (*.yaml, in file-name order)
// and the example documents (examples/*.yaml).
//
//go:embed *.yaml examples/*.yaml
var FS embed.FS
