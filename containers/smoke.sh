#!/usr/bin/env bash
# The in-container smoke tests (tests/containers) against the built image, with tritonclient
# HTTP and gRPC, the metrics scrape, bad input, a read-only root with a mounted repository and
# the SIGTERM drain; then, when TRIDENT_GPU_CHECK_IMAGE names an image (containers/ci.sh builds
# Dockerfile.gpu on the CPU base as localhost/trident:gpu-check), the GPU install check.
# TRIDENT_ARCH and TRIDENT_SMOKE_TIME_SCALE: see tests/containers/conftest.py (containers/arm64.sh).
#   containers/smoke.sh                     # TRIDENT_IMAGE=localhost/trident:cpu
#   TRIDENT_IMAGE=trident:cpu containers/smoke.sh -k sigterm
# Needs the test extra in the active environment (pip install -e ".[test]").
set -euo pipefail
cd "$(dirname "$0")/.."
. containers/podman-env.sh
tests=(tests/containers/test_image.py)
# an image built with the onnxruntime extra (TRIDENT_IMAGE_EXTRAS, as given to build.sh) also
# serves an ONNX model (containers/arm64.sh)
if [[ ,${TRIDENT_IMAGE_EXTRAS:-}, == *,onnxruntime,* ]]; then
    tests+=(tests/containers/test_onnx_model.py)
fi
if [[ -n ${TRIDENT_GPU_CHECK_IMAGE:-} ]]; then
    tests+=(tests/containers/test_gpu_install.py)
fi
# every container a test starts carries this label: one left behind by an interrupted run goes
export TRIDENT_SMOKE_SESSION=$$
cleanup() {
    podman ps -aq --filter "label=trident-smoke=$TRIDENT_SMOKE_SESSION" | xargs -r podman rm --force --time 0 >/dev/null 2>&1 || true
}
trap cleanup EXIT
python -m pytest -q -s -p no:cacheprovider "${tests[@]}" "$@"
