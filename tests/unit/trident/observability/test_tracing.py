"""Trace sampling and Triton's trace JSON (trident.observability.tracing)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from trident.observability.trace import TraceSettings
from trident.observability.tracing import Tracer, parse_trace_config
from trident.server.execution import Pending
from trident.types import InferenceRequest, InferenceResponse, Tensor


def test_parse_trace_config():
    changes, otel = parse_trace_config(["rate=5", "level=TIMESTAMPS", "level=TENSORS", "count=3",
                                        "triton,file=/tmp/t.json", "triton,log-frequency=2"])
    assert changes == {"trace_rate": "5", "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_count": "3",
                       "trace_file": "/tmp/t.json", "log_frequency": "2"}
    assert otel == {}
    assert parse_trace_config(["level=OFF"])[0] == {"trace_level": "OFF"}
    assert parse_trace_config(["triton,file=/tmp/a,b=c.json"])[0] == {"trace_file": "/tmp/a,b=c.json"}


@pytest.mark.parametrize("entry", ["rate", "rate=x", "level=LOUD", "bogus=1", "triton,url=x", "opentelemetry,file=x"])
def test_parse_trace_config_rejects(entry):
    with pytest.raises(ValueError):
        parse_trace_config([entry])


def test_opentelemetry_mode_needs_its_packages(monkeypatch):
    assert parse_trace_config(["mode=opentelemetry"])[0]["trace_mode"] == "opentelemetry"  # installed here
    # a host without them: the import fails and the option is refused with the packages' names
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ValueError, match="opentelemetry-sdk"):
        parse_trace_config(["mode=opentelemetry"])


def _request(i: int) -> InferenceRequest:
    return InferenceRequest(model_name="m", id=f"r{i}",
                            inputs=[Tensor("IN", "INT32", [2], np.array([i, i + 1], dtype=np.int32))])


def _finish(request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    return response


def _run(tracer: Tracer, i: int, executed: bool = True) -> None:
    request = _request(i)
    trace = tracer.sample("m", 1, request)
    if trace is None:
        return
    pending = Pending(request, 1, _finish)
    if executed:
        t = pending.enqueued_ns
        pending.exec_ns = (t + 1, t + 2, t + 3, t + 4)
    out = InferenceResponse(outputs=[Tensor("OUT", "BYTES", [1], np.array([b"x"], dtype=object))])
    tracer.complete(trace, pending, out)


async def test_rate_count_and_log_frequency_files(tmp_path):
    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "3",
                         "trace_file": str(tmp_path / "t.json"), "log_frequency": "2"})
    tracer = Tracer(settings)
    for i in range(10):
        _run(tracer, i)
    tracer.close()
    first = json.loads((tmp_path / "t.json.0").read_text())
    second = json.loads((tmp_path / "t.json.1").read_text())
    heads = [e for e in first + second if "model_name" in e]
    assert [h["request_id"] for h in heads] == ["r1", "r3", "r5"]  # every 2nd request, 3 in all
    assert heads[0] == {"id": heads[0]["id"], "model_name": "m", "model_version": 1, "request_id": "r1",
                        "parent_id": 0}
    stamps = [e["timestamps"] for e in first if "timestamps" in e][0]
    assert [s["name"] for s in stamps] == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                                           "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    assert tracer.written == 3


async def test_off_and_no_file_trace_nothing(tmp_path):
    settings = TraceSettings()
    tracer = Tracer(settings)
    assert tracer.sample("m", 1, _request(0)) is None  # OFF by default
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert tracer.sample("m", 1, _request(0)) is None  # no trace_file in triton mode


async def test_model_settings_and_tensors_and_unexecuted_requests(tmp_path):
    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1000", "trace_file": str(tmp_path / "g.json")})
    settings.update("m", {"trace_level": ["TENSORS"], "trace_rate": "1", "trace_file": str(tmp_path / "m.json")})
    tracer = Tracer(settings)
    _run(tracer, 7)
    _run(tracer, 8, executed=False)  # e.g. cancelled while queued: no compute timestamps
    assert tracer.sample("other", 1, _request(0)) is None  # global rate 1000
    tracer.close()
    entries = json.loads((tmp_path / "m.json").read_text())
    tensors = [e for e in entries if "activity" in e]
    assert {"id": tensors[0]["id"], "activity": "TENSOR_QUEUE_INPUT",
            "tensor": {"name": "IN", "data": "7,8", "shape": "2", "dtype": "INT32"}} in tensors
    assert any(e["activity"] == "TENSOR_BACKEND_OUTPUT" and e["tensor"]["data"] == "x" for e in tensors)
    stamps = [e["timestamps"] for e in entries if "timestamps" in e]
    assert [s["name"] for s in stamps[1]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert not (tmp_path / "g.json").exists()


async def test_settings_change_flushes_and_restarts_count(tmp_path):
    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": str(tmp_path / "a.json")})
    tracer = Tracer(settings)
    _run(tracer, 0)
    settings.update("", {"trace_file": str(tmp_path / "b.json")})
    _run(tracer, 1)
    assert [e["request_id"] for e in json.loads((tmp_path / "a.json").read_text()) if "model_name" in e] == ["r0"]
    tracer.close()
    assert [e["request_id"] for e in json.loads((tmp_path / "b.json").read_text()) if "model_name" in e] == ["r1"]


async def test_buffered_traces_are_text_the_collector_never_walks(tmp_path):
    # tracing every request with log_frequency 0 buffers every trace until the file is written:
    # as dicts, every full garbage collection walked them all (p99 18 ms at 8 connections)
    import gc

    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1",
                         "trace_file": str(tmp_path / "all.json"), "log_frequency": "0"})
    tracer = Tracer(settings)
    for i in range(50):
        _run(tracer, i)
    state = tracer._state("m")
    assert len(state.buffer) == 50 and not any(gc.is_tracked(item) for item in state.buffer)
    tracer.close()
    entries = json.loads((tmp_path / "all.json").read_text())
    heads = [e for e in entries if "model_name" in e]
    assert [h["request_id"] for h in heads] == [f"r{i}" for i in range(50)]
    assert len(entries) == 50 * 4  # head, timestamps, the input tensor, the output tensor
    tensors = [e for e in entries if "activity" in e]
    assert tensors[0]["activity"] == "TENSOR_QUEUE_INPUT" and tensors[1]["activity"] == "TENSOR_BACKEND_OUTPUT"


def test_sampling_resumes_when_settings_change_after_requests_went_untraced(tmp_path):
    settings = TraceSettings()
    tracer = Tracer(settings)
    assert [tracer.sample("m", 1, _request(i)) for i in range(3)] == [None, None, None]  # tracing off
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": str(tmp_path / "t.json")})
    assert tracer.sample("m", 1, _request(3)) is not None
    settings.update("", {"trace_level": ["OFF"]})
    assert tracer.sample("m", 1, _request(4)) is None
    settings.update("m", {"trace_level": ["TIMESTAMPS"]})  # one model's own settings: it samples again
    assert tracer.sample("m", 1, _request(5)) is not None
    assert tracer.sample("other", 1, _request(6)) is None


# ---- the client's W3C context ----------------------------------------------------------------

from trident.observability.trace import parse_traceparent  # noqa: E402
from trident.observability.tracing import RequestTrace  # noqa: E402

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _with_context(i: int) -> InferenceRequest:
    request = _request(i)
    request.trace = parse_traceparent(CLIENT, "k=v")
    return request


def test_triton_mode_samples_a_clients_request_by_rate_and_records_its_context(tmp_path):
    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_file": str(tmp_path / "t.json")})
    tracer = Tracer(settings)
    first, second = _with_context(0), _with_context(1)
    assert tracer.sample("m", 1, first) is None and first.trace.trace_id == "0af7651916cd43dd8448eb211c80319c"
    trace = tracer.sample("m", 1, second)
    assert trace is not None and second.trace is trace  # the request now holds its own trace
    assert trace.trace_id == "0af7651916cd43dd8448eb211c80319c" and trace.traceparent() == CLIENT
    child_request = _request(2)
    child_request.trace = trace  # an ensemble step's (or a BLS call's) request
    child = tracer.sample("m", 1, child_request)
    assert child.parent_id == trace.id and child.trace_id == trace.trace_id and child.context is None
    for t in (child, trace):
        tracer.record(t, [("REQUEST_START", 1), ("REQUEST_END", 2)], None)
    tracer.close()
    heads = [e for e in json.loads((tmp_path / "t.json").read_text()) if "model_name" in e]
    assert heads[0]["parent_id"] == trace.id and "traceparent" not in heads[0]
    assert heads[1]["traceparent"] == CLIENT and heads[1]["tracestate"] == "k=v"


def test_opentelemetry_mode_always_traces_a_clients_request(tmp_path):
    settings = TraceSettings()
    settings.update("", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1000", "trace_count": "0",
                         "trace_mode": "opentelemetry"})
    tracer = Tracer(settings, {"url": "http://127.0.0.1:9/v1/traces"})
    try:
        assert tracer.sample("m", 1, _request(0)) is None  # count 0, rate 1000: nothing else is traced
        request = _with_context(1)
        trace = tracer.sample("m", 1, request)
        assert isinstance(trace, RequestTrace) and request.trace is trace
        span = trace.span.get_span_context()
        assert f"{span.trace_id:032x}" == trace.trace_id == "0af7651916cd43dd8448eb211c80319c"
        assert trace.span.parent.span_id == 0xB7AD6B7169203331 and trace.span.parent.is_remote
        assert trace.traceparent() == f"00-{trace.trace_id}-{span.span_id:016x}-01"
        step = _request(2)
        step.trace = trace
        child = tracer.sample("m", 1, step)
        assert child.span.parent.span_id == span.span_id and child.trace_id == trace.trace_id
        settings.update("", {"trace_level": ["OFF"]})
        assert tracer.sample("m", 1, _with_context(3)) is None  # OFF is off, context or not
    finally:
        tracer._otel.provider.shutdown()  # no span ended: nothing to export
