#!/usr/bin/env bash
# Regenerates deepcopy functions, the clientset, listers and informers for
# apis/ into generated/. The code generator's version is the one go.mod pins.
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${1:-$root/generated}

# `go list -m` names the module's folder only once the module is in the
# module cache, and no build downloads a `tool` dependency: fetch it first.
if ! go mod download k8s.io/code-generator; then
    echo "cannot download k8s.io/code-generator (the version go.mod pins) into $(go env GOMODCACHE): check that the Go module proxy ($(go env GOPROXY)) is reachable, then run $0 again" >&2
    exit 1
fi
codegen=$(go list -m -f '{{.Dir}}' k8s.io/code-generator)
if [ ! -f "$codegen/kube_codegen.sh" ]; then
    echo "k8s.io/code-generator has no kube_codegen.sh in '$codegen': the module cache is damaged; run 'go clean -modcache' and then $0 again" >&2
    exit 1
fi
# shellcheck source=/dev/null
source "$codegen/kube_codegen.sh"

kube::codegen::gen_helpers \
    --boilerplate "$root/hack/boilerplate.go.txt" \
    "$root/apis"

kube::codegen::gen_client \
    --with-watch \
    --output-dir "$out" \
    --output-pkg liken.sh/liken/generated \
    --boilerplate "$root/hack/boilerplate.go.txt" \
    "$root/apis"
