#!/usr/bin/env bash
# Runs every fuzz target briefly, so the targets keep compiling and the
# corpus keeps passing. Longer runs: go test -fuzz=NAME -fuzztime=5m ./PKG
#
# The budget is a count of inputs, not a duration: with a duration, Go
# 1.26's fuzzing coordinator can report its own deadline as a failure
# ("context deadline exceeded", no failing input written; golang/go#75804,
# fixed in Go 1.27), which failed make test on 2026-12-03.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-20000x}
go list -f '{{.ImportPath}} {{.Dir}}' ./... | while read -r pkg dir; do
    for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
        echo "fuzz: $pkg $target ($fuzztime)"
        go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" </dev/null
    done
done
