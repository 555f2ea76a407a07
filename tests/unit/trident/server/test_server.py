"""The Server facade in-process (no sockets): lifecycle, inference, validation, cancellation."""

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import trio

from trident.errors import Code, TritonError
from trident.options import EXAMPLE_REPOSITORY, ServerOptions
from trident.server import open_server
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor, TensorMetadata


def add_sub_request(batch=1, **kw):
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b = np.ones((batch, 16), dtype=np.float32)
    return InferenceRequest("add_sub", [Tensor.from_numpy("INPUT0", a), Tensor.from_numpy("INPUT1", b)], **kw), a, b


async def test_example_repository_serves_add_sub():
    async with open_server(ServerOptions()) as server:
        assert server.is_live() and server.is_ready()
        assert {e.name for e in server.repository_index()} == {"add_sub", "identity_fp32", "bytes_echo"}
        req, a, b = add_sub_request(3, id="r1")
        resp = await server.infer(req)
        assert resp.model_name == "add_sub" and resp.model_version == "1" and resp.id == "r1"
        np.testing.assert_array_equal(resp.output("OUTPUT0").data, a + b)
        np.testing.assert_array_equal(resp.output("OUTPUT1").data, a - b)
        meta = server.model_metadata("add_sub")
        assert meta.inputs[0] == TensorMetadata("INPUT0", "FP32", (-1, 16))
        assert meta.versions == ("1",) and meta.platform == "python"
        stats = server.model_statistics("add_sub")[0]
        assert stats.success.count == 1 and stats.inference_count == 3 and stats.execution_count == 1


async def test_output_selection_and_bytes():
    async with open_server(ServerOptions()) as server:
        req, a, b = add_sub_request(outputs=[RequestedOutput("OUTPUT1")])
        resp = await server.infer(req)
        assert [t.name for t in resp.outputs] == ["OUTPUT1"]
        x = np.array([[b"ab", b"xyz"]], dtype=object)
        resp = await server.infer(InferenceRequest("bytes_echo", [Tensor.from_numpy("INPUT0", x)]))
        assert resp.output("OUTPUT0").data.tolist() == [[b"AB", b"XYZ"]]
        assert resp.output("OUTPUT1").data.tolist() == [[2, 3]]


@pytest.mark.parametrize(
    "mutate,code,fragment",
    [
        (lambda r: r.inputs.pop(), "INVALID_ARG", "missing required input(s) ['INPUT1']"),
        (lambda r: r.inputs.append(Tensor.from_numpy("EXTRA", np.zeros((1, 16), np.float32))), "INVALID_ARG",
         "unexpected inference input 'EXTRA'"),
        (lambda r: setattr(r, "inputs", [Tensor.from_numpy("INPUT0", np.zeros((1, 16), np.int32)), r.inputs[1]]),
         "INVALID_ARG", "data-type is 'INT32', but model 'add_sub' expects 'FP32'"),
        (lambda r: setattr(r, "inputs", [Tensor.from_numpy("INPUT0", np.zeros((1, 15), np.float32)), r.inputs[1]]),
         "INVALID_ARG", "unexpected shape for input 'INPUT0'"),
        (lambda r: setattr(r, "outputs", [RequestedOutput("NOPE")]), "INVALID_ARG", "unexpected inference output"),
        (lambda r: setattr(r, "model_version", "7"), "NOT_FOUND", "version 7"),
        (lambda r: setattr(r, "model_name", "nope"), "NOT_FOUND", "unknown model"),
    ],
)
async def test_bad_requests(mutate, code, fragment):
    async with open_server(ServerOptions()) as server:
        req, _, _ = add_sub_request()
        mutate(req)
        with pytest.raises(TritonError) as e:
            await server.infer(req)
        assert e.value.code.name == code and fragment in e.value.message


async def test_batch_too_large():
    async with open_server(ServerOptions()) as server:
        req, _, _ = add_sub_request(9)
        with pytest.raises(TritonError, match="batch-size must be <= 8"):
            await server.infer(req)


