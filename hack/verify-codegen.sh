#!/usr/bin/env bash
# Fails when the generated code in generated/ or apis/ differs from what
# hack/update-codegen.sh would write now.
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cp -a apis "$tmp/apis.before"
mkdir -p "$tmp/generated/clientset" "$tmp/generated/listers" "$tmp/generated/informers"
"$root/hack/update-codegen.sh" "$tmp/generated" >/dev/null
status=0
if ! diff -ru "$root/generated" "$tmp/generated"; then
    status=1
fi
if ! diff -ru "$tmp/apis.before" "$root/apis"; then
    cp -a "$tmp/apis.before/." apis/
    status=1
fi
if [ "$status" -ne 0 ]; then
    echo "generated code is stale: run hack/update-codegen.sh and commit the result" >&2
fi
exit "$status"
