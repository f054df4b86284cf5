#!/usr/bin/env bash
# make lab: bring up a lab fleet (or reuse the running one), publish a new
# release, catalog it, point spec.version at it, and follow the rollout to
# the end. The lab keeps running afterwards. It stops at the first step that
# fails, saying which.
set -o errexit -o nounset -o pipefail -o errtrace
trap 'echo "make lab stopped: the step \"$BASH_COMMAND\" failed (hack/lab-demo.sh line $LINENO); its message is above." >&2' ERR
cd "$(dirname "$0")/.."
bin=$PWD/_output/bin
liken=$bin/liken
# kubectl of the control plane's own version, built by make build.
export PATH=$bin:$PATH
name=${LAB_NAME:-lab}

# A lab whose processes exited (the computer restarted) fails the status
# check; liken lab up then stops what is left of it and starts it again.
if "$liken" lab status --name "$name" >/dev/null 2>&1; then
    echo "Lab $name is already running: upgrading it again."
    KUBECONFIG=$("$liken" lab status --name "$name" | sed -n 's/^Kubeconfig: *//p' | head -n 1)
    if [ -z "$KUBECONFIG" ]; then
        echo "liken lab status --name $name printed no Kubeconfig line; run it to see what is wrong, or stop the lab with: $liken lab down --name $name" >&2
        exit 1
    fi
    export KUBECONFIG
else
    # Auto: every machine takes its turn without waiting for approve-reboot.
    # (An assignment, not eval "$(...)", so that a failed start stops here.)
    env=$("$liken" lab up --name "$name" --reboot-policy Auto)
    eval "$env"
fi
echo
kubectl get clusters -o wide
kubectl get machines -o wide

echo
echo "Publishing a new release into the lab's channel:"
entry=$("$liken" lab publish --name "$name")
echo "$entry"
version=$(sed -n 's/^- version: "\(.*\)"$/\1/p' <<<"$entry")
digest=$(sed -n 's/^  digest: \(sha256:[0-9a-f]*\)$/\1/p' <<<"$entry")

kubectl annotate cluster "$name" --overwrite liken.sh/check-releases="$(date -Is)" >/dev/null
echo
echo "Cataloguing $version and setting spec.version (one edit of the Cluster):"
kubectl patch cluster "$name" --type json -p "[
  {\"op\": \"add\", \"path\": \"/spec/releases/catalog/-\", \"value\": {\"version\": \"$version\", \"digest\": \"$digest\"}},
  {\"op\": \"replace\", \"path\": \"/spec/version\", \"value\": \"$version\"}]"
echo
"$liken" rollout status "$name" --timeout 15m
echo
kubectl get clusters -o wide
kubectl get machines -o wide
cat <<MSG

The lab keeps running. Use it (the kubectl in $bin is the control plane's version):
  export PATH=$bin:\$PATH KUBECONFIG=$KUBECONFIG
  kubectl get clusters -o wide; kubectl get machines -o wide
  $liken lab publish --name $name            # another release (--fault panic|no-rejoin|corrupt)
  $liken lab power cycle node-4 --name $name
Stop it:
  $liken lab down --name $name
MSG