def _slow_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\noutput [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n'
    )
    (repo / "slow" / "1" / "model.py").write_text(
        "import time\nimport triton_python_backend_utils as pb_utils\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        out = []\n"
        "        for r in requests:\n"
        "            x = pb_utils.get_input_tensor_by_name(r, 'X').as_numpy()\n"
        "            deadline = time.monotonic() + float(x[0])\n"
        "            while time.monotonic() < deadline and not r.is_cancelled():\n"
        "                time.sleep(0.005)\n"
        "            out.append(pb_utils.InferenceResponse([pb_utils.Tensor('Y', x)]))\n"
        "        return out\n"
    )
    return repo


async def test_cancelled_queued_request_is_never_executed(tmp_path):
    opts = ServerOptions(model_repositories=[str(_slow_repo(tmp_path))])
    async with open_server(opts) as server:
        busy = InferenceRequest("slow", [Tensor.from_numpy("X", np.array([0.3], np.float32))])
        queued = InferenceRequest("slow", [Tensor.from_numpy("X", np.array([0.0], np.float32))])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.infer, busy)
            await trio.sleep(0.05)
            with trio.move_on_after(0.05):
                await server.infer(queued)
        assert queued.cancelled
        mv = server.repository.get("slow")
        stats = mv.stats.snapshot()
        assert stats.execution_count == 1 and stats.success.count == 1
        assert stats.fail.count == 1 and stats.cancelled == 1 and mv.dropped == 1


async def test_running_request_sees_cancellation(tmp_path):
    opts = ServerOptions(model_repositories=[str(_slow_repo(tmp_path))])
    async with open_server(opts) as server:
        req = InferenceRequest("slow", [Tensor.from_numpy("X", np.array([30.0], np.float32))])
        with trio.fail_after(10):
            with trio.move_on_after(0.2):
                await server.infer(req)
        # the model polled is_cancelled() and returned early: the worker is free again
        with trio.fail_after(10):
            quick = InferenceRequest("slow", [Tensor.from_numpy("X", np.array([0.0], np.float32))])
            resp = await server.infer(quick)
        assert resp.output("Y").data.tolist() == [0.0]
        assert server.repository.get("slow").stats.snapshot().cancelled == 1


