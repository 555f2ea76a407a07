#!/usr/bin/env bash
# The GPU check (tests/bench/bench_gpu_backends.py) as one prepared run on a lent GPU machine,
# which has Python 3.12 with torch, torchvision, onnxruntime (CPU), cuda-python, pynvml and pytest
# but no network: what trident needs beside them travels as wheels in .whl/ (git-ignored).
#
#   tests/bench/gpu_check.sh fetch        # here: .whl/ with trident's wheel and its missing
#                                         # dependencies for CPython 3.12 on x86_64 (~3 MB)
#   tests/bench/gpu_check.sh run [ARGS]   # there (carry .whl): install them into /tmp/site, run
#                                         # the checks (ARGS go to the script, default
#                                         # --time-limit 420), results to tests/bench/results/
#                                         # and $OUT when set
#
# Carried wheels are pure Python except two small compiled ones (orjson, trident's JSON codec,
# and python-rapidjson, tritonclient's): tensorrt and onnxruntime-gpu cannot be carried (over the
# 64 MiB a run carries) nor fetched there, so their checks skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.whl
# what the machine's image lacks (tests/bench/gpu_check.sh fetch resolves them against it)
NEEDED="tritonclient==2.73.0 betterproto2==0.10.0 trio==0.35.0 trio-util==0.8.0 h2==4.4.1 hpack==4.2.0
hyperframe==6.1.0 hypercorn==0.18.0 orjson==3.13.0 python-rapidjson==1.25 sniffio==1.3.1 wsproto==1.3.2
async-generator==1.10 outcome==1.3.0.post0 priority==2.0.0 tzdata==2026.6"
case ${1:-} in
fetch)
    grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >>.git/info/exclude
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
             manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
    # shellcheck disable=SC2086  # a list of requirements
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$WHEELS" $NEEDED
    # trident itself, pure Python (the protocol modules uncompiled)
    python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$WHEELS" .
    du -sh "$WHEELS"
    ;;
run)
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    args=("$@")
    [[ ${#args[@]} -gt 0 ]] || args=(--time-limit 420)
    status=0
    python3 tests/bench/bench_gpu_backends.py "${args[@]}" || status=$?
    if [[ -n ${OUT:-} ]]; then
        cp tests/bench/results/*-gpu-backends.* "$OUT"/ 2>/dev/null || true
    fi
    exit "$status"
    ;;
*)
    echo "usage: tests/bench/gpu_check.sh fetch | run [bench_gpu_backends.py arguments]" >&2
    exit 2
    ;;
esac
