#!/usr/bin/env bash
# Builds the CPU image with podman (buildah) from the repository root, here without a registry:
#   containers/build.sh                 # localhost/trident:cpu on localhost/trident-base:bookworm
#   IMAGE=... BASE=python:3.11.14-slim-bookworm EXTRAS=onnxruntime containers/build.sh
#   DOCKERFILE=containers/Dockerfile.gpu IMAGE=localhost/trident:gpu-check containers/build.sh
#   ARCH=arm64 EXTRAS=onnxruntime containers/build.sh    # localhost/trident:cpu-arm64 (containers/arm64.sh)
# BASE unset builds the local Debian base first (containers/base-rootfs.sh). The host's CA bundle
# reaches pip in the build stage (a TLS-inspecting proxy on the way to PyPI), never the image.
# ARCH (a Debian architecture, default the host's) other than the host's builds for that platform
# under qemu-user-static emulation (binfmt_misc), on the base of that architecture; its tags get
# the suffix -ARCH. Runs at nice 19.
set -euo pipefail
cd "$(dirname "$0")/.."
. containers/podman-env.sh
HOST_ARCH=$(dpkg --print-architecture)
export ARCH=${ARCH:-$HOST_ARCH}
suffix=""
[[ $ARCH == "$HOST_ARCH" ]] || suffix="-$ARCH"
DOCKERFILE=${DOCKERFILE:-containers/Dockerfile.cpu}
IMAGE=${IMAGE:-localhost/trident:cpu$suffix}
CONTEXT=${CONTEXT:-.}  # the source tree to build (default: this working tree)
if [[ -z ${BASE:-} ]]; then
    containers/base-rootfs.sh
    BASE=localhost/trident-base:bookworm$suffix
fi
# the host's CA bundle and a pip.conf naming it, in a folder mounted into the RUN steps
# (/run/trident-build, left as an empty folder) and named by the build stage's PIP_CONFIG_FILE
mounts=()
ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
if [[ -f $ca ]]; then
    pipdir=$(mktemp -d)
    trap 'rm -rf "$pipdir"' EXIT
    cp "$ca" "$pipdir/ca.crt"
    printf '[global]\ncert = /run/trident-build/ca.crt\n' >"$pipdir/pip.conf"
    chmod -R a+rX "$pipdir"
    mounts=(-v "$pipdir:/run/trident-build:ro" --build-arg PIP_CONFIG_FILE=/run/trident-build/pip.conf)
fi
# EXTRAS unset: the Dockerfile's default (none on CPU, gpu on GPU)
extras=()
if [[ -n ${EXTRAS+set} ]]; then extras=(--build-arg "EXTRAS=$EXTRAS"); fi
# PINS: space-separated NAME==VERSION replacing those constraints (containers/install.sh)
if [[ -n ${PINS:-} ]]; then extras+=(--build-arg "PINS=$PINS"); fi
start=$(date +%s)
nice -n 19 podman build --format docker --platform "linux/$ARCH" -f "$DOCKERFILE" \
    --ignorefile "$DOCKERFILE.dockerignore" --build-arg "BASE=$BASE" "${extras[@]}" "${mounts[@]}" \
    -t "$IMAGE" "$CONTEXT"
echo "build.sh: $IMAGE built in $(( $(date +%s) - start )) s, $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
