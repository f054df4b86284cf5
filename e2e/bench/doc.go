// Package bench measures liken on real processes against baselines taken
// in the same run: cluster-operator at fleet scale on a real control plane,
// a whole rollout on a lab fleet, and the node daemon at rest.
//
// `make bench` runs the full sizes (LIKEN_BENCH=full); `go test` runs a
// small smoke of each benchmark so that they keep working. The method and
// the figures are in docs/benchmarks.md.
package bench
