#!/usr/bin/env bash
# Regenerates node/boot/testdata/editenv/*: environment blocks written by
# GRUB's own grub-editenv, which node/boot's tests compare its codec with.
# Usage: hack/boot/grubenv-goldens.sh [path/to/grub-editenv]
# Without an argument it uses the copy e2e/boot's disk builder unpacks.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/../.."
root=_output/boot/root
editenv=${1:-$root/usr/bin/grub-editenv}
if [ ! -x "$editenv" ]; then
    echo "grub-editenv not found at $editenv: run 'go test ./e2e/boot' once (it unpacks GRUB) or pass its path" >&2
    exit 1
fi
out=node/boot/testdata/editenv
mkdir -p "$out"
e() { "$editenv" "$@"; }
f=$(mktemp)
trap 'rm -f "$f"' EXIT

rm -f "$f"; e "$f" create; cp "$f" "$out/01-create"
e "$f" set liken_trial=0 liken_proven=A; cp "$f" "$out/02-set-state"
e "$f" set liken_trial=1; cp "$f" "$out/03-arm"
e "$f" set saved_entry=x 'odd=a\b
c'; cp "$f" "$out/04-others"
e "$f" set liken_trial=0; cp "$f" "$out/05-clear"
e "$f" set liken_proven=B; cp "$f" "$out/06-commit"
e "$f" set 'odd=longer\value'; cp "$f" "$out/07-grow"
e "$f" set odd=s; cp "$f" "$out/08-shrink"
e "$f" unset saved_entry; cp "$f" "$out/09-unset"
echo "wrote $(ls "$out" | wc -l) blocks to $out"
