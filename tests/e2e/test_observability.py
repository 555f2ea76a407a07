"""Observability end to end: /metrics after real inferences over HTTP and gRPC, live logging
changes, trace files.

The ``gated`` Python model holds a request with X[0] == 1 until a gate file exists (a held
batch, so queued requests are pending), fails X[0] < 0 (reason BACKEND), doubles X otherwise.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

GATED_CONFIG = '''
name: "gated"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "gate" value: { string_value: "GATE" } }
metric_tags { key: "team" value: "vision" }
'''

GATED_MODEL = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] == 1:
                open(self.gate + ".running", "w").close()
                while not os.path.exists(self.gate):
                    time.sleep(0.01)
            if x[0] < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
'''

WAIT_S = 30.0


def gated_repo(root: Path) -> tuple[Path, Path]:
    gate = root / "gate"
    model = root / "repo" / "gated"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(GATED_CONFIG.replace("GATE", str(gate)))
    (model / "1" / "model.py").write_text(GATED_MODEL)
    return root / "repo", gate


def scrape(server) -> dict[str, list]:
    response = httpx.get(server.metrics_url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def value(families: dict[str, list], sample_name: str, **labels: str) -> float:
    name = sample_name
    for suffix in ("_count", "_sum", "_bucket"):
        if name not in families and name.endswith(suffix):
            name = name[: -len(suffix)]
    family = families[name]
    found = [s.value for s in family if s.name in (sample_name, sample_name + "_total")
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (sample_name, labels, family)
    return found[0]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def x_input(mod, v: int):
    t = mod.InferInput("X", [1], "INT32")
    t.set_data_from_numpy(np.array([v], dtype=np.int32))
    return t


def test_metrics_families_labels_and_deltas_over_http_and_grpc(server_factory, tmp_path):
    repo, gate = gated_repo(tmp_path)
    server = server_factory("--metrics-config", "summary_latencies=true", "--metrics-config",
                            "histogram_latencies=true", "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01",
                            repo=repo)
    m = {"model": "gated", "version": "1", "_team": "vision"}
    before = scrape(server)
    assert value(before, "nv_inference_request_success", **m) == 0
    assert value(before, "nv_model_load_duration_secs", **m) > 0
    assert "nv_cpu_utilization" in before and "nv_cpu_memory_total_bytes" in before

    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for v in (2, 3, 4):
        out = http.infer("gated", [x_input(httpclient, v)]).as_numpy("Y")
        assert out.tolist() == [2 * v]
    for v in (5, 6):
        assert grpc.infer("gated", [x_input(grpcclient, v)]).as_numpy("Y").tolist() == [2 * v]
    with pytest.raises(InferenceServerException, match="negative input"):
        http.infer("gated", [x_input(httpclient, -1)])

    after = scrape(server)
    assert value(after, "nv_inference_request_success", **m) == 5
    assert value(after, "nv_inference_request_failure", reason="BACKEND", **m) == 1
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert value(after, "nv_inference_request_failure", reason=reason, **m) == 0
    assert value(after, "nv_inference_count", **m) == 6
    assert value(after, "nv_inference_exec_count", **m) == 6
    assert value(after, "nv_inference_pending_request_count", **m) == 0
    for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert value(after, f"nv_inference_{family}_duration_us", **m) >= 0
        assert value(after, f"nv_inference_{family}_summary_us", quantile="0.5", **m) >= 0
        assert value(after, f"nv_inference_{family}_summary_us_count", **m) == 5
    assert value(after, "nv_inference_request_duration_us", **m) > 0
    assert value(after, "nv_inference_first_response_histogram_ms_count", **m) == 5
    assert value(after, "nv_inference_first_response_histogram_ms_bucket", le="+Inf", **m) == 5
    assert {s.labels["le"] for s in after["nv_inference_first_response_histogram_ms"]
            if "le" in s.labels} == {"100.0", "500.0", "2000.0", "5000.0", "+Inf"}

    # a held batch: X=1 runs (gated), three more queue; one of them is cancelled by its client
    held = grpc.async_infer("gated", [x_input(grpcclient, 1)], callback=lambda result, error: None)
    wait_for(lambda: Path(str(gate) + ".running").exists(), "the held run")
    results: list = []
    queued = [grpc.async_infer("gated", [x_input(grpcclient, 7 + i)],
                               callback=lambda result, error: results.append((result, error))) for i in range(3)]
    wait_for(lambda: value(scrape(server), "nv_inference_pending_request_count", **m) == 3, "3 pending requests")
    queued[0].cancel()
    wait_for(lambda: value(scrape(server), "nv_inference_request_failure", reason="CANCELED", **m) == 1,
             "the cancelled request")
    gate.touch()
    wait_for(lambda: len(results) == 3, "the queued requests")
    wait_for(lambda: value(scrape(server), "nv_inference_request_success", **m) == 8, "8 successes")
    final = scrape(server)
    assert value(final, "nv_inference_pending_request_count", **m) == 0
    assert value(final, "nv_inference_request_failure", reason="CANCELED", **m) == 1
    assert value(final, "nv_inference_exec_count", **m) == 9  # the cancelled request never ran
    assert sorted(error is None for _, error in results) == [False, True, True]
    held.cancel()
    http.close()
    grpc.close()


def test_metrics_endpoint_is_get_only_and_can_be_disabled(server_factory, tmp_path):
    server = server_factory()
    assert httpx.post(server.metrics_url).status_code == 405
    assert httpx.get(server.metrics_url.replace("/metrics", "/other")).status_code == 404
    off = server_factory("--allow-metrics=false")
    assert "Metrics Service" not in off.ports


def test_counter_latencies_false_drops_duration_counters(server_factory):
    server = server_factory("--metrics-config", "counter_latencies=false")
    families = scrape(server)
    assert "nv_inference_request_success" in families
    assert "nv_inference_request_duration_us" not in families


def test_bad_metrics_and_trace_config_fail_at_startup(tmp_path):
    from e2e.conftest import start_server

    for flags in (("--metrics-config", "summary_latencies=maybe"), ("--trace-config", "level=LOUD"),
                  ("--trace-config", "opentelemetry,colour=blue")):
        with pytest.raises(RuntimeError, match="trident exited with 2") as e:
            start_server(*flags)
        assert "metrics-config" in str(e.value) or "trace-config" in str(e.value)


def test_logging_changes_take_effect_live(server_factory):
    server = server_factory("--model-control-mode", "explicit", "--load-model", "add_sub")
    url = f"http://{server.http_url}/v2/logging"
    assert httpx.get(url).json()["log_info"] is True
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # the LogSettings RPC turns info messages off: the unload line is not written
    settings = grpc.update_log_settings({"log_info": False})
    assert settings.settings["log_info"].bool_param is False
    assert httpx.get(url).json()["log_info"] is False
    http.unload_model("add_sub")
    # POST /v2/logging turns them back on in ISO8601: the load line appears in that format
    body = httpx.post(url, json={"log_info": True, "log_format": "ISO8601", "log_verbose_level": 1}).json()
    assert body["log_info"] is True and body["log_format"] == "ISO8601" and body["log_verbose_level"] == 1
    http.load_model("add_sub")
    wait_for(lambda: "successfully loaded 'add_sub'" in server.log().split("Started Metrics Service")[-1],
             "the load line")
    log = server.log()
    assert "successfully unloaded 'add_sub'" not in log
    line = next(x for x in log.splitlines() if "successfully loaded 'add_sub'" in x and x.count("loaded") == 1
                and x[:4].isdigit())
    assert line[4] == "-" and line[10] == "T" and " I " in line
    http.close()
    grpc.close()


def test_load_and_unload_log_one_line_each_with_duration(server_factory):
    server = server_factory("--model-control-mode", "explicit", "--load-model", "add_sub")
    http = httpclient.InferenceServerClient(server.http_url)
    http.unload_model("add_sub")
    wait_for(lambda: "successfully unloaded 'add_sub' in " in server.log(), "the unload line")
    log = server.log()
    assert log.count("successfully loaded 'add_sub'") == 1
    assert " s" in log.split("successfully loaded 'add_sub'")[1].splitlines()[0]
    http.close()


def test_trace_file_has_one_entry_per_sampled_request(server_factory, tmp_path):
    trace = tmp_path / "trace.json"
    server = server_factory("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=2",
                            "--trace-config", f"triton,file={trace}", "--trace-config", "triton,log-frequency=2")
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    for i in range(4):
        http.infer("add_sub", [a, b], request_id=f"h{i}")
    for i in range(4):
        ga = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        ga.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        gb = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        gb.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        grpc.infer("add_sub", [ga, gb], request_id=f"g{i}")
    # 8 requests at rate 2: 4 traces, two files of 2 (log_frequency 2)
    files = [tmp_path / "trace.json.0", tmp_path / "trace.json.1"]
    wait_for(lambda: all(f.exists() for f in files), "two trace files")
    entries = [e for f in files for e in json.loads(f.read_text())]
    heads = [e for e in entries if "model_name" in e]
    assert [h["request_id"] for h in heads] == ["h1", "h3", "g1", "g3"]
    assert all(h["model_name"] == "add_sub" and h["model_version"] == 1 and h["parent_id"] == 0 for h in heads)
    stamps = {e["id"]: e["timestamps"] for e in entries if "timestamps" in e}
    assert sorted(stamps) == sorted(h["id"] for h in heads)
    for ts in stamps.values():
        names = [t["name"] for t in ts]
        assert names == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
        ns = [t["ns"] for t in ts]
        assert ns == sorted(ns)
    # TENSORS level through the trace extension: the inputs and outputs of the next sampled request
    # (the file stays the command line's: a client cannot choose where the server writes)
    settings = http.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1",
                                                      "log_frequency": "1"})
    assert settings["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert settings["trace_file"] == str(trace)
    http.infer("add_sub", [a, b], request_id="t")
    # new settings start a new file series: trace.json.0 is rewritten with the TENSORS trace
    wait_for(lambda: "TENSOR_QUEUE_INPUT" in files[0].read_text(), "the TENSORS trace")
    tensors = [e for e in json.loads(files[0].read_text()) if "activity" in e]
    by = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in tensors}
    assert by[("TENSOR_QUEUE_INPUT", "INPUT0")]["data"] == ",".join(f"{i}.0" for i in range(16))
    assert by[("TENSOR_QUEUE_INPUT", "INPUT0")]["shape"] == "1,16"
    assert by[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == ",".join(f"{i + 1}.0" for i in range(16))
    assert by[("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]["dtype"] == "FP32"
    http.close()
    grpc.close()


def test_trace_file_written_at_shutdown_with_log_frequency_zero(server_factory, tmp_path):
    trace = tmp_path / "all.json"
    server = server_factory("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                            "--trace-config", f"triton,file={trace}")
    http = httpclient.InferenceServerClient(server.http_url)
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    for i in range(3):
        http.infer("add_sub", [a, b], request_id=str(i))
    http.close()
    assert server.stop() == 0
    entries = json.loads(trace.read_text())
    assert [e["request_id"] for e in entries if "model_name" in e] == ["0", "1", "2"]
