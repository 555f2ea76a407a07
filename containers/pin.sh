#!/usr/bin/env bash
# Resolves the images' pinned versions (containers/constraints.txt) from PyPI with a clean pip:
#   containers/pin.sh > containers/constraints.txt
# Run with the Python the CPU image uses (3.11) on linux/x86_64.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL
python3 -m venv "$work/venv" >&2
for extras in "onnxruntime,tree,otel,native" "gpu,onnxruntime-gpu,native"; do
    "$work/venv/bin/pip" install --dry-run --ignore-installed --quiet \
        --report "$work/report-${extras%%,*}.json" "${root}[${extras}]" >&2
done
"$work/venv/bin/pip" install --dry-run --ignore-installed --quiet \
    --report "$work/report-build.json" "setuptools>=68" wheel pip >&2
python3 - "$work" <<'PY'
import glob, json, sys
pins = {}
for name in sorted(glob.glob(f"{sys.argv[1]}/report-*.json")):
    for item in json.load(open(name))["install"]:
        meta = item["metadata"]
        project = meta["name"].lower().replace("_", "-")
        if project != "trident-inference":
            pins[project] = meta["version"]
print("""# The versions the images install (pip --constraint, also for the build's isolated environment
# through PIP_CONSTRAINT): trident's dependencies and those of the extras the images offer
# (onnxruntime, tree, otel on CPU; gpu, onnxruntime-gpu on GPU; native, the compiler of the protocol
# modules, in both builds), resolved together for CPython
# 3.11 on linux/x86_64. A package not listed here (an extra such as pytorch or openvino) installs
# unpinned. Regenerate after a dependency change: containers/pin.sh > containers/constraints.txt""")
print("\n".join(f"{k}=={v}" for k, v in sorted(pins.items())))
PY
