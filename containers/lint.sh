#!/usr/bin/env bash
# The static checks of the container files; no podman needed:
#   hadolint                     both Dockerfiles, no warnings (the remaining ignores are justified inline)
#   kubernetes-validate --strict every manifest file and each variant as rendered
#   check_manifests.py           kustomize render (cpu, gpu, s3) and cross-checks; KServe kinds
#                                against the KServe SDK's models
#   checkov                      the manifests and Dockerfiles (skips justified inline)
# The tools install from containers/requirements-lint*.txt into $LINT_VENV (default
# $TMPDIR/trident-containers-lint, reused while the requirements are unchanged).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LINT_VENV:-${TMPDIR:-/tmp}/trident-containers-lint}
stamp=$(cat containers/requirements-lint.txt containers/requirements-lint-nodeps.txt | sha256sum | cut -c1-16)
if [[ ! -f $venv/.stamp-$stamp ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r containers/requirements-lint.txt
    "$venv/bin/pip" install -q --no-deps -r containers/requirements-lint-nodeps.txt
    touch "$venv/.stamp-$stamp"
fi
bin=$venv/bin
rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
manifests=()
while IFS= read -r f; do manifests+=("$f"); done < <(find containers/kubernetes -name '*.yaml' ! -path '*/prometheus-adapter/*' | sort)

echo "== hadolint $("$bin/hadolint" --version | awk '{print $NF}')"
"$bin/hadolint" --failure-threshold style containers/Dockerfile.cpu containers/Dockerfile.gpu
echo "hadolint: 2 Dockerfiles, no findings"

echo "== check_manifests.py"
"$bin/python" containers/check_manifests.py --render-to "$rendered"

echo "== kubernetes-validate --strict $("$bin/kubernetes-validate" --version)"
# kinds without a schema in kubernetes-validate (Kustomization, ServiceMonitor, KServe's) are
# reported as WARN: check_manifests.py covers the Kustomizations and KServe kinds
"$bin/kubernetes-validate" --strict "${manifests[@]}" "$rendered"/*.yaml

echo "== checkov $("$bin/checkov" --version)"
"$bin/checkov" --quiet --compact --skip-download --framework kubernetes dockerfile \
    -d containers --skip-path prometheus-adapter
echo "lint.sh: all static checks passed"
