#!/usr/bin/env bash
# Installs what building and testing liken needs on a fresh Debian machine:
# squashfs-tools (release images), mmdebstrap, gcc and libseccomp-dev (make
# image: the Debian root, a static runc with seccomp), and the Debian
# packages the QEMU boot test unpacks (fetched by e2e/boot's disk builder).
# Go modules come from the module proxy during the build. Safe to run again.
set -o errexit -o nounset -o pipefail

need=()
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)

command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v kubectl >/dev/null; then
    echo "kubectl is missing: the tests drive the cluster with kubectl as a user does; install kubectl 1.32 or newer" >&2
    exit 1
fi
