#!/usr/bin/env bash
# Runs every fuzz target briefly, so the targets keep compiling and the
# corpus keeps passing. Longer runs: go test -fuzz=NAME -fuzztime=5m ./PKG
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-5s}
for pkg in $(go list ./...); do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
        echo "fuzz: $pkg $target ($fuzztime)"
        go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
    done
done
