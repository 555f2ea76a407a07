#!/usr/bin/env bash
# The local base image for Dockerfile.cpu where no container registry is reachable: a Debian
# root filesystem built with mmdebstrap from the Debian mirror (Python 3.11 from Debian), imported
# into podman's store as $BASE_IMAGE. Where a registry is reachable, Dockerfile.cpu's default base
# (the official python image) is used instead and this script is not needed.
#
#   containers/base-rootfs.sh            # builds localhost/trident-base:bookworm unless present
#   BASE_REBUILD=1 containers/base-rootfs.sh
#   ARCH=arm64 containers/base-rootfs.sh # localhost/trident-base:bookworm-arm64 (containers/arm64.sh)
#
# Needs root (or a user namespace mmdebstrap can use), mmdebstrap and podman; for an ARCH other
# than the host's, qemu-user-static registered with binfmt_misc (containers/arm64.sh checks).
set -euo pipefail
# shellcheck source=containers/podman-env.sh
. "$(dirname "$0")/podman-env.sh"
# ARCH: a Debian architecture (amd64, arm64); the host's by default, which keeps the tag unsuffixed
HOST_ARCH=$(dpkg --print-architecture)
ARCH=${ARCH:-$HOST_ARCH}
suffix=""
[[ $ARCH == "$HOST_ARCH" ]] || suffix="-$ARCH"
BASE_IMAGE=${BASE_IMAGE:-localhost/trident-base:bookworm$suffix}
SUITE=${SUITE:-bookworm}
# The Debian packages are the suite's current ones (with security updates) when it runs; for a
# fixed date point both mirrors at snapshot.debian.org, e.g.
#   MIRROR=http://snapshot.debian.org/archive/debian/20251101T000000Z \
#   SECURITY_MIRROR=http://snapshot.debian.org/archive/debian-security/20251101T000000Z
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
if [[ -z ${BASE_REBUILD:-} ]] && podman image exists "$BASE_IMAGE"; then
    echo "base-rootfs: $BASE_IMAGE present"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The packages the image needs at run time: Python with venv (ensurepip), CA certificates (s3://
# and https downloads from models), passwd (useradd for the non-root user), netbase (/etc/services).
# Documentation, man pages and locales are left out; apt's lists are removed by mmdebstrap.
nice -n 19 mmdebstrap --variant=apt --format=tar --architectures="$ARCH" \
    --include=python3,python3-venv,ca-certificates,passwd,netbase \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$work/rootfs.tar" "deb $MIRROR $SUITE main" "deb $SECURITY_MIRROR $SUITE-security main"
podman import --arch "$ARCH" --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
    "$work/rootfs.tar" "$BASE_IMAGE" >/dev/null
echo "base-rootfs: $BASE_IMAGE imported ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
