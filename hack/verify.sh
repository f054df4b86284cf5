#!/usr/bin/env bash
# Static checks: formatting, go vet (every module but hack/e2e, which make
# e2e-network vets: it takes minutes cold, and CI never builds it), the
# dependency rules between liken's parts, and generated code.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."

bad=$(gofmt -l $(git ls-files -co --exclude-standard '*.go' | grep -v '^generated/') || true)
if [ -n "$bad" ]; then
    echo "gofmt would change these files (run gofmt -w):" >&2
    echo "$bad" >&2
    exit 1
fi
go vet ./...
# Files only some builds compile: the virtual machine scenarios of make
# test-vm and make test-vm-leaders, and the image's kube without kwok.
go vet -tags vmfaults,vmleaders,vmconformance ./e2e/vm/
(cd hack/kube && go vet . && go vet -tags nokwok .)
(cd hack/coredns && go vet .)
hack/verify-deps.sh
# .ci/run has already checked it, from an empty module cache.
if [ -z "${LIKEN_CODEGEN_VERIFIED:-}" ]; then
    hack/verify-codegen.sh
fi