async def test_broken_config_is_unavailable_with_reason(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: [\n')
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        rows = {e.name: e for e in server.repository_index()}
        assert rows["broken"].state == "UNAVAILABLE" and "config.pbtxt:" in rows["broken"].reason
        assert rows["add_sub"].state == "READY"
        assert not server.is_ready()  # strict readiness
        with pytest.raises(TritonError) as e:
            await server.infer(InferenceRequest("broken", []))
        assert e.value.code.name == "UNAVAILABLE" and "config.pbtxt:" in e.value.message
        req, a, b = add_sub_request()
        assert (await server.infer(req)).output("OUTPUT0") is not None


async def test_explicit_load_unload_and_override(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")
    opts = ServerOptions(model_repositories=[str(repo)], model_control_mode="explicit")
    async with open_server(opts) as server:
        assert [(e.name, e.state) for e in server.repository_index()] == [("add_sub", "")]
        await server.load_model("add_sub")
        assert server.model_ready("add_sub")
        await server.unload_model("add_sub")
        assert not server.model_ready("add_sub")
        assert server.repository_index()[0].state == "UNAVAILABLE"
        assert server.repository_index()[0].reason == "unloaded"
        # config override + files in a fresh folder
        code = (EXAMPLE_REPOSITORY / "identity_fp32" / "1" / "model.py").read_bytes()
        cfg = ('{"name":"ident2","backend":"python","max_batch_size":0,'
               '"input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[-1]}],'
               '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[-1]}]}')
        await server.load_model("ident2", cfg, {"1/model.py": code})
        resp = await server.infer(InferenceRequest("ident2", [Tensor.from_numpy("INPUT0", np.ones(3, np.float32))]))
        assert resp.output("OUTPUT0").data.tolist() == [1.0, 1.0, 1.0]
        for bad in ("../x.py", "/etc/passwd", "1/../../x.py"):
            with pytest.raises(TritonError) as e:
                await server.load_model("ident3", cfg.replace("ident2", "ident3"), {bad: b"x"})
            assert e.value.code.name == "INVALID_ARG"
        with pytest.raises(TritonError):
            await server.load_model("../add_sub")
        with pytest.raises(TritonError):
            await server.load_model("nope")


async def test_load_refused_outside_explicit_mode():
    async with open_server(ServerOptions()) as server:
        with pytest.raises(TritonError) as e:
            await server.load_model("add_sub")
        assert e.value.code.name == "UNSUPPORTED"


async def test_poll_mode_reload_keeps_serving_and_failed_reload_keeps_old(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "identity_fp32")
    opts = ServerOptions(model_repositories=[str(repo)], model_control_mode="poll", repository_poll_secs=3600)
    async with open_server(opts) as server:
        req = lambda: InferenceRequest("identity_fp32", [Tensor.from_numpy("INPUT0", np.ones(2, np.float32))])  # noqa: E731
        first = server.repository.get("identity_fp32")
        model_py = repo / "identity_fp32" / "1" / "model.py"
        model_py.write_text(model_py.read_text().replace('pb_utils.Tensor("OUTPUT0", x)', 'pb_utils.Tensor("OUTPUT0", x * 2)'))
        await server.repository.poll_once()
        second = server.repository.get("identity_fp32")
        assert second is not first
        assert (await server.infer(req())).output("OUTPUT0").data.tolist() == [2.0, 2.0]
        (repo / "identity_fp32" / "config.pbtxt").write_text("max_batch_size: oops")
        await server.repository.poll_once()
        assert server.repository.get("identity_fp32") is second  # old version still serving
        assert (await server.infer(req())).output("OUTPUT0").data.tolist() == [2.0, 2.0]
        shutil.rmtree(repo / "identity_fp32")
        await server.repository.poll_once()
        with pytest.raises(TritonError):
            server.repository.get("identity_fp32")


async def test_public_in_process_api():
    import trident

    async with trident.open_server(trident.ServerOptions()) as server:
        x = np.arange(4, dtype=np.float32)
        resp = await server.infer(trident.InferenceRequest("identity_fp32", [trident.Tensor.from_numpy("INPUT0", x)]))
        np.testing.assert_array_equal(resp.output("OUTPUT0").data, x)
    with pytest.raises(AttributeError):
        trident.nope  # noqa: B018


async def test_unloading_a_model_joins_its_threads(tmp_path: Path) -> None:
    # an async Python model: its instance thread and its asyncio loop thread are owned by the
    # model version and gone once it is unloaded
    import threading

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "aio")
    config = (repo / "aio" / "config.pbtxt").read_text().replace('name: "identity_fp32"', 'name: "aio"')
    (repo / "aio" / "config.pbtxt").write_text(config + '\nparameters { key: "TRIDENT_INLINE_EXECUTION" '
                                                         'value: { string_value: "never" } }\n')
    model = repo / "aio" / "1" / "model.py"
    source = model.read_text()
    assert "def execute(self, requests)" in source
    model.write_text(source.replace("def execute(self, requests)", "async def execute(self, requests)"))
    options = ServerOptions(model_repositories=[str(repo)], model_control_mode="explicit", load_models=["aio"])
    async with open_server(options) as server:
        x = np.arange(4, dtype=np.float32)
        response = await server.infer(InferenceRequest("aio", [Tensor.from_numpy("INPUT0", x)]))
        np.testing.assert_array_equal(response.output("OUTPUT0").data, x)
        names = {t.name for t in threading.enumerate()}
        assert "trident-aio-0" in names and any(n.startswith("trident-asyncio-aio") for n in names)
        await server.unload_model("aio")
        names = {t.name for t in threading.enumerate()}
        assert "trident-aio-0" not in names and not any(n.startswith("trident-asyncio-aio") for n in names)


async def test_infer_now_answers_at_once_or_hands_back_what_finishes_the_request(tmp_path, caplog):
    """Server.infer_now: an idle instance running inline answers synchronously; a batching model
    or a call on the instance's thread gives an awaitable that finishes the request; a bad
    request raises at once; nothing is left admitted. (With --log-verbose every request takes
    the logged, awaited way: the level is set here, whatever earlier tests left.)"""
    caplog.set_level(logging.INFO, logger="trident.server")
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")
    for name, mode in (("inline", "always"), ("threaded", "never")):
        shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / name)
        config = (repo / name / "config.pbtxt").read_text().replace('name: "identity_fp32"', f'name: "{name}"')
        config += f'parameters {{ key: "TRIDENT_INLINE_EXECUTION" value: {{ string_value: "{mode}" }} }}\n'
        (repo / name / "config.pbtxt").write_text(config)
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        x = np.arange(4, dtype=np.float32)
        for _ in range(3):
            now = server.infer_now(InferenceRequest("inline", [Tensor.from_numpy("INPUT0", x)]))
            assert isinstance(now, InferenceResponse)
            np.testing.assert_array_equal(now.output("OUTPUT0").data, x)
            later = server.infer_now(InferenceRequest("threaded", [Tensor.from_numpy("INPUT0", x)]))
            assert not isinstance(later, InferenceResponse)
            np.testing.assert_array_equal((await later).output("OUTPUT0").data, x)
        req, a, b = add_sub_request(2)
        batched = server.infer_now(req)  # the dynamic batcher: never here and now
        assert not isinstance(batched, InferenceResponse)
        np.testing.assert_array_equal((await batched).output("OUTPUT0").data, a + b)
        bad = InferenceRequest("inline", [Tensor.from_numpy("INPUT0", x.astype(np.int32))])
        with pytest.raises(TritonError) as caught:
            server.infer_now(bad)
        assert caught.value.code.name == "INVALID_ARG"
        with pytest.raises(TritonError) as caught:
            server.infer_now(InferenceRequest("missing", [Tensor.from_numpy("INPUT0", x)]))
        assert caught.value.code.name in ("NOT_FOUND", "UNAVAILABLE")
        assert await server.wait_drained(1)  # every admission was released
        for name in ("inline", "threaded"):
            stats = server.model_statistics(name)[0]
            assert stats.success.count == 3 and stats.fail.count == 0


_INLINE_MODES = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            mode = int(x[0])
            answer = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x * 2)])
            if mode == 1:
                raise RuntimeError("mode 1 fails")
            if mode == 2:  # answered through the sender before execute returns
                request.get_response_sender().send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                out.append(None)
            elif mode == 3:  # answered later, from a thread of the model's
                sender = request.get_response_sender()
                threading.Timer(0.05, sender.send, (answer,),
                                {"flags": pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL}).start()
                out.append(None)
            elif mode == 4:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("mode 4 refuses")))
            else:
                out.append(answer)
        return out
