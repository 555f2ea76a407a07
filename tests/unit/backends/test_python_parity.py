"""Python-backend behaviours Triton's python_backend has, driven without a server: the
instance's asyncio loop, response senders after execute returned, the non-decoupled sender's
rules, bytes BLS model names, BF16 through DLPack, and abandoning stuck calls at exit."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from trident import config as model_config
from trident.backends.base import LoadContext, PlainThreads
from trident.backends.python import _convert, pb_utils
from trident.backends.python._aio import InstanceLoop
from trident.backends.python._pb_tensor import _capsule_dtype
from trident.backends.python.backend import PythonBackend, PythonInstance
from trident.batching import rounds
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTransactionPolicy,
)
from trident.server.execution import InstanceThread
from trident.types import InferenceRequest, InferenceResponse, Tensor


class FakeResponder:
    """What a trident server's Responder offers the backend: ``send`` from any thread."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, bool]] = []
        self.complete = False
        self.deferred = False
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if self.complete:
            raise TritonError(Code.INTERNAL, "the request has already been completed")
        self.sent.append((response, final))
        if final:
            self.complete = True
            self.done.set()


def _load(tmp_path: Path, name: str, code: str, decoupled: bool = False) -> PythonInstance:
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(code))
    config = ModelConfig(
        name=name, backend="python", max_batch_size=0,
        input=[ModelInput(name="X", data_type=DataType.TYPE_INT32, dims=[1])],
        output=[ModelOutput(name="Y", data_type=DataType.TYPE_INT32, dims=[1])],
        model_transaction_policy=ModelTransactionPolicy(decoupled=decoupled),
    )
    ctx = LoadContext(model_name=name, version=1, model_dir=folder, version_dir=folder / "1", config=config,
                      config_json=model_config.config_to_json(config), instance_name=f"{name}_0",
                      instance_kind="KIND_CPU", device_id=0)
    instance = PythonBackend().load_instance(ctx)
    assert isinstance(instance, PythonInstance)
    return instance


def _request(x: int, rid: str = "") -> tuple[InferenceRequest, FakeResponder]:
    request = InferenceRequest(model_name="m", inputs=[Tensor.from_numpy("X", np.array([x], np.int32))], id=rid)
    responder = FakeResponder()
    request.responder = responder
    return request, responder


def _values(responder: FakeResponder) -> list[Any]:
    return [None if r is None else r.outputs[0].data.tolist() if r.outputs else r.error.message if r.error else []
            for r, _ in responder.sent]


# ---- the instance's asyncio loop ----


def test_instance_loop_keeps_tasks_running_between_calls_and_joins_at_close() -> None:
    loop = InstanceLoop("m_0")
    assert not loop.started
    ran = threading.Event()

    async def schedule() -> asyncio.Task[None]:
        async def later() -> None:
            await asyncio.sleep(0.01)
            ran.set()

        return asyncio.create_task(later())

    loop.run(schedule())
    assert ran.wait(10)  # the task ran after run() had returned

    async def forever() -> None:
        await asyncio.sleep(3600)

    async def start_forever() -> asyncio.Task[None]:
        return asyncio.create_task(forever())

    task = loop.run(start_forever())
    thread = loop._thread
    assert thread is not None and thread.is_alive()
    loop.close()
    assert task.cancelled() and not thread.is_alive()
    with pytest.raises(RuntimeError, match="is closed"):
        loop.run(schedule())
    loop.close()  # idempotent


def test_instance_loop_submit_reports_the_outcome() -> None:
    loop = InstanceLoop("m_0")
    got: list[tuple[Any, Any]] = []
    done = threading.Event()

    async def fail() -> None:
        raise ValueError("boom")

    loop.submit(fail(), lambda e, r: (got.append((type(e).__name__, r)), done.set()))
    assert done.wait(10)
    assert got == [("ValueError", None)]
    loop.close()


