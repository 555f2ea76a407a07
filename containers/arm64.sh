#!/usr/bin/env bash
# The arm64 (aarch64) image, built and smoke-tested on an amd64 host under qemu-user-static
# emulation, with the same scripts as the native image (ARCH=arm64 for each):
#   1. base-rootfs.sh: the Debian base of that architecture (mmdebstrap --architectures=arm64)
#   2. build.sh: Dockerfile.cpu for linux/arm64 with EXTRAS (default onnxruntime: it has an
#      aarch64 wheel), the protocol modules compiled by an emulated gcc
#   3. smoke.sh: the in-container smoke tests against it (tritonclient HTTP and gRPC, metrics,
#      bad input, read-only root, SIGTERM drain) plus an ONNX model served by onnxruntime
# It prints the time of each step, the image size and the start-up time under emulation.
#
#   containers/arm64.sh                      # as root; about 35-45 minutes on 2 busy cores
#   EXTRAS=onnxruntime,tree containers/arm64.sh
#   containers/arm64.sh -k onnx              # pytest arguments go to smoke.sh
#
# Not part of .ci/run: the emulated build alone takes longer than the rest of CI. Needs what
# containers/ci.sh needs (podman, buildah, mmdebstrap, runc, root) and Debian's qemu-user-static
# and binfmt-support (apt-get install qemu-user-static binfmt-support), which register the
# aarch64 interpreter with binfmt_misc; its "F" flag lets it run inside containers.
# Needs the test extra in the active environment (the smoke tests' clients, onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
export ARCH=${ARCH:-arm64}
export EXTRAS=${EXTRAS-onnxruntime}
# onnxruntime from 1.28 (1.28.0, 1.32.0 tried) dies of SIGSEGV on import under Debian bookworm's
# qemu-user 7.2 (1.25.1, 1.23.2, 1.22.1, 1.21.1 run), so the emulated image pins the newest one
# found to run; on arm64 hardware build.sh installs constraints.txt's. PINS= lifts it.
export PINS=${PINS-onnxruntime==1.25.1}
declare -A qemu_names=([arm64]=aarch64 [armhf]=arm [ppc64el]=ppc64le [s390x]=s390x [riscv64]=riscv64)
machine=${qemu_names[$ARCH]:-}
[[ -n $machine ]] || { echo "arm64.sh: no qemu interpreter known for ARCH=$ARCH" >&2; exit 2; }
if [[ $ARCH == "$(dpkg --print-architecture)" ]]; then
    echo "arm64.sh: this host is $ARCH already: use containers/build.sh and containers/smoke.sh" >&2
    exit 2
fi
fail() { echo "arm64.sh: $1" >&2; exit 1; }
for tool in podman buildah mmdebstrap; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (apt-get install podman buildah mmdebstrap runc)"
done
[[ $(id -u) == 0 ]] || fail "needs root (mmdebstrap's root mode, binfmt_misc)"
binfmt=/proc/sys/fs/binfmt_misc
if [[ ! -e $binfmt/status ]]; then
    # a host (or a container) where binfmt_misc is not mounted yet: mount it and let
    # binfmt-support register the interpreters it knows
    mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || fail "binfmt_misc is not mounted and cannot be (mount -t binfmt_misc binfmt_misc $binfmt)"
    command -v update-binfmts >/dev/null && update-binfmts --enable >/dev/null 2>&1 || true
fi
entry=$binfmt/qemu-$machine
[[ -f $entry ]] || fail "no qemu-$machine interpreter in $binfmt (apt-get install qemu-user-static binfmt-support)"
[[ $(head -n 1 "$entry") == enabled ]] || fail "$entry is disabled (update-binfmts --enable qemu-$machine)"
grep -q '^flags:.*F' "$entry" || fail "$entry lacks the F (fix binary) flag: containers cannot find the interpreter"
echo "arm64.sh: $(grep '^interpreter' "$entry") ($(grep '^flags' "$entry"))"

. containers/podman-env.sh
start=$(date +%s)
step=$start
lap() { local now; now=$(date +%s); echo "arm64.sh: $1 in $((now - step)) s"; step=$now; }
containers/base-rootfs.sh
lap "base (localhost/trident-base:bookworm-$ARCH)"
containers/build.sh
lap "image build (EXTRAS=$EXTRAS${PINS:+, PINS=$PINS})"
IMAGE=localhost/trident:cpu-$ARCH
inside=$(podman run --rm "$IMAGE" uname -m)
[[ $inside == "$machine" ]] || fail "the image runs as $inside, not $machine"
echo "arm64.sh: $IMAGE runs as $inside under emulation; $(podman image inspect --format '{{.Os}}/{{.Architecture}}, {{.Size}} bytes' "$IMAGE")"
TRIDENT_IMAGE=$IMAGE TRIDENT_ARCH=$ARCH TRIDENT_IMAGE_EXTRAS=$EXTRAS TRIDENT_SMOKE_TIME_SCALE=${TRIDENT_SMOKE_TIME_SCALE:-10} \
    containers/smoke.sh "$@"
lap "smoke tests"
echo "arm64.sh: base, image and smoke tests passed for $ARCH ($(( $(date +%s) - start )) s)"
