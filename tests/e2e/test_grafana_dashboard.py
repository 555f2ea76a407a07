"""The Grafana dashboard beside the Helm chart (containers/helm/trident/dashboards/trident.json)
asks only for series trident serves.

Every PromQL expression of the dashboard (panel targets and template variables) is read with a
small PromQL scanner: the metric names it selects, the labels its matchers name, the labels it
groups by. A real trident is started (start_server) with the metric options the dashboard's
panels document (summary and histogram latencies, a response cache), an inference runs twice
(a cache miss, then a hit) so the per-model series exist, and /metrics is scraped: each metric
name must be a sample name there, and each label must be on that metric's samples or be one
Prometheus adds to every scraped series (namespace, pod, ...).

The GPU families (nv_gpu_*, nv_energy_consumption) are served only where NVML finds a GPU; on a
machine without one they are checked against the GPU collector's output through the same
exposition function /metrics uses, with an NVML stand-in (as tests/unit's host metrics tests).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import start_server
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from trident.observability.host_metrics import GpuMetrics
from trident.observability.metrics import exposition
from trident.options import EXAMPLE_REPOSITORY

DASHBOARD = Path(__file__).parents[2] / "containers" / "helm" / "trident" / "dashboards" / "trident.json"
#: labels Prometheus (the Prometheus Operator's ServiceMonitor) puts on every scraped series
TARGET_LABELS = {"namespace", "pod", "instance", "job", "service", "endpoint", "container"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "offset", "bool", "atan2"}
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<matchers>\{)
  | (?P<range>\[[^\]]*\])
  | (?P<open>\()
  | (?P<close>\))
  | (?P<op>[-+*/%^,]|==|!=|<=|>=|=~|!~|<|>)
""", re.VERBOSE)
_MATCHER = re.compile(r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*(?:,|$)""")


@dataclass
class Query:
    """What one PromQL expression asks of the server."""
    metrics: dict[str, set[str]] = field(default_factory=dict)  # metric -> labels its matchers name
    grouping: set[str] = field(default_factory=set)  # labels in by/without/on/ignoring/group_*


def parse_promql(expr: str) -> Query:
    """The metric names, matcher labels and grouping labels of ``expr`` (Grafana's $variables
    stay inside strings and ranges, where they do not matter). A malformed expression (an
    unknown character, unbalanced parentheses or braces) raises ValueError."""
    q = Query()
    pos, depth, pending_group = 0, 0, False
    tokens: list[tuple[str, str]] = []
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos:pos + 20]!r} in {expr!r}")
        kind = m.lastgroup or ""
        if kind == "matchers":
            end = expr.find("}", pos)
            if end < 0:
                raise ValueError(f"unclosed {{ in {expr!r}")
            tokens.append(("matchers", expr[pos + 1:end]))
            pos = end + 1
            continue
        if kind != "space":
            tokens.append((kind, m.group()))
        pos = m.end()
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ) in {expr!r}")
            pending_group = False
        elif kind == "ident" and text in GROUPING:
            pending_group = nxt[0] == "open" or pending_group
        elif kind == "ident" and pending_group:
            q.grouping.add(text)
        elif kind == "ident" and (nxt[0] == "open" or nxt[1] in GROUPING or text in KEYWORDS):
            continue  # a function or an aggregation (sum by (...) (...)), or an operator keyword
        elif kind == "ident":
            labels = q.metrics.setdefault(text, set())
            if nxt[0] == "matchers":
                labels |= _matcher_labels(nxt[1], expr)
    if depth != 0:
        raise ValueError(f"unbalanced ( in {expr!r}")
    return q


def _matcher_labels(text: str, expr: str) -> set[str]:
    labels, pos = set(), 0
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read the matchers {{{text}}} in {expr!r}")
        labels.add(m.group(1))
        pos = m.end()
    return labels


def dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression of the dashboard: where -> expression (panels in collapsed rows
    included; label_values(metric{...}, label) variables as ``metric{...}`` with ``label``
    grouped)."""
    found: dict[str, str] = {}

    def panels(items: list[dict[str, Any]]) -> None:
        for p in items:
            panels(p.get("panels", []))
            for t in p.get("targets", []):
                found[f"panel {p['title']!r} {t['refId']}"] = t["expr"]

    panels(dashboard["panels"])
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_]\w*)\)", v["query"]["query"])
            assert m, f"variable {v['name']}: not label_values(selector, label)"
            found[f"variable ${v['name']}"] = f"count by ({m.group(2)}) ({m.group(1)})"
    return found


def problems(queries: dict[str, str], served: dict[str, set[str]]) -> list[str]:
    """Each metric a query names that ``served`` (sample name -> its label names) lacks, and
    each label a query names that the metric's samples (or Prometheus's target labels) lack."""
    out = []
    for where, expr in queries.items():
        q = parse_promql(expr)
        if not q.metrics:
            out.append(f"{where}: selects no metric: {expr}")
        labels_here = set(TARGET_LABELS)
        for metric, labels in q.metrics.items():
            if metric not in served:
                out.append(f"{where}: {metric} is not served")
                continue
            labels_here |= served[metric]
            for label in labels - served[metric] - TARGET_LABELS:
                out.append(f"{where}: {metric} has no label {label}")
        for label in q.grouping - labels_here:
            out.append(f"{where}: groups by {label}, a label none of its metrics has")
    return out


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')


