import pytest

from trident.errors import TritonError
from trident.observability.trace import TraceSettings


def test_defaults_and_model_override_falls_back_to_global():
    t = TraceSettings()
    assert t.get()["trace_level"] == ["OFF"] and t.get()["trace_rate"] == "1000"
    t.update("", {"trace_rate": "10", "trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert t.get("m")["trace_rate"] == "10"
    t.update("m", {"trace_rate": 5})
    assert t.get("m")["trace_rate"] == "5" and t.get()["trace_rate"] == "10"
    t.update("m", {"trace_rate": None})
    assert t.get("m")["trace_rate"] == "10"


@pytest.mark.parametrize("change", [{"trace_level": ["LOUD"]}, {"trace_rate": "x"}, {"trace_count": "-2"},
                                    {"nope": "1"}, {"trace_level": ["OFF", "TIMESTAMPS"]}, {"trace_rate": ["1", "2"]}])
def test_bad_settings(change):
    with pytest.raises(TritonError) as e:
        TraceSettings().update("", change)
    assert e.value.code.name == "INVALID_ARG"


def test_global_cannot_be_cleared():
    with pytest.raises(TritonError):
        TraceSettings().update("", {"trace_rate": None})


# ---- W3C trace context -----------------------------------------------------------------------

from trident.observability.trace import parse_trace_config, parse_traceparent  # noqa: E402

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_and_its_tracestate():
    tp = parse_traceparent(VALID.encode(), b"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
    assert (tp.trace_id, tp.span_id, tp.flags) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1)
    assert tp.tracestate == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE" and tp.traceparent() == VALID
    assert parse_traceparent(f"  {VALID}\t").trace_id == tp.trace_id  # optional whitespace around it
    # a later version may carry more fields after a dash; its first four are read as version 00's
    later = parse_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-what-comes-next")
    assert later is not None and later.flags == 0


@pytest.mark.parametrize("value", [
    "", "00", "garbage", VALID[:-1], VALID + "-", VALID + "0",
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff is invalid
    "0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero parent id
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
    "00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",  # lengths off by one
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
    "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
    "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01.x",  # a later version: extra data after a dash only
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x00",
])
def test_malformed_traceparents_are_ignored(value):
    assert parse_traceparent(value, "k=v") is None
    assert parse_traceparent(value.encode("latin-1")) is None


@pytest.mark.parametrize("state", ["no-equals", "=v", "k=", "UPPER=1", "k=v,,k2=v2 x=1", "k=v" + ",k=v" * 40,
                                   "k=" + "v" * 600, "k=a,b"])
def test_a_bad_tracestate_is_dropped_and_the_context_kept(state):
    tp = parse_traceparent(VALID, state)
    assert tp is not None and tp.tracestate == ""


def test_batch_span_processor_settings_are_checked():
    _, otel = parse_trace_config(["opentelemetry,bsp_max_queue_size=8", "opentelemetry,bsp_schedule_delay=50",
                                  "opentelemetry,bsp_max_export_batch_size=8", "opentelemetry,resource=a=1",
                                  "opentelemetry,resource=b=x=y"])
    assert otel == {"bsp_max_queue_size": "8", "bsp_schedule_delay": "50", "bsp_max_export_batch_size": "8",
                    "resource": "a=1,b=x=y"}
    for bad, why in [("bsp_max_queue_size=0", "positive"), ("bsp_schedule_delay=1.5", "positive"),
                     ("bsp_max_export_batch_size=", "positive"), ("bsp_max_export_batch_size=4096", "exceed"),
                     ("resource=novalue", "<key>=<value>"), ("resource==v", "<key>=<value>")]:
        with pytest.raises(ValueError, match=why):
            parse_trace_config([f"opentelemetry,{bad}"])
    with pytest.raises(ValueError, match="exceed"):  # against a queue set smaller than the default batch
        parse_trace_config(["opentelemetry,bsp_max_queue_size=100"])
