#!/usr/bin/env bash
# Installs, on a Debian machine, the packages a make target needs and the
# machine lacks; make lab and make test run it first. Run as root it
# installs them with apt-get; run as another user it names them and the
# one command that installs them, and fails, before anything is built.
#
#   hack/install-deps.sh lab    what make lab needs: squashfs-tools (release
#                               images), e2fsprogs (the machines' disks)
#   hack/install-deps.sh test   (the default) all of make test's: the above,
#                               plus mmdebstrap, gcc, libseccomp-dev and
#                               pkg-config (make image: the Debian root, a
#                               static runc with seccomp), openssl, curl
#                               and nftables (node/changes' test of the
#                               kubernetes Service route on the kernel)
#
# kubectl and the control plane are built from the pinned sources in
# hack/kube (make build); Go modules come from the module proxy; the QEMU
# tests fetch QEMU, its firmware, GRUB and a kernel, and e2e/lab a
# Prometheus server, with apt-get download.
# Safe to run again: it installs nothing that is there.
set -o errexit -o nounset -o pipefail

target=${1:-test}
need=()
command -v mksquashfs >/dev/null || need+=(squashfs-tools)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
case $target in
lab) ;;
test)
    command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
    command -v gcc >/dev/null || need+=(gcc libc6-dev)
    [ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || need+=(libseccomp-dev)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v openssl >/dev/null || need+=(openssl)
    command -v curl >/dev/null || need+=(curl)
    command -v nft >/dev/null || need+=(nftables)
    ;;
*)
    echo "usage: hack/install-deps.sh [lab|test] (got \"$target\")" >&2
    exit 2
    ;;
esac
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "make $target needs Debian packages this machine lacks: ${need[*]}." >&2
    echo "Install them as root, then run make $target again:" >&2
    echo "  sudo $0 $target" >&2
    exit 1
fi
echo "Installing ${need[*]} (apt-get, for make $target)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
