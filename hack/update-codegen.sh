#!/usr/bin/env bash
# Regenerates deepcopy functions, the clientset, listers and informers for
# apis/ into generated/. The code generator's version is the one go.mod pins.
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${1:-$root/generated}

codegen=$(go list -m -f '{{.Dir}}' k8s.io/code-generator)
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
