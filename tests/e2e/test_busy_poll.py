"""``--busy-poll-us``: the event loop polls for the next request before it sleeps (see
trident/batching/rounds.py). Whatever the window, from off to its largest, the server gives the
same answers over HTTP and gRPC, keeps answering while a long request runs in its instance
thread, and refuses a window out of bounds at start-up."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, start_server
from e2e.models import SLOW_ONE_INSTANCE_CONFIG, SLOW_PY, write_model
from tritonclient.utils import InferenceServerException

from trident.options import EXAMPLE_REPOSITORY


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("busy_poll") / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY, root, ignore=shutil.ignore_patterns("__pycache__"))
    write_model(root, "slow", SLOW_ONE_INSTANCE_CONFIG, SLOW_PY)
    return root


@pytest.fixture(scope="module", params=["0", "100", "10000"], ids=["off", "default", "largest"])
def server(request, repo) -> Iterator[RunningServer]:
    s = start_server("--busy-poll-us", request.param, "--allow-metrics=false", repo=repo)
    yield s
    s.stop()


def _add_sub_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_one_client_back_to_back_gets_every_answer_over_both_protocols(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for i in range(150):
            a = np.full((1, 16), i, dtype=np.float32)
            b = np.arange(16, dtype=np.float32).reshape(1, 16)
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                result = client.infer("add_sub", _add_sub_inputs(module, a, b))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        http.close()
        grpc.close()


def test_answers_keep_coming_while_a_long_request_runs_and_bad_input_is_refused(server):
    done: list[np.ndarray] = []

    def slow() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([0.5], dtype=np.float32))
        done.append(client.infer("slow", [x]).as_numpy("Y"))
        client.close()

    thread = threading.Thread(target=slow)
    thread.start()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for i in range(50):  # answered while the slow request sleeps in its instance thread
            a = np.full((1, 16), i, dtype=np.float32)
            result = grpc.infer("add_sub", _add_sub_inputs(grpcclient, a, a))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        bad = grpcclient.InferInput("WRONG", [1, 16], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="WRONG"):
            grpc.infer("add_sub", [bad])
    finally:
        grpc.close()
        thread.join(timeout=60)
    assert not thread.is_alive() and len(done) == 1
    np.testing.assert_array_equal(done[0], np.array([0.5], dtype=np.float32))


@pytest.mark.parametrize("value", ["10001", "-5", "fast"])
def test_a_window_out_of_bounds_is_refused_at_start_up(value):
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", "--busy-poll-us", value],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--busy-poll-us" in proc.stderr and "trident: error:" in proc.stderr
