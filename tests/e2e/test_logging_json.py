"""``--log-format json`` and the request in every line logged while serving it.

The server runs the models of test_trace_context, which log a line through
``pb_utils.Logger`` while they execute (in the server's process and in a model process);
tritonclient HTTP and gRPC send the requests.
"""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, start_server
from e2e.models import RAISES_CONFIG, RAISES_PY, write_model
from e2e.test_trace_context import grpc_infer, http_infer, traceparent, wait_until, write_repo
from tritonclient.utils import InferenceServerException

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def json_lines(server: RunningServer) -> list[dict]:
    """Every line of the server's log, each a JSON object (fails on a line that is not one)."""
    out = []
    for line in server.log().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return out


def lines_of(server: RunningServer, **match: object) -> list[dict]:
    return [x for x in json_lines(server) if all(x.get(k) == v for k, v in match.items())]


def wait_line(server: RunningServer, what: str, **match: object) -> dict:
    wait_until(lambda: lines_of(server, **match), what)
    return lines_of(server, **match)[0]


@pytest.fixture(scope="module")
def json_server(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("logging") / "repo")
    write_model(repo, "raises", RAISES_CONFIG, RAISES_PY)
    server = start_server("--log-format=json", "--log-verbose=1", repo=repo)
    yield server
    server.stop()


def test_every_line_is_one_json_object(json_server):
    lines = json_lines(json_server)
    assert len(lines) > 10
    for line in lines:
        assert set(line) >= {"time", "level", "pid", "file", "message"}
        assert TIME.fullmatch(line["time"]) and line["level"] in ("INFO", "WARNING", "ERROR", "VERBOSE")
        assert re.fullmatch(r"[\w.\-]+\.py:\d+", line["file"]) and isinstance(line["pid"], int)
    started = [x for x in lines if "Started HTTPService" in x["message"]]
    assert started and "model" not in started[0]  # not written while serving a request


def test_model_and_server_lines_name_the_request(json_server):
    s = json_server
    assert http_infer(s.http_url, "first", "http-1") == 2.0
    model_line = wait_line(s, "the model's line", request_id="http-1", message="first executes 1 request(s)")
    assert model_line["model"] == "first" and model_line["model_version"] == "1"
    assert re.fullmatch(r"model\.py:\d+", model_line["file"])  # the model's own file and line
    served = wait_line(s, "the server's line", request_id="http-1", message="infer request http-1 to model 'first': OK")
    assert served["model"] == "first" and served["file"].startswith("core.py:")

    assert grpc_infer(s.grpc_url, "first", "grpc-1") == 2.0
    wait_line(s, "the model's line over gRPC", request_id="grpc-1", message="first executes 1 request(s)")
    wait_line(s, "the server's line over gRPC", request_id="grpc-1", model="first",
              message="infer request grpc-1 to model 'first': OK")

    # a request without an id: its lines name the model, and no request id
    before = len(lines_of(s, message="second executes 1 request(s)"))
    assert grpc_infer(s.grpc_url, "second") == 2.0
    wait_until(lambda: len(lines_of(s, message="second executes 1 request(s)")) > before, "the anonymous line")
    anonymous = lines_of(s, message="second executes 1 request(s)")[-1]
    assert anonymous["model"] == "second" and "request_id" not in anonymous

    # an id a client chose to break lines: it stays inside the one JSON line
    odd = 'line\nbreak "quoted" ]'
    assert http_infer(s.http_url, "first", odd) == 2.0
    wait_line(s, "the odd id's line", request_id=odd, message="first executes 1 request(s)")


def test_a_process_isolated_models_lines_come_with_its_request(json_server):
    s = json_server
    assert http_infer(s.http_url, "first_process", "proc-1") == 2.0
    line = wait_line(s, "the model process's line", request_id="proc-1", message="first_process executes 1 request(s)")
    assert line["model"] == "first_process"
    assert line["model_version"] == "1" and re.fullmatch(r"model\.py:\d+", line["file"])


