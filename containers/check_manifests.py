"""Static checks of containers/kubernetes that need no cluster, beyond kubernetes-validate:

1. Each variant's kustomization (cpu, gpu, s3) is rendered as kustomize would for the features
   these files use (resources: files and folders with their own kustomization, namespace,
   images newName/newTag/digest; any other key is an error, so nothing is silently left out),
   and the rendered set is checked for what ties it together: the Service, PDB, NetworkPolicy and
   ServiceMonitor select the Deployment's pods, named ports exist, the HPA scales the
   Deployment, the grace period covers preStop + --exit-timeout-secs, the pods run non-root
   with a read-only root file system, GPU variants request nvidia.com/gpu.
2. KServe's ClusterServingRuntimes and InferenceServices are checked field by field (unknown
   fields, types, required fields) against the KServe Python SDK's generated models and the
   Kubernetes client's (``pip install --no-deps kserve kubernetes``), read as source text: the
   SDKs are not imported; and against what KServe does with them: one declared port per runtime
   whose name matches its protocol (http1: v2 REST on --http-port, h2c: grpc-v2 on --grpc-port),
   no ports in the InferenceService (KServe merges them in), no autoSelect.

Usage: python containers/check_manifests.py [--render-to DIR]  (exit 1 on a finding; DIR gets
each variant's rendered YAML, for kubernetes-validate --strict).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent / "kubernetes"
VARIANTS = ("cpu", "gpu", "s3")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "namespace", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterServingRuntime"}


class Findings(list[str]):
    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


# -- 1. kustomize (the subset these files use) ---------------------------------------------------

def render(folder: Path, findings: Findings) -> list[dict[str, Any]]:
    kfile = folder / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    unknown = set(k) - KUSTOMIZATION_KEYS
    findings.check(not unknown, f"{kfile}: keys this check does not render: {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        path = (folder / entry).resolve()
        findings.check(path.exists(), f"{kfile}: resource {entry} does not exist")
        if path.is_dir():
            docs += render(path, findings)
        elif path.exists():
            findings.check(path.is_relative_to(folder), f"{kfile}: {entry} is outside the kustomization's folder")
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if "namespace" in k and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for image in k.get("images", []):
            for c in _containers(doc):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    new = image.get("newName", name)
                    c["image"] = f"{new}@{image['digest']}" if "digest" in image else f"{new}:{image.get('newTag', tag)}"
    return docs


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc.get("kind") == "Deployment":
        return doc["spec"]["template"]["spec"]["containers"]
    return []


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


#: the objects every kustomize variant renders; a Helm render may leave out the optional ones
#: (values that disable them), but never the Deployment and Service
REQUIRED_KINDS = ("Deployment", "Service")
OPTIONAL_KINDS = ("PodDisruptionBudget", "ServiceMonitor", "HorizontalPodAutoscaler", "NetworkPolicy")


def check_variant(variant: str, docs: list[dict[str, Any]], findings: Findings) -> None:
    """A kustomize variant: its own Namespace, every object in it, every kind present."""
    where = f"kubernetes/{variant}"
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    findings.check(len(namespaces) == 1, f"{where}: expected one Namespace")
    if namespaces:
        ns = namespaces[0]["metadata"]["name"]
        findings.check(all(d["metadata"].get("namespace") == ns for d in docs if d["kind"] not in CLUSTER_SCOPED),
                       f"{where}: objects outside the namespace {ns}")
    check_rendered(where, docs, findings, gpu=variant == "gpu", kinds=REQUIRED_KINDS + OPTIONAL_KINDS)


def check_rendered(where: str, docs: list[dict[str, Any]], findings: Findings, *, gpu: bool,
                   kinds: tuple[str, ...] = REQUIRED_KINDS, image_repository: bool = False) -> None:
    """What ties a rendered set together: selectors, named ports, probes, drain timing, security
    context, scratch volumes, the repository, resources, the HPA's metrics against the adapter's
    rules. ``kinds`` must each be there once; the optional kinds are checked when present.
    ``image_repository``: the repository may be the image's own /models (no volume)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    findings.check(len(names) == len(set(names)), f"{where}: duplicate objects {names}")
    for kind in (*kinds, *OPTIONAL_KINDS):
        count = len(by_kind.get(kind, []))
        findings.check(count == 1 if kind in kinds else count <= 1, f"{where}: expected one {kind}, found {count}")
    if any(f.startswith(f"{where}:") for f in findings):
        return
    dep = by_kind["Deployment"][0]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]

    def selects(selector: dict[str, str], what: str) -> None:
        findings.check(bool(selector) and all(labels.get(k) == v for k, v in selector.items()),
                       f"{where}: {what} selector {selector} does not select the Deployment's pods {labels}")

    selects(dep["spec"]["selector"]["matchLabels"], "Deployment")
    svc = by_kind["Service"][0]
    selects(svc["spec"]["selector"], "Service")
    if "PodDisruptionBudget" in by_kind:
        selects(by_kind["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"], "PodDisruptionBudget")
    if "NetworkPolicy" in by_kind:
        selects(by_kind["NetworkPolicy"][0]["spec"]["podSelector"]["matchLabels"], "NetworkPolicy")
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for p in svc["spec"]["ports"]:
        findings.check(p["targetPort"] in ports, f"{where}: Service port {p['name']} targets unknown {p['targetPort']}")
    for flag, name in (("--http-port", "http"), ("--grpc-port", "grpc"), ("--metrics-port", "metrics")):
        value = _flag(c["args"], flag)
        findings.check(value is None or int(value) == ports.get(name), f"{where}: {flag}={value} but port {name} is {ports.get(name)}")
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    findings.check(grpc.get("appProtocol") == "kubernetes.io/h2c", f"{where}: the gRPC port needs appProtocol h2c")
    svc_ports = {p["name"] for p in svc["spec"]["ports"]}
    if "ServiceMonitor" in by_kind:
        mon = by_kind["ServiceMonitor"][0]
        svc_labels = svc["metadata"]["labels"]
        findings.check(all(svc_labels.get(k) == v for k, v in mon["spec"]["selector"]["matchLabels"].items()),
                       f"{where}: the ServiceMonitor does not select the Service")
        for e in mon["spec"]["endpoints"]:
            findings.check(e["port"] in svc_ports, f"{where}: ServiceMonitor port {e['port']} is not a Service port")
    if "NetworkPolicy" in by_kind:
        allowed = {p["port"] for rule in by_kind["NetworkPolicy"][0]["spec"]["ingress"] for p in rule["ports"]}
        findings.check(set(ports.values()) <= allowed, f"{where}: the NetworkPolicy blocks some of {ports}")
    probes = {name: c.get(name) for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    for name, probe in probes.items():
        findings.check(probe is not None and probe["httpGet"]["port"] in ports, f"{where}: {name} missing or on an unknown port")
    if not any(f.startswith(f"{where}:") for f in findings):
        findings.check(probes["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready", f"{where}: readiness path")
        findings.check(probes["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", f"{where}: liveness path")
        startup = probes["startupProbe"]
        findings.check(startup["httpGet"]["path"] == "/v2/health/ready", f"{where}: startup path")
        findings.check(startup["periodSeconds"] * startup["failureThreshold"] >= 300,
                       f"{where}: the startup probe allows less than 5 minutes for model loads")
    exit_timeout = float(_flag(c["args"], "--exit-timeout-secs") or 30)
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    findings.check(grace > exit_timeout + float(pre_stop[-1]),
                   f"{where}: terminationGracePeriodSeconds {grace} <= preStop + --exit-timeout-secs")
    findings.check(pod["spec"].get("automountServiceAccountToken") is False, f"{where}: a service account token is mounted")
    for container in [*pod["spec"].get("initContainers", []), c]:
        sc = {**pod["spec"].get("securityContext", {}), **container.get("securityContext", {})}
        name = container["name"]
        findings.check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) > 0, f"{where}: {name} not non-root")
        findings.check(sc.get("readOnlyRootFilesystem") is True, f"{where}: {name}'s root file system writable")
        findings.check(sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"],
                       f"{where}: {name} keeps privilege escalation or capabilities")
        findings.check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: {name} without RuntimeDefault seccomp")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for path in ("/tmp", "/home/trident"):
        findings.check(path in mounts and "emptyDir" in volumes.get(mounts[path], {}), f"{where}: {path} is not an emptyDir")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    findings.check(env.get("HOME", "/home/trident") in mounts, f"{where}: HOME {env.get('HOME')} is not a mounted volume")
    findings.check(all(name in volumes for name in mounts.values()), f"{where}: a mount names no volume")
    repo = _flag(c["args"], "--model-repository") or ""
    findings.check(repo.startswith("s3://") or repo in mounts or (image_repository and repo == "/models"),
                   f"{where}: no model repository ({repo} is neither s3:// nor a mounted volume)")
    if repo in mounts:
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == repo)
        findings.check(mount.get("readOnly") is True, f"{where}: trident's repository volume is writable")
    res = c["resources"]
    findings.check({"cpu", "memory"} <= set(res.get("requests", {})) and {"cpu", "memory"} <= set(res.get("limits", {})),
                   f"{where}: cpu/memory requests and limits")
    gpus = res.get("limits", {}).get("nvidia.com/gpu")
    findings.check((gpus is not None) == gpu, f"{where}: nvidia.com/gpu {'missing' if gpu else 'set'}")
    if "HorizontalPodAutoscaler" in by_kind:
        hpa = by_kind["HorizontalPodAutoscaler"][0]["spec"]
        target = hpa["scaleTargetRef"]
        findings.check(target["kind"] == "Deployment" and target["name"] == dep["metadata"]["name"],
                       f"{where}: the HPA scales {target}, not the Deployment")
        metrics = [m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"]
        adapter = yaml.safe_load((ROOT / "prometheus-adapter" / "values.yaml").read_text())
        served = {r["name"]["as"] for r in adapter["rules"]["custom"]}
        findings.check(bool(metrics) and set(metrics) <= served, f"{where}: HPA metrics {metrics} not served by the adapter {served}")
        if "PodDisruptionBudget" in by_kind:
            pdb = by_kind["PodDisruptionBudget"][0]["spec"]
            findings.check(hpa["minReplicas"] > pdb.get("maxUnavailable", 0), f"{where}: the PDB allows every replica down")
        findings.check("replicas" not in dep["spec"] or dep["spec"]["replicas"] >= hpa["minReplicas"],
                       f"{where}: the Deployment's replicas are below the HPA's minimum")


# -- 2. KServe custom resources against the SDK's models ----------------------------------------

class Models:
    """openapi_types / attribute_map / required fields of the generated model classes, parsed
    from the kserve and kubernetes distributions' source files."""

    def __init__(self) -> None:
        self.types: dict[str, dict[str, str]] = {}  # class -> json key -> type
        self.required: dict[str, set[str]] = {}
        for dist, folder in (("kserve", "kserve/models"), ("kubernetes", "kubernetes/client/models")):
            path = Path(str(importlib.metadata.distribution(dist).locate_file(folder)))
            for source in path.glob("*.py"):
                self._parse(source.read_text())

    def _parse(self, text: str) -> None:
        tree = ast.parse(text)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            tables: dict[str, dict[str, str]] = {}
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name) \
                        and item.targets[0].id in ("openapi_types", "attribute_map"):
                    tables[item.targets[0].id] = ast.literal_eval(item.value)
            if len(tables) == 2:
                attr = tables["attribute_map"]
                self.types[node.name] = {attr[a]: t for a, t in tables["openapi_types"].items()}
                required = set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", ast.get_source_segment(text, node) or ""))
                self.required[node.name] = {attr[a] for a in required if a in attr}

    def check(self, value: Any, type_name: str, path: str, findings: Findings) -> None:
        if m := re.fullmatch(r"list\[(.+)\]", type_name):
            findings.check(isinstance(value, list), f"{path}: expected a list")
            for i, v in enumerate(value if isinstance(value, list) else []):
                self.check(v, m.group(1), f"{path}[{i}]", findings)
        elif m := re.fullmatch(r"dict\((\w+), (.+)\)", type_name):
            findings.check(isinstance(value, dict), f"{path}: expected a mapping")
            for k, v in (value if isinstance(value, dict) else {}).items():
                self.check(v, m.group(2), f"{path}.{k}", findings)
        elif type_name == "str":
            # quantities (resources) are int-or-string
            quantity = re.search(r"\.(limits|requests)\.[^.]+$", path) is not None
            findings.check(isinstance(value, str) or (quantity and isinstance(value, int | float)),
                           f"{path}: expected a string, got {value!r}")
        elif type_name == "int":
            findings.check(isinstance(value, int) and not isinstance(value, bool), f"{path}: expected an integer")
        elif type_name == "bool":
            findings.check(isinstance(value, bool), f"{path}: expected true/false")
        elif type_name in ("object", "float", "datetime"):
            pass
        elif type_name in self.types:
            if not isinstance(value, dict):
                findings.append(f"{path}: expected a {type_name} object")
                return
            fields = self.types[type_name]
            for k, v in value.items():
                if k not in fields:
                    findings.append(f"{path}.{k}: unknown field of {type_name}")
                else:
                    self.check(v, fields[k], f"{path}.{k}", findings)
            for k in self.required.get(type_name, set()) - set(value):
                findings.append(f"{path}: {type_name} requires {k}")
        else:
            findings.append(f"{path}: type {type_name} unknown to this check")