'''


async def test_an_inline_request_is_answered_however_the_model_answers(tmp_path, caplog):
    """A request run inline by infer_now gets the model's response whether execute returns it,
    raises, returns an error response, or answers through the response sender now or later;
    the statistics count each, and nothing is left in flight. (With --log-verbose every request
    takes the logged, awaited way: the level is set here, whatever earlier tests left.)"""
    caplog.set_level(logging.INFO, logger="trident.server")
    repo = tmp_path / "repo"
    (repo / "modes" / "1").mkdir(parents=True)
    (repo / "modes" / "1" / "model.py").write_text(_INLINE_MODES)
    (repo / "modes" / "config.pbtxt").write_text(
        'name: "modes"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
        'parameters { key: "TRIDENT_INLINE_EXECUTION" value: { string_value: "always" } }\n')

    def request(mode: int) -> InferenceRequest:
        return InferenceRequest("modes", [Tensor.from_numpy("INPUT0", np.array([mode, 5], np.float32))], id=f"m{mode}")

    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        for mode in (0, 2):  # returned, or sent before execute returned: answered here and now
            now = server.infer_now(request(mode))
            assert isinstance(now, InferenceResponse) and now.id == f"m{mode}" and now.model_name == "modes"
            np.testing.assert_array_equal(now.output("OUTPUT0").data, [2 * mode, 10])
        later = server.infer_now(request(3))
        assert not isinstance(later, InferenceResponse)
        response = await later
        np.testing.assert_array_equal(response.output("OUTPUT0").data, [6, 10])
        for mode, text in ((1, "mode 1 fails"), (4, "mode 4 refuses")):
            with pytest.raises(TritonError) as caught:
                server.infer_now(request(mode))
            assert text in caught.value.message
        assert await server.wait_drained(1)
        stats = server.model_statistics("modes")[0]
        assert stats.success.count == 3 and stats.fail.count == 2
        assert stats.execution_count == 5 and stats.inference_count == 5


@pytest.mark.parametrize("workers", [0, 2])
async def test_the_in_process_server_is_one_process(workers):
    with pytest.raises(TritonError) as e:
        async with open_server(ServerOptions(workers=workers)):
            pass
    assert e.value.code is Code.UNSUPPORTED and "trident serve --workers" in e.value.message
