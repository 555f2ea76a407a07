"""Test model folders written at test time (Python models; no downloads)."""

from __future__ import annotations

from pathlib import Path

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES"]

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            if x.triton_dtype() == 14:  # BF16 has no numpy form (as_numpy raises, as in Triton)
                y = pb_utils.Tensor.from_dlpack("OUTPUT0", x.to_dlpack())
            else:
                y = pb_utils.Tensor("OUTPUT0", x.as_numpy())
            out.append(pb_utils.InferenceResponse([y]))
        return out
'''


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def write_model(repo: Path, name: str, config: str, model_py: str, version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / str(version) / "model.py").write_text(model_py)
    return folder


def write_identity(repo: Path, datatype: str, name: str | None = None) -> str:
    name = name or f"identity_{datatype.lower()}"
    t = config_type(datatype)
    write_model(repo, name, f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {t} dims: [ -1, -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {t} dims: [ -1, -1 ] }} ]
''', IDENTITY_PY)
    return name


SLOW_PY = '''
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps X[0] seconds (polling is_cancelled), then returns X."""

    def initialize(self, args):
        self.cancelled_seen = 0

    def execute(self, requests):
        out = []
        for r in requests:
            marker = json.loads(r.parameters()).get("marker")
            if marker:  # tells a test that execution has started
                open(marker, "w").close()
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            deadline = time.monotonic() + float(x.reshape(-1)[0])
            while time.monotonic() < deadline:
                if r.is_cancelled():
                    break
                time.sleep(0.005)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''

SLOW_CONFIG = '''
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''
SLOW_ONE_INSTANCE_CONFIG = SLOW_CONFIG + "instance_group [ { kind: KIND_CPU count: 1 } ]\n"

RAISES_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if x.reshape(-1)[0] < 0:
                raise pb_utils.TritonModelException("negative input is not allowed")
            if x.reshape(-1)[0] == 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("zero is refused")))
                continue
            params = r.parameters()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)], parameters={"echo": params}))
        return out
'''

RAISES_CONFIG = '''
name: "raises"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''

CLASSIFY_CONFIG = '''
name: "scores"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
'''
