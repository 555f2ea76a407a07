"""Static checks of the Helm chart containers/helm/trident, with a real helm binary:

1. ``helm lint --strict`` with each values file (values.yaml is the chart's defaults).
2. ``helm template`` of each values file and of a few ``--set`` variants (the repository from a
   hostPath, from the image, the Grafana dashboard, everything optional off), each render
   checked by check_manifests.check_rendered (selectors, named ports, probes, drain timing,
   security context, scratch volumes, the repository, GPU requests, the HPA's metrics against
   the prometheus-adapter rules) and written to DIR for kubernetes-validate --strict.
3. The dashboard ConfigMap carries dashboards/trident.json unchanged.
4. Settings the chart must refuse are refused, each with its message (values.schema.json and
   the chart's own checks): nothing is silently ignored.

Usage: python containers/check_chart.py HELM --render-to DIR  (exit 1 on a finding)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from check_manifests import REQUIRED_KINDS, Findings, check_rendered

CHART = Path(__file__).resolve().parent / "helm" / "trident"
ALL_KINDS = (*REQUIRED_KINDS, "PodDisruptionBudget", "ServiceMonitor", "HorizontalPodAutoscaler", "NetworkPolicy")

#: name -> (helm arguments, GPU variant, kinds that must be there, repository from the image)
RENDERS: dict[str, tuple[list[str], bool, tuple[str, ...], bool]] = {
    "values": (["-f", "values.yaml"], False, ALL_KINDS, False),
    "values-gpu": (["-f", "values-gpu.yaml"], True, ALL_KINDS, False),
    "values-s3": (["-f", "values-s3.yaml"], False, ALL_KINDS, False),
    "values-initcontainer": (["-f", "values-initcontainer.yaml"], False, ALL_KINDS, False),
    "set-hostpath": (["--set", "modelRepository.source=hostPath"], False, ALL_KINDS, False),
    "set-image-dashboard": (["--set", "modelRepository.source=image", "--set", "grafana.dashboard.enabled=true",
                             "--set", "image.digest=sha256:" + "0" * 64], False, ALL_KINDS, True),
    "set-minimal": (["--set", "autoscaling.enabled=false,podDisruptionBudget.enabled=false,networkPolicy.enabled=false,"
                     "metrics.serviceMonitor.enabled=false,replicaCount=1"], False, REQUIRED_KINDS, False),
}

#: settings the chart refuses -> a part of its message
REFUSED: list[tuple[list[str], str]] = [
    (["--set", "modelRepository.source=nfs"], "value must be one of 'pvc', 'hostPath', 'initContainer', 'image', 's3'"),
    (["--set", "modelRepositry.source=s3"], "additional properties 'modelRepositry' not allowed"),
    (["--set", "autoscaling.queueTimeUs=1000"], "additional properties 'queueTimeUs' not allowed"),
    (["--set", "modelRepository.source=s3"], "modelRepository.s3.uri must be an s3:// URI"),
    (["--set", "modelRepository.source=s3,modelRepository.s3.uri=gs://bucket/models"],
     "modelRepository.s3.uri must be an s3:// URI"),
    (["--set", "modelRepository.source=initContainer"], "needs modelRepository.initContainer.image"),
    (["--set", "extraArgs={--http-port=9000}"], "extraArgs sets --http-port, which the chart sets itself"),
    (["--set", "extraArgs={--model-repository,/elsewhere}"], "extraArgs sets --model-repository"),
    (["-f", "values-s3.yaml", "--set", "extraArgs={--repository-poll-secs=5}"], "extraArgs sets --repository-poll-secs"),
    (["--set", "terminationGracePeriodSeconds=30"], "must exceed preStopSleepSeconds + exitTimeoutSeconds (35)"),
    (["--set", "autoscaling.minReplicas=5,autoscaling.maxReplicas=3"], "autoscaling.minReplicas (5) exceeds"),
    (["--set", "autoscaling.queueTimeMicroseconds=0,autoscaling.pendingRequests=0"], "autoscaling.enabled needs a metric"),
    (["--set", "autoscaling.enabled=false,replicaCount=1"], "protects nothing"),
    (["--set", "image.digest=latest"], "'/image/digest': 'latest' does not match pattern"),
    (["--set", "ports.http=70000"], "'/ports/http'"),
]


def helm(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=CHART, timeout=120)


def check_dashboard(where: str, docs: list[dict[str, Any]], findings: Findings) -> None:
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    findings.check(len(maps) == 1, f"{where}: expected the dashboard ConfigMap")
    if maps:
        findings.check(maps[0]["metadata"]["labels"].get("grafana_dashboard") == "1", f"{where}: grafana_dashboard label")
        shipped = json.loads((CHART / "dashboards" / "trident.json").read_text())
        findings.check(json.loads(maps[0]["data"]["trident.json"]) == shipped,
                       f"{where}: the ConfigMap's dashboard differs from dashboards/trident.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("helm", help="the helm binary")
    parser.add_argument("--render-to", type=Path, required=True, help="write each render here, for kubernetes-validate")
    args = parser.parse_args()
    findings = Findings()
    args.render_to.mkdir(parents=True, exist_ok=True)
    for values in sorted(CHART.glob("values*.yaml")):
        lint = helm(args.helm, "lint", "--strict", ".", "-f", values.name)
        summary = lint.stdout.strip().splitlines()[-1] if lint.stdout.strip() else ""
        print(f"helm lint --strict -f {values.name}: {summary}")
        findings.check(lint.returncode == 0, f"helm lint -f {values.name}:\n{lint.stdout}{lint.stderr}")
        findings.check(values.stem in RENDERS, f"{values.name} is not rendered by this check (add it to RENDERS)")
    for name, (helm_args, gpu, kinds, image_repository) in RENDERS.items():
        out = helm(args.helm, "template", "trident", ".", "--namespace", "trident", *helm_args)
        if out.returncode != 0:
            findings.append(f"helm template {' '.join(helm_args)}: {out.stderr.strip()}")
            continue
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        (args.render_to / f"helm-{name}.yaml").write_text(out.stdout)
        where = f"helm/trident {' '.join(helm_args)}"
        check_rendered(where, docs, findings, gpu=gpu, kinds=kinds, image_repository=image_repository)
        findings.check(all(d["metadata"].get("namespace") == "trident" for d in docs), f"{where}: objects outside the release namespace")
        if "grafana.dashboard.enabled=true" in helm_args:
            check_dashboard(where, docs, findings)
        else:
            findings.check(not any(d["kind"] == "ConfigMap" for d in docs), f"{where}: a dashboard ConfigMap though disabled")
        print(f"helm template {' '.join(helm_args)}: {len(docs)} objects: "
              + ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs))
    for helm_args, message in REFUSED:
        out = helm(args.helm, "template", "trident", ".", *helm_args)
        refused = out.returncode != 0 and message in out.stderr
        findings.check(refused, f"helm template {' '.join(helm_args)} was not refused with {message!r}:\n{out.stderr}")
        if refused:
            print(f"refused as it should be: {' '.join(helm_args)}: {message}")
    for f in findings:
        print(f"FINDING {f}", file=sys.stderr)
    print(f"check_chart: {len(RENDERS)} renders, {len(REFUSED)} refusals, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