KSERVE = {("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
          ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService"}


def check_kserve(findings: Findings) -> list[str]:
    models = Models()
    checked = []
    runtimes = {}
    services = []
    for path in sorted((ROOT / "kserve").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            key = (doc.get("apiVersion"), doc.get("kind"))
            findings.check(key in KSERVE, f"{path.name}: {key} is not a KServe kind this check knows")
            if key in KSERVE:
                models.check(doc, KSERVE[key], f"{path.name}:{doc['kind']}", findings)
                checked.append(f"{path.name}: {doc['kind']} {doc['metadata']['name']}")
                if doc["kind"] == "ClusterServingRuntime":
                    runtimes[doc["metadata"]["name"]] = doc
                else:
                    services.append(doc)
    for isvc in services:
        name = isvc["metadata"]["name"]
        model = isvc["spec"]["predictor"]["model"]
        runtime = runtimes.get(model.get("runtime"))
        findings.check(runtime is not None, f"InferenceService {name}: no runtime {model.get('runtime')}")
        # KServe merges the predictor's ports into the runtime's (keyed by containerPort) and
        # exposes one: ports here would make two
        findings.check("ports" not in model, f"InferenceService {name}: ports belong to the runtime (one port)")
        if runtime:
            formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
            findings.check(model["modelFormat"]["name"] in formats, f"InferenceService {name}: format not the runtime's")
            findings.check(model.get("protocolVersion") in runtime["spec"]["protocolVersions"],
                           f"InferenceService {name}: protocolVersion not the runtime's")
    for rname, runtime in runtimes.items():
        (c,) = runtime["spec"]["containers"]
        findings.check(c["name"] == "kserve-container", "KServe expects the container kserve-container")
        findings.check(_flag(c["args"], "--model-store") == "/mnt/models" or _flag(c["args"], "--model-repository") == "/mnt/models",
                       "the runtime must serve /mnt/models (KServe's storage initializer)")
        findings.check(_flag(c["args"], "--http-port") == "8080" and _flag(c["args"], "--grpc-port") == "9000",
                       "KServe's ports: REST 8080, gRPC 9000")
        # one exposed port per predictor; its name is the protocol (http1 REST, h2c gRPC)
        ports = c.get("ports", [])
        versions = runtime["spec"]["protocolVersions"]
        findings.check(len(ports) == 1, f"{rname}: KServe exposes one port, the runtime declares {len(ports)}")
        if len(ports) == 1:
            expected = {"http1": (["v2"], "--http-port"), "h2c": (["grpc-v2"], "--grpc-port")}.get(ports[0].get("name"))
            findings.check(expected is not None, f"{rname}: port name {ports[0].get('name')} is neither http1 nor h2c")
            if expected:
                findings.check(versions == expected[0], f"{rname}: a {ports[0]['name']} port serves {expected[0]}, not {versions}")
                findings.check(str(ports[0]["containerPort"]) == _flag(c["args"], expected[1]),
                               f"{rname}: the declared port is not trident's {expected[1]}")
        findings.check(not any(f.get("autoSelect") for f in runtime["spec"]["supportedModelFormats"]),
                       f"{rname}: autoSelect clashes with kserve-tritonserver's priorities (KServe's webhook refuses it)")
    return checked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render-to", type=Path, help="write each variant's rendered manifests here")
    args = parser.parse_args()
    findings = Findings()
    for variant in VARIANTS:
        docs = render(ROOT / variant, findings)
        check_variant(variant, docs, findings)
        if args.render_to:
            args.render_to.mkdir(parents=True, exist_ok=True)
            (args.render_to / f"{variant}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
        print(f"kubernetes/{variant}: rendered {len(docs)} objects: " + ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs))
    for line in check_kserve(findings):
        print(f"kubernetes/kserve/{line}: fields, types and required fields match the KServe SDK")
    for f in findings:
        print(f"FINDING {f}", file=sys.stderr)
    print(f"check_manifests: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