def test_a_batch_names_its_requests(json_server):
    s = json_server
    threads = [threading.Thread(target=http_infer, args=(s.http_url, "batcher", f"b-{i}")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    line = wait_line(s, "the batch's line", message="batcher executes 2 request(s)")
    assert line["batch_size"] == 2 and sorted(line["request_ids"]) == ["b-0", "b-1"] and "request_id" not in line


def test_an_ensembles_lines_carry_the_clients_trace_id(json_server):
    s = json_server
    header, trace_id, _ = traceparent(11)
    assert http_infer(s.http_url, "chain", "ens-1", {"traceparent": header}) == 3.0
    first = wait_line(s, "the first step's line", request_id="ens-1", message="first executes 1 request(s)")
    second = wait_line(s, "the second step's line", request_id="ens-1", message="second executes 1 request(s)")
    assert first["trace_id"] == trace_id == second["trace_id"]
    assert (first["model"], second["model"]) == ("first", "second")
    # a malformed traceparent is ignored: the request is served, its lines carry no trace id
    assert grpc_infer(s.grpc_url, "chain", "ens-2", {"traceparent": "00-zz-zz-01"}) == 3.0
    line = wait_line(s, "the untraced step's line", request_id="ens-2", message="second executes 1 request(s)")
    assert "trace_id" not in line


def test_a_traceback_stays_inside_its_json_object(json_server):
    s = json_server
    client = httpclient.InferenceServerClient(s.http_url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([-1.0], np.float32))  # the model raises for a negative input
    with pytest.raises(InferenceServerException, match="negative input"):
        client.infer("raises", [x], request_id="boom-1")
    client.close()
    line = wait_line(s, "the execute failure", request_id="boom-1", message="model 'raises' execute raised")
    assert line["level"] == "VERBOSE" and line["exception"].startswith("Traceback (most recent call last):")
    assert "\n" in line["exception"]
    json_lines(s)  # and no line outside a JSON object


def test_log_format_changes_live_through_the_logging_extension(tmp_path):
    repo = write_repo(tmp_path / "repo")
    s = start_server("--model-control-mode=explicit", "--load-model=first", repo=repo)
    try:
        url = f"http://{s.http_url}/v2/logging"
        # the default format: the request in front of the message, Triton's line otherwise
        http_infer(s.http_url, "first", "txt-1")
        wait_until(lambda: "] [model=first:1 request=txt-1] first executes 1 request(s)" in s.log(), "text line")
        line = next(x for x in s.log().splitlines() if "request=txt-1" in x)
        assert re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ model\.py:\d+\] \[model=first:1 request=txt-1\] ", line)
        # bad values are refused, nothing changes
        bad = httpx.post(url, json={"log_format": "JSON"})
        assert bad.status_code == 400 and "invalid log format" in bad.json()["error"]
        grpc = grpcclient.InferenceServerClient(s.grpc_url)
        with pytest.raises(InferenceServerException) as e:
            grpc.update_log_settings({"log_format": "xml"})
        assert "INVALID_ARG" in str(e.value.status()) or "invalid log format" in str(e.value)
        # POST /v2/logging switches to JSON
        assert httpx.post(url, json={"log_format": "json"}).json()["log_format"] == "json"
        mark = len(s.log().splitlines())
        http_infer(s.http_url, "first", "json-1")
        wait_until(lambda: '"request_id": "json-1"' in s.log(), "the JSON line")
        new = [json.loads(x) for x in s.log().splitlines()[mark:]]
        assert any(x.get("request_id") == "json-1" and x["model"] == "first" for x in new)
        # the LogSettings RPC switches to ISO8601
        assert grpc.update_log_settings({"log_format": "ISO8601"}).settings["log_format"].string_param == "ISO8601"
        grpc.close()
        http_infer(s.http_url, "first", "iso-1")
        wait_until(lambda: "[model=first:1 request=iso-1]" in s.log(), "the ISO8601 line")
        line = next(x for x in s.log().splitlines() if "request=iso-1" in x)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ model\.py:\d+\] \[model=first:1 request=iso-1\] ", line)
    finally:
        s.stop()


def test_the_json_flag_is_refused_in_other_spellings():
    with pytest.raises(RuntimeError, match="trident exited with 2"):
        start_server("--log-format=JSON")


def test_bursts_of_json_lines_from_many_requests_stay_whole(json_server):
    """Concurrent requests over both protocols: every line still parses on its own."""
    s = json_server
    x = np.array([[1.0]], np.float32)

    def http_burst(k: int) -> None:
        client = httpclient.InferenceServerClient(s.http_url)
        inp = httpclient.InferInput("X", [1, 1], "FP32")
        inp.set_data_from_numpy(x)
        for i in range(10):
            client.infer("first", [inp], request_id=f"burst-{k}-{i}")
        client.close()

    threads = [threading.Thread(target=http_burst, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ids = {x.get("request_id") for x in json_lines(s) if x.get("message") == "first executes 1 request(s)"}
        if all(f"burst-{k}-{i}" in ids for k in range(4) for i in range(10)):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a burst request's line is missing")
