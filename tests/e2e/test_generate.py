"""HTTP generate / generate_stream against the real server: JSON mapping, server-sent events,
in-band errors, and cancellation on client disconnect (in-process and process-isolated)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from e2e.python_models import build_repo


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp(f"gen-{request.param}"), ["textgen", "echo_text"], mode=request.param)
    s = start_server(repo=repo, timeout=120)
    yield s
    s.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as c:
        yield c


def parse_sse(text: str) -> list[dict]:
    """Server-sent events -> the JSON of each event's data (one ``data:`` line per event here)."""
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line]
        if not lines:
            continue
        data = "\n".join(line[len("data:"):].lstrip() for line in lines if line.startswith("data:"))
        events.append(json.loads(data))
    return events


def test_sse_parser():
    text = 'data: {"a": 1}\n\ndata: {"error": "x"}\n\n'
    assert parse_sse(text) == [{"a": 1}, {"error": "x"}]


def test_generate_on_a_regular_model(http):
    r = http.post("/v2/models/echo_text/generate", json={"text_input": "abc", "id": "q1", "parameters": {"temperature": 0.5}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["text_output"] == "cba" and body["id"] == "q1"
    assert body["model_name"] == "echo_text" and body["model_version"] == "1"
    assert json.loads(body["seen"]) == {"temperature": 0.5}  # unmapped keys become request parameters


def test_generate_on_a_decoupled_model_needs_exactly_one_response(http):
    r = http.post("/v2/models/textgen/generate", json={"text_input": "one two", "max_tokens": 1})
    assert r.status_code == 200
    assert r.json()["text_output"] == "one" and r.json()["index"] == 0
    r = http.post("/v2/models/textgen/generate", json={"text_input": "one two", "max_tokens": 2})
    assert r.status_code == 500 and "exactly 1 response" in r.json()["error"]


def test_generate_stream_one_event_per_response(http):
    payload = {"text_input": "the quick brown fox", "parameters": {"max_tokens": 4, "delay": 0.01}}
    with http.stream("POST", "/v2/models/textgen/generate_stream", json=payload) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = parse_sse(r.read().decode())
    assert [e["text_output"] for e in events] == ["the", "quick", "brown", "fox"]
    assert [e["index"] for e in events] == [0, 1, 2, 3]
    assert all(e["model_name"] == "textgen" for e in events)


def test_generate_stream_on_a_regular_model(http):
    with http.stream("POST", "/v2/models/echo_text/generate_stream", json={"text_input": "xy"}) as r:
        assert r.status_code == 200
        assert [e["text_output"] for e in parse_sse(r.read().decode())] == ["yx"]


def test_errors_after_the_first_event_arrive_in_band(http):
    payload = {"text_input": "a b c", "max_tokens": 3, "parameters": {"fail_at": 1}}
    with http.stream("POST", "/v2/models/textgen/generate_stream", json=payload) as r:
        assert r.status_code == 200  # fixed by the first event
        events = parse_sse(r.read().decode())
    assert events == [
        {"model_name": "textgen", "model_version": "1", "index": 0, "text_output": "a"},
        {"error": "token failed"},
        {"model_name": "textgen", "model_version": "1", "index": 2, "text_output": "c"},
    ]


def test_an_error_as_first_event_sets_the_status(http):
    payload = {"text_input": "a b", "max_tokens": 2, "parameters": {"fail_at": 0}}
    with http.stream("POST", "/v2/models/textgen/generate_stream", json=payload) as r:
        assert r.status_code == 400
        events = parse_sse(r.read().decode())
    assert events[0] == {"error": "token failed"} and events[1]["text_output"] == "b"


def test_errors_before_inference_are_plain_json(http):
    r = http.post("/v2/models/nope/generate_stream", json={"text_input": "a"})
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = http.post("/v2/models/textgen/generate", json={"text_input": 5})
    assert r.status_code == 400 and "text_input" in r.json()["error"]
    r = http.post("/v2/models/textgen/generate", json={"text_input": "a", "parameters": [1]})
    assert r.status_code == 400 and "Expected JSON object for keyword: 'parameters'" in r.json()["error"]
    r = http.post("/v2/models/textgen/generate", json={"text_input": "a", "max_tokens": {"x": 1}})
    assert r.status_code == 400
    r = http.get("/v2/models/textgen/generate")
    assert r.status_code == 405


def test_client_disconnect_cancels_the_model(http, tmp_path: Path):
    payload = {"text_input": "w", "max_tokens": 1000, "parameters": {"delay": 0.05, "marker": str(tmp_path)}}
    received = 0
    with http.stream("POST", "/v2/models/textgen/generate_stream", json=payload) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                received += 1
                if received == 3:
                    break
    stopped = tmp_path / "stopped"
    deadline = time.monotonic() + 30
    while not stopped.exists() or not stopped.read_text():
        assert time.monotonic() < deadline, "the model never saw is_cancelled()"
        time.sleep(0.02)
    assert 3 <= int(stopped.read_text()) < 1000


def test_the_readmes_generate_examples_on_the_bundled_repository(example_server):
    """README's examples, on the bundled example repository (bytes_echo), answer as shown."""
    base = f"http://{example_server.http_url}/v2/models/bytes_echo"
    r = httpx.post(f"{base}/generate", json={"INPUT0": "hello"})
    assert r.status_code == 200
    assert r.json() == {"model_name": "bytes_echo", "model_version": "1", "OUTPUT0": "HELLO", "OUTPUT1": 5}
    r = httpx.post(f"{base}/generate_stream", json={"INPUT0": ["a b", "c"]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events == [{"model_name": "bytes_echo", "model_version": "1", "OUTPUT0": ["A B", "C"], "OUTPUT1": [3, 1]}]
