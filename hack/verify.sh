#!/usr/bin/env bash
# Static checks: formatting, go vet (both modules), the dependency rules
# between liken's parts, and generated code.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."

bad=$(gofmt -l $(git ls-files -co --exclude-standard '*.go' | grep -v '^generated/') || true)
if [ -n "$bad" ]; then
    echo "gofmt would change these files (run gofmt -w):" >&2
    echo "$bad" >&2
    exit 1
fi
go vet ./...
(cd hack/kube && go vet .)
hack/verify-deps.sh
hack/verify-codegen.sh
