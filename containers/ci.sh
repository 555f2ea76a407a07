#!/usr/bin/env bash
# The containers step of .ci/run (about 5-6 minutes on 2 busy cores, fresh):
#   1. containers/lint.sh, always (hadolint, check_manifests.py, the Helm chart's helm lint and
#      helm template per values file, kubernetes-validate --strict, the CRD schema check, checkov)
#   2. when podman can run a container here: the local Debian base, the CPU image, Dockerfile.gpu
#      built on that base (the GPU install check), and the in-container smoke tests against both.
#      When it cannot (no podman, no mmdebstrap, not root, no container runtime), step 2 prints
#      "NOT RUN" with the reason and the step ends with status 0 for the static checks only:
#      step 2 is then not run, not passed.
# Needs the test extra in the active environment (the smoke tests' clients).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
containers/lint.sh

not_run() {
    echo "containers: image build and in-container smoke tests NOT RUN: $1"
    echo "containers: static checks passed; build and smoke tests not run ($(( $(date +%s) - start )) s)"
    exit 0
}
for tool in podman buildah mmdebstrap; do
    command -v "$tool" >/dev/null || not_run "$tool is not installed (apt-get install podman buildah mmdebstrap runc)"
done
[[ $(id -u) == 0 ]] || not_run "mmdebstrap's root mode needs root"
. containers/podman-env.sh
podman info >/dev/null 2>&1 || not_run "podman info fails: $(podman info 2>&1 | tail -n 1)"
containers/base-rootfs.sh
if ! probe=$(podman run --rm localhost/trident-base:bookworm python3 --version 2>&1); then
    not_run "podman cannot run a container here: $(tail -n 1 <<<"$probe")"
fi
containers/build.sh
DOCKERFILE=containers/Dockerfile.gpu IMAGE=localhost/trident:gpu-check containers/build.sh
TRIDENT_IMAGE=localhost/trident:cpu TRIDENT_GPU_CHECK_IMAGE=localhost/trident:gpu-check containers/smoke.sh
echo "containers: static checks, image builds and smoke tests passed ($(( $(date +%s) - start )) s)"