ASYNC_DECOUPLED = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x < 0:
                raise pb_utils.TritonModelException("negative")
            asyncio.create_task(self.respond(request, x))
        await asyncio.sleep(0)

    async def respond(self, request, x):
        sender = request.get_response_sender()
        for i in range(x):
            await asyncio.sleep(0.005)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([i], np.int32))]))
        asyncio.get_running_loop().call_later(0.01, sender.send, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_async_decoupled_execute_runs_in_the_background(tmp_path: Path) -> None:
    inst = _load(tmp_path, "adec", ASYNC_DECOUPLED, decoupled=True)
    try:
        a, ra = _request(3)
        b, rb = _request(2)
        assert inst.execute([a, b]) is None
        assert ra.done.wait(10) and rb.done.wait(10)
        assert _values(ra) == [[0], [1], [2], None] and _values(rb) == [[0], [1], None]
        bad, rbad = _request(-1)
        assert inst.execute([bad]) is None  # the failure arrives on the request
        assert rbad.done.wait(10)
        assert "negative" in _values(rbad)[0] and rbad.sent[0][0].error.code == Code.INTERNAL  # type: ignore[union-attr]
        assert "adec/1/model.py" in _values(rbad)[0] and "_aio.py" not in _values(rbad)[0]
        thread = inst._aio._thread
        assert thread is not None
    finally:
        inst.finalize()
    assert not thread.is_alive()


# ---- non-decoupled: answered through the sender, now or later ----


LATE = """
import threading, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.later, args=(request,)).start()
        return None

    def later(self, request):
        time.sleep(0.02)
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        try:
            sender = request.get_response_sender()
        except pb_utils.TritonModelException:  # a request without a response channel
            return
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_non_decoupled_none_defers_to_the_sender(tmp_path: Path) -> None:
    inst = _load(tmp_path, "late", LATE)
    try:
        (a, ra), (b, rb) = _request(1), _request(2)
        placeholders = inst.execute([a, b])
        assert placeholders is not None and all(p.error is None for p in placeholders)
        assert ra.deferred and rb.deferred  # the executor sends nothing for them
        assert ra.done.wait(10) and rb.done.wait(10)
        assert _values(ra) == [[2]] and _values(rb) == [[3]]
        # a request that has no response channel can never be answered: an error at once
        lost = InferenceRequest(model_name="m", inputs=[Tensor.from_numpy("X", np.array([0], np.int32))], id="q")
        result = inst.execute([lost])
        assert result is not None and "no final response was sent for request 'q'" in result[0].error.message  # type: ignore[union-attr]
    finally:
        inst.finalize()


def test_non_decoupled_sender_rules() -> None:
    delivered: list[tuple[Any, bool]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, f: delivered.append((r, f)), lambda: False, decoupled=False)
    first, second = pb_utils.InferenceResponse(), pb_utils.InferenceResponse()
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(first)  # without the final flag: the client gets it at once
    assert delivered == [(first, True)]
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(second, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # completes; nothing more to deliver
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert delivered == [(first, True)]

    decoupled: list[tuple[Any, bool]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, f: decoupled.append((r, f)), lambda: False, decoupled=True)
    sender.send(first)
    sender.send(second, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(first)
    assert decoupled == [(first, False), (second, True)]


def test_returned_list_may_leave_requests_to_the_sender(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for i, request in enumerate(requests):
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)])
                if i == 0:
                    out.append(response)
                else:
                    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    out.append(None)
            return out
    """
    inst = _load(tmp_path, "mixed", code)
    try:
        (a, ra), (b, rb) = _request(1), _request(2)
        result = inst.execute([a, b])
        assert result is not None and result[0].outputs[0].data.tolist() == [10]
        assert not ra.deferred and rb.deferred and _values(rb) == [[20]]
    finally:
        inst.finalize()


# ---- BLS model names, BF16 ----


def test_bls_model_name_may_be_bytes() -> None:
    assert pb_utils.InferenceRequest(model_name=b"add_sub")._model_name == "add_sub"
    assert pb_utils.InferenceRequest(model_name=np.array([b"add_sub"], dtype=object)[0])._model_name == "add_sub"
    assert type(pb_utils.InferenceRequest(model_name=np.str_("m"))._model_name) is str
    with pytest.raises(pb_utils.TritonModelException, match="not valid UTF-8"):
        pb_utils.InferenceRequest(model_name=b"\xff")
    with pytest.raises(pb_utils.TritonModelException, match="model_name must be a str"):
        pb_utils.InferenceRequest(model_name=3)  # type: ignore[arg-type]
    converted = _convert.to_request(pb_utils.InferenceRequest(model_name=b"add_sub"))
    assert converted.model_name == "add_sub"


def test_bf16_has_no_numpy_form_but_travels_through_dlpack() -> None:
    bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)
    tensor = pb_utils.Tensor._wrap("X", bits, "BF16")
    with pytest.raises(pb_utils.TritonModelException, match="tensor dtype is bf16 and cannot be converted to numpy"):
        tensor.as_numpy()
    assert tensor.triton_dtype() == 14
    capsule = tensor.to_dlpack()
    dtype = _capsule_dtype(capsule)
    assert dtype is not None and (dtype.code, dtype.bits, dtype.lanes) == (4, 16, 1)  # kDLBfloat 16
    back = pb_utils.Tensor.from_dlpack("Y", capsule)
    assert back._datatype == "BF16" and back.triton_dtype() == 14
    assert back._array.tolist() == bits.tolist() and np.shares_memory(back._array, bits)
    again = pb_utils.Tensor.from_dlpack("Z", tensor)  # an object with __dlpack__ (DLPack 1.0 capsule)
    assert again._datatype == "BF16" and again._array.tolist() == bits.tolist()
    readonly = bits.copy()
    readonly.flags.writeable = False
    assert pb_utils.Tensor.from_dlpack("R", pb_utils.Tensor._wrap("R", readonly, "BF16"))._datatype == "BF16"
    # a BF16 output reaches the response as BF16 bit patterns
    converted = _convert.to_tensor(back)
    assert converted.datatype == "BF16" and converted.data.tolist() == bits.tolist()
    # other dtypes are untouched by the bf16 rewrite
    plain = pb_utils.Tensor.from_dlpack("P", pb_utils.Tensor("P", np.arange(3, dtype=np.uint16)))
    assert plain._datatype == "UINT16" and plain.as_numpy().tolist() == [0, 1, 2]


# ---- abandoning a stuck call at the server's exit ----


async def test_instance_thread_abandon_frees_the_waiting_caller() -> None:
    thread = InstanceThread("stuck-test", PlainThreads())
    release = threading.Event()
    error = TritonError(Code.CANCELLED, "given up")
    outcome: list[Any] = []

    async def call() -> None:
        try:
            await thread.run(release.wait)
        except TritonError as e:
            outcome.append(e)

    away = rounds.current()  # a call on the thread keeps the loop from busy polling
    assert await thread.run(sum, [1, 2]) == 3 and away.away == 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.sleep(0.05)
        assert away.away == 1
        with trio.CancelScope(shield=True):
            assert thread.abandon(error) == 1
    assert outcome == [error] and away.away == 0
    with pytest.raises(TritonError, match="given up"):
        await thread.run(time.time)
    release.set()  # the stuck call returns later: nothing is rescheduled (or counted) twice
    await trio.sleep(0.05)
    assert away.away == 0
    thread.close()
