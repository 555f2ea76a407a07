import logging

import pytest

from trident.errors import TritonError
from trident.observability.logs import LogSettings, TritonFormatter


def _record(level=logging.INFO, msg="hello"):
    return logging.LogRecord("trident.x", level, "/a/b/repository.py", 12, msg, None, None)


def test_default_and_iso_formats():
    line = TritonFormatter("default").format(_record())
    assert line.startswith("I") and "repository.py:12] hello" in line
    iso = TritonFormatter("ISO8601").format(_record(logging.ERROR))
    assert iso[4] == "-" and iso[10] == "T" and " E " in iso and iso.endswith("repository.py:12] hello")


def test_settings_update_and_validation():
    s = LogSettings()
    assert set(s.as_dict()) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    out = s.update({"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"})
    assert out["log_info"] is False and out["log_verbose_level"] == 2 and out["log_format"] == "ISO8601"
    assert s.update({"log_format": "json"})["log_format"] == "json"
    for bad in ({"log_info": "yes"}, {"log_verbose_level": -1}, {"log_format": "JSON"}, {"log_format": "xml"},
                {"x": 1}):
        with pytest.raises(TritonError) as e:
            s.update(bad)
        assert e.value.code.name == "INVALID_ARG"
    with pytest.raises(TritonError) as e:
        s.update({"log_file": "/tmp/x"})
    assert e.value.code.name == "UNSUPPORTED"


def test_filter_follows_live_settings(tmp_path):
    s = LogSettings(log_file=str(tmp_path / "log.txt"))
    s.install()
    logger = logging.getLogger("trident.test")
    logger.info("first")
    s.update({"log_info": False})
    logger.info("second")
    logger.error("third")
    logger.log(5, "verbose", extra={"verbose": 1})
    s.update({"log_verbose_level": 1})
    logger.log(5, "verbose-shown", extra={"verbose": 1})
    text = (tmp_path / "log.txt").read_text()
    assert "first" in text and "second" not in text and "third" in text
    assert "verbose-shown" in text and "] verbose\n" not in text


# ---- JSON and the request context ------------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

from trident.observability.logs import SERVING_KEY, ModelCall, serving  # noqa: E402
from trident.observability.trace import parse_traceparent  # noqa: E402
from trident.types import InferenceRequest  # noqa: E402

TRACE = "0af7651916cd43dd8448eb211c80319c"


def test_json_lines_and_their_fields():
    line = TritonFormatter("json").format(_record(logging.WARNING, "a \"quoted\"\nmessage"))
    assert "\n" not in line
    out = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", out["time"])
    assert out["level"] == "WARNING" and out["file"] == "repository.py:12" and out["message"] == "a \"quoted\"\nmessage"
    assert isinstance(out["pid"], int) and "model" not in out
    assert json.loads(TritonFormatter("json").format(_record(5)))["level"] == "VERBOSE"
    assert json.loads(TritonFormatter("json").format(_record(logging.DEBUG)))["level"] == "VERBOSE"


def test_a_traceback_goes_inside_the_object():
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord("trident.x", logging.ERROR, "/a/x.py", 3, "failed", None, sys.exc_info())
    line = TritonFormatter("json").format(record)
    assert len(line.splitlines()) == 1
    assert json.loads(line)["exception"].endswith("ValueError: bad")
    relayed = _record(logging.ERROR, "from a model process")
    relayed.exc_text = "Traceback (most recent call last):\n  ...\nKeyError: 'x'"
    assert json.loads(TritonFormatter("json").format(relayed))["exception"].endswith("KeyError: 'x'")
    assert TritonFormatter("default").format(relayed).endswith("] from a model process\n" + relayed.exc_text)


def test_a_line_written_while_serving_names_the_request():
    request = InferenceRequest("add_sub", [], model_version="2", id="req-7")
    request.trace = parse_traceparent(f"00-{TRACE}-b7ad6b7169203331-01")
    token = serving.set(request)
    try:
        text = TritonFormatter("default").format(_record())
        out = json.loads(TritonFormatter("json").format(_record()))
    finally:
        serving.reset(token)
    assert text.endswith("repository.py:12] [model=add_sub:2 request=req-7] hello")
    assert (out["model"], out["model_version"], out["request_id"], out["trace_id"]) == ("add_sub", "2", "req-7", TRACE)
    assert "model" not in json.loads(TritonFormatter("json").format(_record()))  # reset: nothing served
    anonymous = InferenceRequest("add_sub", [])
    token = serving.set(anonymous)
    try:
        assert TritonFormatter("ISO8601").format(_record()).endswith("] [model=add_sub] hello")
        assert "request_id" not in json.loads(TritonFormatter("json").format(_record()))
    finally:
        serving.reset(token)


def test_a_model_calls_lines_name_its_batch_bounded():
    requests = [InferenceRequest("m", [], id=f"r{i}") for i in range(12)]
    requests[1].id = ""
    requests[2].trace = parse_traceparent(f"00-{TRACE}-b7ad6b7169203331-01")
    record = _record()
    setattr(record, SERVING_KEY, ModelCall("m", "1", requests))
    out = json.loads(TritonFormatter("json").format(record))
    assert out["batch_size"] == 12 and out["request_ids"] == ["r0", "", "r2", "r3", "r4", "r5", "r6", "r7"]
    assert out["trace_ids"] == [TRACE] and "request_id" not in out
    assert "[model=m:1 batch=12 requests=r0,<id_unknown>,r2,r3,r4,r5,r6,r7,...] hello" in \
        TritonFormatter("default").format(record)
    setattr(record, SERVING_KEY, ModelCall("m", "1", []))  # initialize, finalize: the model alone
    assert TritonFormatter("default").format(record).endswith("] [model=m:1] hello")
    assert json.loads(TritonFormatter("json").format(record))["model"] == "m"


def test_an_id_cannot_break_or_fake_a_text_line():
    for rid, shown in [("a b", '"a b"'), ("x]\nI1130 fake", '"x]\\nI1130 fake"'), ("q\"", '"q\\""'),
                       ("x" * 200, "x" * 128 + "...")]:
        token = serving.set(InferenceRequest("m", [], id=rid))
        try:
            line = TritonFormatter("default").format(_record())
            out = json.loads(TritonFormatter("json").format(_record()))
        finally:
            serving.reset(token)
        assert line.endswith(f"[model=m request={shown}] hello") and "\n" not in line
        assert out["request_id"] == (rid if len(rid) <= 128 else rid[:128] + "...")
