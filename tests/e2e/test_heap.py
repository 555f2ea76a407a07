"""The server's long-lived heap is frozen (trident.server.heap), yet a model that is unloaded or
replaced is still freed: a reference cycle its instance holds is collected by the time the
unload (or reload) call returns. Real server, real HTTP client."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.models import write_model
from tritonclient.utils import InferenceServerException

CYCLIC_PY = '''
import os

import triton_python_backend_utils as pb_utils


class _Marker:
    """Appends a line to a file when it is freed; only the cyclic collector can free it."""

    def __init__(self, path):
        self.path = path
        self.me = self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write("freed\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.marker = _Marker(os.environ["TRIDENT_TEST_MARKER"])
        self.marker.model = self

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

CYCLIC_CONFIG = '''
name: "cyclic"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''


@pytest.fixture
def server(tmp_path):
    from e2e.conftest import start_server

    repo = tmp_path / "repo"
    write_model(repo, "cyclic", CYCLIC_CONFIG, CYCLIC_PY)
    marker = tmp_path / "freed.txt"
    s = start_server("--model-control-mode=explicit", "--load-model=cyclic", repo=repo,
                     env={"TRIDENT_TEST_MARKER": str(marker)})
    yield s, marker
    s.stop()


def freed(marker) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def infer(c: httpclient.InferenceServerClient) -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    i = httpclient.InferInput("INPUT0", [4], "FP32")
    i.set_data_from_numpy(x)
    out = c.infer("cyclic", [i]).as_numpy("OUTPUT0")
    assert out.tolist() == x.tolist()
    return out


def test_unloaded_and_replaced_models_are_freed(server):
    s, marker = server
    with httpclient.InferenceServerClient(s.http_url) as c:
        infer(c)  # loaded at start-up: its objects were frozen with the rest of the heap
        assert freed(marker) == 0
        c.unload_model("cyclic")
        assert freed(marker) == 1  # collected before the unload call returned
        with pytest.raises(InferenceServerException):
            infer(c)
        c.load_model("cyclic")
        infer(c)
        c.load_model("cyclic", config=CYCLIC_CONFIG_JSON)  # a reload replaces the instance
        infer(c)
        deadline = time.monotonic() + 10  # the old version drains and unloads after the load returns
        while freed(marker) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert freed(marker) == 2
        c.unload_model("cyclic")
        assert freed(marker) == 3
        # a load that fails leaves nothing behind either, and the server goes on serving
        with pytest.raises(InferenceServerException):
            c.load_model("cyclic", config='{"name": "cyclic", "backend": "python", "input": "bad"}')
        c.load_model("cyclic")
        infer(c)
        assert c.is_server_live()


CYCLIC_CONFIG_JSON = (
    '{"name": "cyclic", "backend": "python", "max_batch_size": 0,'
    ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],'
    ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}'
)