def served_samples(text: str) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry, read from the exposition lines as
    Prometheus stores them (histogram _bucket/_count/_sum and summary _count/_sum included;
    counters keep the bare names trident writes). The text must also parse as Prometheus's
    text format."""
    assert list(text_string_to_metric_families(text))
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        out.setdefault(m.group(1), set()).update(_LABEL.findall(m.group(2) or ""))
    return out


class NvmlStandIn:
    """The pynvml calls GpuMetrics makes, for one GPU (no GPU on CI machines)."""

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return b"GPU-0"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 << 30, used=3 << 30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 200_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 1_000_000


def gpu_samples() -> dict[str, set[str]]:
    gpu = GpuMetrics(NvmlStandIn())
    assert gpu.available
    gpu.poll()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(gpu)
    return served_samples(exposition(registry).decode())


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    repo = tmp_path_factory.mktemp("dashboard") / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub", ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    server = start_server("--metrics-config", "summary_latencies=true", "--metrics-config", "histogram_latencies=true",
                          "--cache-config", "local,size=1048576", repo=repo)
    try:
        a = np.ones((1, 16), np.float32)
        with httpclient.InferenceServerClient(server.http_url) as client:
            for _ in range(2):  # a miss, then a hit of the response cache
                inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
                for i in inputs:
                    i.set_data_from_numpy(a)
                np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
        response = httpx.get(server.metrics_url)
        assert response.status_code == 200
        return response.text
    finally:
        server.stop()


def test_every_metric_and_label_the_dashboard_names_is_served(metrics_text: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    served = served_samples(metrics_text)
    gpu = gpu_samples()
    named = {m for expr in queries.values() for m in parse_promql(expr).metrics}
    # the live server serves every family the dashboard names but the GPU ones where there is
    # no GPU; those are the GPU collector's, checked through the same exposition
    assert named - set(served) <= set(gpu)
    assert problems(queries, {**gpu, **served}) == []
    # the dashboard covers what operators scale and alert on
    assert {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
            "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model", "nv_cpu_utilization",
            "nv_cpu_memory_used_bytes", "nv_gpu_utilization", "nv_model_load_duration_secs"} <= named
    # the per-model series exist because an inference ran: the cache saw one miss and one hit
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    hits = [s.value for s in families["nv_cache_num_hits_per_model"].samples if s.labels["model"] == "add_sub"]
    assert hits == [1.0]


def test_the_hpa_panel_computes_what_prometheus_adapter_serves() -> None:
    """The queue-time panel is the adapter rule's query (containers/kubernetes/prometheus-adapter)
    with its placeholders filled in as prometheus-adapter fills them for a per-pod query."""
    import yaml

    adapter = yaml.safe_load((DASHBOARD.parents[3] / "kubernetes" / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = [r for r in adapter["rules"]["custom"] if r["name"]["as"] == "trident_queue_time_us"]
    expected = (" ".join(rule["metricsQuery"].split())
                .replace("<<.LabelMatchers>>", 'namespace=~"$namespace", pod=~"$pod"').replace("<<.GroupBy>>", "pod"))
    panel = [e for where, e in dashboard_queries(json.loads(DASHBOARD.read_text())).items() if "HPA metric" in where]
    assert panel == [expected]


@pytest.mark.parametrize(("expr", "problem"), [
    ("sum(rate(nv_inference_request_sucess[5m]))", "nv_inference_request_sucess is not served"),
    ('nv_inference_count{modle="add_sub"}', "nv_inference_count has no label modle"),
    ("sum by (gpu_uuid) (nv_inference_count)", "groups by gpu_uuid, a label none of its metrics has"),
    ("sum(rate(nv_inference_request_success_total[5m]))", "nv_inference_request_success_total is not served"),
    ("vector(1)", "selects no metric"),
])
def test_a_query_naming_what_is_not_served_is_reported(expr: str, problem: str) -> None:
    served = {"nv_inference_count": {"model", "version"}, "nv_inference_request_success": {"model", "version"}}
    found = problems({"q": expr}, served)
    assert any(problem in p for p in found), found


@pytest.mark.parametrize("expr", ["sum(rate(nv_inference_count[5m])", 'nv_inference_count{model="x"', "a ? b",
                                  'nv_inference_count{model~"x"}'])
def test_a_malformed_query_is_an_error(expr: str) -> None:
    with pytest.raises(ValueError):
        parse_promql(expr)


def test_the_scanner_reads_functions_grouping_and_matchers() -> None:
    q = parse_promql('sum by (model, le) (rate(nv_x_bucket{namespace=~"$ns", model="a,b"}[$__rate_interval])) '
                     '/ ignoring (pod) group_left sum(rate(nv_y[1m])) > bool 0.5e-3')
    assert q.metrics == {"nv_x_bucket": {"namespace", "model"}, "nv_y": set()}
    assert q.grouping == {"model", "le", "pod"}
