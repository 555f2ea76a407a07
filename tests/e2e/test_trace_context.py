"""W3C trace context (``traceparent`` / ``tracestate``) continues a client's trace, and the
batch span processor takes its ``--trace-config opentelemetry,bsp_*`` settings.

The collector is a real OTLP/HTTP receiver started by the test (``Collector`` of
test_opentelemetry: a small HTTP server decoding the exporter's protobuf with
opentelemetry-proto); the clients are tritonclient HTTP and gRPC sending the headers.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.models import write_model
from e2e.test_opentelemetry import Collector

# ---- models: each logs a line while it executes (test_logging_json reads them too) ----------

LOGGER_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        pb_utils.Logger.log_info(f"{self.name} executes {len(requests)} request(s)")
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
'''

CALLER_PY = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            context = r.trace().get_context()
            pb_utils.Logger.log_info(f"calling first, my context: {context}")
            call = pb_utils.InferenceRequest(model_name="first", inputs=[pb_utils.Tensor("X", x.as_numpy())],
                                             requested_output_names=["Y"])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y * 10)]))
        return out
'''

ASYNC_CALLER_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X")
            call = pb_utils.InferenceRequest(model_name="first", inputs=[pb_utils.Tensor("X", x.as_numpy())],
                                             requested_output_names=["Y"], trace=r.trace())
            answer = await call.async_exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y * 10)]))
        return out
'''

PROCESS = '\nparameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }\n'


def _config(name: str, extra: str = "") -> str:
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
{extra}'''


CHAIN = '''
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "mid" } },
  { model_name: "second" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "Y" } }
] }
'''


def write_repo(repo: Path) -> Path:
    """``first``, ``second`` (log and add 1), ``chain`` (first then second), ``caller`` (BLS exec of
    first, times 10), ``async_caller`` (async_exec with trace=request.trace()), the
    process-isolated ``first_process`` and ``caller_process``, and ``batcher`` (batches two
    requests: a long queue delay, preferred batch size 2)."""
    write_model(repo, "first", _config("first"), LOGGER_PY)
    write_model(repo, "second", _config("second"), LOGGER_PY)
    write_model(repo, "first_process", _config("first_process", PROCESS), LOGGER_PY)
    write_model(repo, "batcher", _config("batcher", "dynamic_batching { preferred_batch_size: [ 2 ] "
                                                    "max_queue_delay_microseconds: 5000000 }"), LOGGER_PY)
    write_model(repo, "caller", _config("caller"), CALLER_PY)
    write_model(repo, "async_caller", _config("async_caller"), ASYNC_CALLER_PY)
    write_model(repo, "caller_process", _config("caller_process", PROCESS), CALLER_PY)
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    return repo


def traceparent(n: int) -> tuple[str, str, str]:
    """(traceparent, its trace id, its span id) of a client span numbered ``n``."""
    trace_id, span_id = f"{n:032x}".replace("0", "a", 1), f"{n:016x}".replace("0", "b", 1)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def http_infer(url: str, model: str, request_id: str = "", headers: dict[str, str] | None = None) -> float:
    client = httpclient.InferenceServerClient(url)
    try:
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], np.float32))
        result = client.infer(model, [x], request_id=request_id, headers=headers)
        return float(result.as_numpy("Y")[0][0])
    finally:
        client.close()


def grpc_infer(url: str, model: str, request_id: str = "", headers: dict[str, str] | None = None) -> float:
    client = grpcclient.InferenceServerClient(url)
    try:
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], np.float32))
        result = client.infer(model, [x], request_id=request_id, headers=headers)
        return float(result.as_numpy("Y")[0][0])
    finally:
        client.close()


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _spans(collector: Collector) -> list:
    return [span for req in list(collector.requests) for rs in req.resource_spans for ss in rs.scope_spans
            for span in ss.spans]


def _described(span) -> dict:
    attrs = {a.key: a.value for a in span.attributes}
    return {"model": attrs["triton.model_name"].string_value, "request_id": attrs["triton.request_id"].string_value,
            "trace": span.trace_id.hex(), "span": span.span_id.hex(), "parent": span.parent_span_id.hex(),
            "state": span.trace_state}


@pytest.fixture
def collector():
    c = Collector()
    threading.Thread(target=c.serve_forever, daemon=True).start()
    yield c
    c.shutdown()


def _otel_flags(collector: Collector, *more: str) -> tuple[str, ...]:
    url = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    return ("--trace-config=mode=opentelemetry", f"--trace-config=opentelemetry,url={url}",
            "--trace-config=level=TIMESTAMPS", *more)


MALFORMED = [
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
    "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",  # trace id one digit short
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",  # parent id one digit short
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # version 00 with more
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0x",  # flags not hex
    "not a traceparent",
    "",
]


def test_a_clients_trace_continues_through_models_ensembles_and_bls(tmp_path, collector):
    repo = write_repo(tmp_path / "repo")
    # Triton's default rate (1000): only requests that bring a context are traced
    s = start_server(*_otel_flags(collector, "--trace-config=rate=1000"), repo=repo)
    sent: dict[str, tuple[str, str, str]] = {}
    try:
        sent["http"] = traceparent(1)
        assert http_infer(s.http_url, "first", "via-http",
                          {"traceparent": sent["http"][0], "tracestate": "vendor=abc,other=1"}) == 2.0
        sent["grpc"] = traceparent(2)
        assert grpc_infer(s.grpc_url, "first", "via-grpc", {"traceparent": sent["grpc"][0]}) == 2.0
        sent["chain"] = traceparent(3)
        assert http_infer(s.http_url, "chain", "ens", {"traceparent": sent["chain"][0]}) == 3.0
        sent["caller"] = traceparent(4)
        assert grpc_infer(s.grpc_url, "caller", "bls", {"traceparent": sent["caller"][0]}) == 20.0
        sent["async_caller"] = traceparent(5)
        assert http_infer(s.http_url, "async_caller", "bls-async", {"traceparent": sent["async_caller"][0]}) == 20.0
        sent["caller_process"] = traceparent(6)
        assert http_infer(s.http_url, "caller_process", "bls-proc", {"traceparent": sent["caller_process"][0]}) == 20.0
        # no context: not traced at rate 1000; a malformed one is ignored (never an error)
        assert http_infer(s.http_url, "chain", "plain") == 3.0
        for i, bad in enumerate(MALFORMED):
            assert http_infer(s.http_url, "first", f"bad-http-{i}", {"traceparent": bad}) == 2.0
            assert grpc_infer(s.grpc_url, "first", f"bad-grpc-{i}", {"traceparent": bad}) == 2.0
        # two traceparent headers: ignored as well
        raw = httpx.post(f"http://{s.http_url}/v2/models/first/infer", headers=[
            ("traceparent", sent["http"][0]), ("traceparent", traceparent(9)[0])],
            json={"id": "two-headers", "inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1]}]})
        assert raw.status_code == 200
    finally:
        assert s.stop() == 0  # shutdown flushes the batch span processor
    log = s.log()
    spans = [_described(span) for span in _spans(collector)]
    assert not [x for x in spans if x["request_id"].startswith(("bad-", "plain", "two-"))]
    by = {}
    for x in spans:
        by.setdefault(x["trace"], []).append(x)
    assert set(by) == {t[1] for t in sent.values()}  # every span belongs to a client's trace

    def one(trace: str, model: str) -> dict:
        found = [x for x in by[trace] if x["model"] == model]
        assert len(found) == 1, (model, by[trace])
        return found[0]

    for key in ("http", "grpc"):
        _, trace, span = sent[key]
        first = one(trace, "first")
        assert first["parent"] == span and first["request_id"] == f"via-{key}"
    assert one(sent["http"][1], "first")["state"] == "vendor=abc,other=1"
    # the ensemble's span is the client's child; its steps' spans are the ensemble's children
    _, trace, span = sent["chain"]
    chain = one(trace, "chain")
    assert chain["parent"] == span and len(by[trace]) == 3
    assert one(trace, "first")["parent"] == chain["span"] and one(trace, "second")["parent"] == chain["span"]
    # BLS: exec (thread and process mode) and async_exec with trace=request.trace()
    for model in ("caller", "async_caller", "caller_process"):
        _, trace, span = sent[model]
        outer = one(trace, model)
        assert outer["parent"] == span
        assert one(trace, "first")["parent"] == outer["span"] and len(by[trace]) == 2
    # request.trace().get_context(): the request's own span, in process and in a model process
    for model in ("caller", "caller_process"):
        _, trace, _ = sent[model]
        context = json.dumps({"traceparent": f"00-{trace}-{one(trace, model)['span']}-01"})
        assert f"calling first, my context: {context}" in log


def test_triton_mode_samples_as_usual_and_records_the_context(tmp_path):
    repo = write_repo(tmp_path / "repo")
    trace_file = tmp_path / "trace.json"
    s = start_server("--trace-config=level=TIMESTAMPS", "--trace-config=rate=2", f"--trace-config=triton,file={trace_file}",
                     repo=repo)
    header, _, _ = traceparent(7)
    try:
        for i in range(4):  # every 2nd is traced, context or not: requests 1 and 3
            http_infer(s.http_url, "first", f"r{i}", {"traceparent": header, "tracestate": "k=v"} if i < 2 else None)
        http_infer(s.http_url, "first", "r4", {"traceparent": MALFORMED[0]})
        http_infer(s.http_url, "first", "r5", {"traceparent": MALFORMED[1]})
    finally:
        assert s.stop() == 0
    heads = {e["request_id"]: e for e in json.loads(trace_file.read_text()) if "model_name" in e}
    assert set(heads) == {"r1", "r3", "r5"}
    assert heads["r1"]["traceparent"] == header and heads["r1"]["tracestate"] == "k=v"
    assert "traceparent" not in heads["r3"] and "traceparent" not in heads["r5"]


def _exports_of(collector: Collector) -> list[int]:
    return [sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans) for req in list(collector.requests)]


def test_batch_span_processor_takes_its_settings(tmp_path, collector):
    repo = write_repo(tmp_path / "repo")
    # batches of at most 2, and no export by time for a minute: 5 spans go out as 2 + 2 at once,
    # the 5th only at shutdown
    s = start_server(*_otel_flags(collector, "--trace-config=rate=1",
                                  "--trace-config=opentelemetry,bsp_max_export_batch_size=2",
                                  "--trace-config=opentelemetry,bsp_schedule_delay=60000",
                                  "--trace-config=opentelemetry,bsp_max_queue_size=64",
                                  "--trace-config=opentelemetry,resource=team=vision",
                                  "--trace-config=opentelemetry,resource=tier=gold"), repo=repo)
    try:
        for i in range(5):
            http_infer(s.http_url, "first", f"n{i}")
        wait_until(lambda: sum(_exports_of(collector)) >= 4, "two full batches")
        time.sleep(0.5)
        assert _exports_of(collector) == [2, 2]
    finally:
        assert s.stop() == 0
    assert _exports_of(collector) == [2, 2, 1]
    resource = {a.key: a.value.string_value for a in collector.requests[0].resource_spans[0].resource.attributes}
    assert resource["team"] == "vision" and resource["tier"] == "gold"

    # a short schedule delay: one span goes out on its own, long before shutdown
    collector.requests.clear()
    s = start_server(*_otel_flags(collector, "--trace-config=rate=1",
                                  "--trace-config=opentelemetry,bsp_schedule_delay=50"), repo=repo)
    try:
        http_infer(s.http_url, "first", "alone")
        wait_until(lambda: _exports_of(collector) == [1], "the span exported by time")
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("flag,message", [
    ("opentelemetry,bsp_max_queue_size=0", "positive integer"),
    ("opentelemetry,bsp_schedule_delay=soon", "positive integer"),
    ("opentelemetry,bsp_max_export_batch_size=-1", "positive integer"),
    ("opentelemetry,bsp_max_export_batch_size=4096", "must not exceed bsp_max_queue_size"),
    ("opentelemetry,resource=novalue", "<key>=<value>"),
])
def test_bad_span_processor_settings_refuse_to_start(flag, message):
    with pytest.raises(RuntimeError, match="trident exited with 2") as e:
        start_server("--trace-config=mode=opentelemetry", f"--trace-config={flag}")
    assert message in str(e.value)
