#!/usr/bin/env bash
# The dependency rules between liken's parts: the server binaries
# (cluster-operator, liken-node) never depend on the user's command line,
# and the operator and the node daemon share code only through packages
# both use (release, version, internal/...), never through each other's.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."

fail=0
check() { # packages, forbidden prefix, why
    local bad
    bad=$(go list -f '{{.ImportPath}}: {{join .Deps " "}}' "$1" | tr ' ' '\n' | grep -E "^liken\.sh/liken/$2(/|$)" | sort -u || true)
    if [ -n "$bad" ]; then
        echo "$1 depends on $(echo "$bad" | paste -sd' '): $3" >&2
        fail=1
    fi
}
for bin in ./controllers/cmd/cluster-operator ./node/cmd/liken-node; do
    check "$bin" cli "a server binary must not depend on the user's command line; move what it needs to a shared package"
done
check ./controllers/... node "the operator must not depend on the node daemon's packages; move the shared code to a package both use"
check ./node/... controllers "the node daemon must not depend on the operator's packages; move the shared code to a package both use"
check ./cli/cmd/liken node/daemon "the command line must not link the node daemon; move what it shares with it (file formats, exit codes) to a small package both use"
for bin in ./cli/cmd/liken ./controllers/cmd/cluster-operator ./node/cmd/liken-node; do
    if go list -deps "$bin" | grep -qx testing; then
        echo "$bin links the test framework (package testing): keep test helpers in packages only tests import" >&2
        fail=1
    fi
done
exit $fail
