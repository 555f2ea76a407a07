"""The KServe ClusterServingRuntimes (containers/kubernetes/kserve/) against KServe's serving
runtime contract, read as KServe reads them, and their command line through trident's own parser.

KServe exposes one port per predictor, REST or gRPC, and the port's name picks the protocol:
``http1`` (HTTP/1.1, the v2 REST binding) or ``h2c`` (HTTP/2 without TLS, gRPC; an h2c port makes
the InferenceService gRPC-only). So each runtime declares exactly one port, on the port trident
listens on for the protocol its ``protocolVersions`` names. The root file system is read-only, so
whatever trident and its libraries write (``/tmp``, ``$HOME``) must be a writable volume, and the
container's args must be ones ``trident serve`` (``tritonserver``) accepts, with nothing ignored.

``runtime_problems`` states the contract once; the shipped files have no problem, and each way of
breaking it (the original h2c port on the REST runtime, two ports, no /tmp, an unwritable HOME,
a flag trident refuses) is named.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trident.cli import build_parser, options_from_args
from trident.options import ServerOptions

KSERVE = Path(__file__).parents[3] / "containers" / "kubernetes" / "kserve"
#: the port name KServe and Knative read as the protocol -> the protocolVersions it carries
PORT_PROTOCOLS = {"http1": ["v2"], "h2c": ["grpc-v2"]}


def load(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((KSERVE / name).read_text()) if d]
    return doc


def runtimes() -> dict[str, dict[str, Any]]:
    return {p.name: load(p.name) for p in sorted(KSERVE.glob("clusterservingruntime*.yaml"))}


def trident_options(args: list[str]) -> ServerOptions:
    """The runtime's container args as the container runs them: ``tritonserver <flags>`` is
    ``trident serve <flags>`` (the same flags, pyproject's tritonserver script), parsed by
    trident's own parser. A refused flag or value exits 2 (SystemExit)."""
    assert args[0] == "tritonserver", f"the runtime runs {args[0]}, not tritonserver"
    return options_from_args(build_parser().parse_args(["serve", *args[1:]]))


def _writable_mount(path: str, container: dict[str, Any], volumes: dict[str, dict[str, Any]]) -> bool:
    """A volume mounted at ``path`` or above it, writable (an emptyDir, not mounted read-only)."""
    for m in container.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/")
        if (path == mount or path.startswith(mount + "/")) and not m.get("readOnly", False):
            volume = volumes.get(m["name"], {})
            if "emptyDir" in volume:
                return True
    return False


def runtime_problems(runtime: dict[str, Any]) -> list[str]:
    """Everything in ``runtime`` that KServe or trident would not do as the file says."""
    problems: list[str] = []
    spec = runtime["spec"]
    (c,) = spec["containers"]
    ports = c.get("ports", [])
    if len(ports) != 1:
        return [f"KServe exposes one port; {len(ports)} declared: {ports}"]
    (port,) = ports
    if port.get("name") not in PORT_PROTOCOLS:
        problems.append(f"port name {port.get('name')!r} is neither http1 (REST) nor h2c (gRPC)")
    elif spec["protocolVersions"] != PORT_PROTOCOLS[port["name"]]:
        problems.append(f"a port named {port['name']} serves {PORT_PROTOCOLS[port['name']]}, "
                        f"but protocolVersions is {spec['protocolVersions']}")
    try:
        opts = trident_options(c["args"])
    except SystemExit as e:
        return [*problems, f"trident refuses the args (exit {e.code})"]
    if opts.ignored_flags:
        problems.append(f"flags trident ignores: {opts.ignored_flags}")
    listening = {"http1": opts.http_port if opts.allow_http else None,
                 "h2c": opts.grpc_port if opts.allow_grpc else None}.get(port.get("name"))
    if port["containerPort"] != listening:
        problems.append(f"the declared {port.get('name')} port {port['containerPort']} is not where trident "
                        f"listens for it ({listening})")
    if opts.model_repositories != ["/mnt/models"]:
        problems.append(f"trident serves {opts.model_repositories}, not /mnt/models (KServe's storage initializer)")
    metrics_port = spec.get("annotations", {}).get("prometheus.kserve.io/port")
    if metrics_port is not None and int(metrics_port) != opts.metrics_port:
        problems.append(f"prometheus.kserve.io/port {metrics_port} is not --metrics-port {opts.metrics_port}")
    for probe_name in ("readinessProbe", "livenessProbe"):
        probe = c.get(probe_name, {})
        for kind in ("httpGet", "grpc", "tcpSocket"):
            if kind in probe and probe[kind]["port"] != port["containerPort"]:
                problems.append(f"{probe_name} uses port {probe[kind]['port']}, not the declared one")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    sc = c.get("securityContext", {})
    if sc.get("readOnlyRootFilesystem"):
        if not _writable_mount("/tmp", c, volumes):
            problems.append("read-only root file system and no writable volume at /tmp")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        home = env.get("HOME")
        if home is None or not _writable_mount(home, c, volumes):
            problems.append(f"read-only root file system and HOME={home} is not on a writable volume")
    if not (sc.get("runAsNonRoot") and sc.get("allowPrivilegeEscalation") is False
            and sc.get("capabilities", {}).get("drop") == ["ALL"]):
        problems.append(f"not non-root without privileges: {sc}")
    mounted = {m["name"] for m in c.get("volumeMounts", [])}
    if mounted - set(volumes):
        problems.append(f"mounts of undeclared volumes: {sorted(mounted - set(volumes))}")
    return problems


def test_each_runtime_declares_one_port_for_its_protocol_and_a_writable_tmp_and_home() -> None:
    found = runtimes()
    assert set(found) == {"clusterservingruntime.yaml", "clusterservingruntime-grpc.yaml"}
    for name, runtime in found.items():
        assert runtime_problems(runtime) == [], name
    rest, grpc = found["clusterservingruntime.yaml"], found["clusterservingruntime-grpc.yaml"]
    assert rest["spec"]["containers"][0]["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert rest["spec"]["protocolVersions"] == ["v2"]
    assert grpc["spec"]["containers"][0]["ports"] == [{"name": "h2c", "containerPort": 9000, "protocol": "TCP"}]
    assert grpc["spec"]["protocolVersions"] == ["grpc-v2"]
    # the same trident command in both: only the exposed port differs
    assert rest["spec"]["containers"][0]["args"] == grpc["spec"]["containers"][0]["args"]


def test_the_runtime_args_as_trident_parses_them() -> None:
    (c,) = load("clusterservingruntime.yaml")["spec"]["containers"]
    opts = trident_options(c["args"])
    assert (opts.http_port, opts.grpc_port, opts.metrics_port) == (8080, 9000, 8002)
    assert opts.allow_http and opts.allow_grpc and opts.allow_metrics
    assert opts.model_repositories == ["/mnt/models"]
    assert opts.exit_timeout_secs == 30
    assert opts.ignored_flags == []


def test_the_inference_services_name_a_runtime_of_their_protocol_and_declare_no_ports() -> None:
    """KServe merges an InferenceService's ports into the runtime's (keyed by containerPort):
    a port there would be a second one."""
    found = {r["metadata"]["name"]: r for r in runtimes().values()}
    for name in ("inferenceservice.yaml", "inferenceservice-grpc.yaml"):
        model = load(name)["spec"]["predictor"]["model"]
        assert "ports" not in model, name
        runtime = found[model["runtime"]]
        assert model["protocolVersion"] in runtime["spec"]["protocolVersions"], name
        assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}


def test_no_format_is_auto_selected() -> None:
    """KServe's webhook refuses a runtime that auto-selects a format at the priority of an
    installed one (kserve-tritonserver: triton, onnx, tensorrt at priority 1)."""
    for name, runtime in runtimes().items():
        assert not [f for f in runtime["spec"]["supportedModelFormats"] if f.get("autoSelect")], name


def _mutant(**changes: Any) -> dict[str, Any]:
    runtime = copy.deepcopy(load("clusterservingruntime.yaml"))
    c = runtime["spec"]["containers"][0]
    for key, value in changes.items():
        if key in ("volumes", "protocolVersions"):
            runtime["spec"][key] = value
        else:
            c[key] = value
    return runtime


@pytest.mark.parametrize(("runtime", "problem"), [
    # the runtime before this fix: its one port h2c (gRPC-only), REST declared in protocolVersions
    (_mutant(ports=[{"name": "h2c", "containerPort": 9000, "protocol": "TCP"}], protocolVersions=["v2", "grpc-v2"]),
     "a port named h2c serves ['grpc-v2'], but protocolVersions is ['v2', 'grpc-v2']"),
    (_mutant(ports=[{"name": "h2c", "containerPort": 9000}]), "a port named h2c serves ['grpc-v2'], but"),
    (_mutant(ports=[{"name": "http1", "containerPort": 8080}, {"name": "h2c", "containerPort": 9000}]),
     "KServe exposes one port; 2 declared"),
    (_mutant(ports=[]), "KServe exposes one port; 0 declared"),
    (_mutant(ports=[{"name": "http", "containerPort": 8080}]), "port name 'http' is neither http1"),
    (_mutant(ports=[{"name": "http1", "containerPort": 8000}]), "the declared http1 port 8000 is not where"),
    (_mutant(volumeMounts=[], volumes=[]), "no writable volume at /tmp"),
    (_mutant(env=[{"name": "HOME", "value": "/tmp"}], volumeMounts=[], volumes=[]),
     "HOME=/tmp is not on a writable volume"),
    (_mutant(env=[{"name": "HOME", "value": "/var/lib/trident"}]), "HOME=/var/lib/trident is not on a writable"),
    (_mutant(env=[]), "HOME=None is not on a writable volume"),
    (_mutant(volumeMounts=[{"name": "tmp", "mountPath": "/tmp", "readOnly": True}]), "no writable volume at /tmp"),
    (_mutant(args=["tritonserver", "--model-store=/mnt/models", "--http-port=8080", "--no-such-flag"]),
     "trident refuses the args (exit 2)"),
    (_mutant(args=["tritonserver", "--model-store=/mnt/models", "--http-port=rest"]),
     "trident refuses the args (exit 2)"),
    (_mutant(args=["tritonserver", "--model-store=/models", "--http-port=8080"]), "not /mnt/models"),
])
def test_a_runtime_that_breaks_the_contract_is_named(runtime: dict[str, Any], problem: str) -> None:
    problems = runtime_problems(runtime)
    assert any(problem in p for p in problems), problems


def test_a_refused_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        trident_options(["tritonserver", "--model-store=/mnt/models", "--no-such-flag=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-such-flag" in err
