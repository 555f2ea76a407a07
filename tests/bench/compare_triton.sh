#!/usr/bin/env bash
# Side-by-side figures against the real Triton (Python backend) on this machine, in one run:
# trident and tritonserver serve the same repository (identity_fp32, add_sub), each pinned to CPU 0,
# loaded from CPU 1 by wrk (HTTP JSON / binary), h2load (gRPC) and tritonclient aio.
#   bash ../shared/bench/setup.sh                      # once: wrk, h2load, Triton, tritonclient venvs
#   bash tests/bench/compare_triton.sh OUT [CASES]      # CASES default addsub,small,large
# Results: OUT/table.md (req/s, p50/p99, server CPU ms per request per case).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=${BENCH:-$HERE/../../../shared/bench}
if [ ! -f "$BENCH/run_all.sh" ]; then
  echo "compare_triton.sh needs the shared bench scripts (run_all.sh, setup.sh, run_triton.sh):" \
       "not found in $BENCH; set BENCH=/path/to/shared/bench" >&2
  exit 2
fi
OUT=${1:?usage: compare_triton.sh OUT [CASES]}
TRIDENT=${TRIDENT:-$(command -v trident || echo "$HERE/../../.venv/bin/trident")}
SERVERS=${SERVERS:-"trident triton"} TRIDENT=$TRIDENT CASES=${2:-addsub,small,large} \
  DURATION=${DURATION:-10} QUIET_WAIT=${QUIET_WAIT:-30} bash "$BENCH/run_all.sh" "$OUT"
