#!/usr/bin/env bash
# Regenerates protocol/generated/ (betterproto2 message classes) from protocol/*.proto.
# Needs the test extra (betterproto2-compiler) and grpcio-tools:  pip install grpcio-tools
#   bash protocol/generate.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
BIN=$(dirname "$(command -v "$PY")")
OUT="$HERE/generated"
rm -rf "$OUT" && mkdir -p "$OUT"
PATH="$BIN:$PATH" "$PY" -m grpc_tools.protoc -I "$HERE" --python_betterproto2_out="$OUT" --python_betterproto2_opt=client_generation=none "$HERE"/*.proto
# every generated folder is a package listed in pyproject.toml
find "$OUT" -type d -exec sh -c '[ -f "$1/__init__.py" ] || : > "$1/__init__.py"' _ {} \;
echo "generated into $OUT"
