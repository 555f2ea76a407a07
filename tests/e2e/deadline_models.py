"""Models of the deadline tests and bench (README "Deadlines"), written at test time.

Every model is one Python model, ``STEP_PY``, configured by parameters: it appends a line
``<model> <request id> <wall-clock start>`` to the MARKER file when its ``execute`` starts, sleeps
SLEEP seconds (without polling cancellation: a step that runs on is what the deadline must stop
the next one from starting after), then, with NEXT set, calls that model by BLS and fails with
its error, else answers Y = X + 1.

* ``s1``, ``s2``, ``s3`` and the ensemble ``ens3`` over them (X -> s1 -> s2 -> s3 -> Y);
* the BLS chain ``b1`` -> ``b2`` -> ``b3`` (each calls the next from its ``execute``);
* ``q``: one step with a long sleep, for requests that wait in its queue;
* ``fast``: no sleep, for the clients a deadline must leave alone.
"""

from __future__ import annotations

from pathlib import Path

from e2e.ensemble_models import write_ensemble
from e2e.models import write_model

STEP_S = 0.15  # each step of the chains: the second runs over a 200 ms deadline, the third must not start
QUEUE_STEP_S = 0.6

STEP_PY = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.name = args["model_name"]
        self.marker = params["MARKER"]
        self.sleep = float(params.get("SLEEP", "0"))
        self.next = params.get("NEXT", "")

    def execute(self, requests):
        with open(self.marker, "a") as f:
            for r in requests:
                f.write(f"{self.name} {r.request_id()} {time.time():.6f}\\n")
        time.sleep(self.sleep)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if self.next:
                call = pb_utils.InferenceRequest(model_name=self.next, requested_output_names=["Y"],
                                                 inputs=[pb_utils.Tensor("X", x)], request_id=r.request_id())
                response = call.exec()
                if response.has_error():
                    out.append(pb_utils.InferenceResponse(error=response.error()))
                    continue
                y = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
            else:
                y = x + 1
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return out
'''


def _step(root: Path, name: str, marker: Path, sleep: float, next_model: str = "") -> None:
    params = {"MARKER": str(marker), "SLEEP": str(sleep), "TRIDENT_INLINE_EXECUTION": "never"}
    if next_model:
        params["NEXT"] = next_model
    text = " ".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items())
    write_model(root, name, f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{text}
''', STEP_PY)


def write_deadline_repo(root: Path, marker: Path) -> Path:
    """Write the models above into ``root``; each appends to ``marker``."""
    for name in ("s1", "s2", "s3"):
        _step(root, name, marker, STEP_S)
    steps = []
    for i, name in enumerate(("s1", "s2", "s3")):
        src = "X" if i == 0 else f"t{i}"
        dst = "Y" if i == 2 else f"t{i + 1}"
        steps.append(f'{{ model_name: "{name}" model_version: -1 input_map {{ key: "X" value: "{src}" }} '
                     f'output_map {{ key: "Y" value: "{dst}" }} }}')
    write_ensemble(root, "ens3", f'''
name: "ens3"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
''')
    _step(root, "b1", marker, STEP_S, "b2")
    _step(root, "b2", marker, STEP_S, "b3")
    _step(root, "b3", marker, STEP_S)
    _step(root, "q", marker, QUEUE_STEP_S)
    _step(root, "fast", marker, 0.0)
    return root


def read_markers(marker: Path, request_id: str) -> list[tuple[str, float]]:
    """(model, wall-clock start) of each execution of ``request_id``, in start order."""
    if not marker.exists():
        return []
    rows = []
    for line in marker.read_text().splitlines():
        model, rid, started = line.split(" ")  # a request without an id has an empty field
        if rid == request_id:
            rows.append((model, float(started)))
    return sorted(rows, key=lambda row: row[1])
