"""Warmup samples (zero/random/file data) and running them on an instance."""

from pathlib import Path

import numpy as np
import pytest

from trident.batching.warmup import warm_up, warmup_samples
from trident.errors import Code, TritonError
from trident.protocol.datatypes import serialize_bytes
from trident.protocol.pbtxt import parse_pbtxt
from trident.server.execution import InstanceThread
from trident.server.worker_threads import open_thread_nursery
from trident.types import InferenceResponse


def config(warmups: str, max_batch_size: int = 4):
    return parse_pbtxt(
        f'name: "m" max_batch_size: {max_batch_size} '
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ] '
        + warmups
    )


def test_zero_and_random_data(tmp_path: Path):
    c = config('model_warmup [ { name: "zeros" batch_size: 3 count: 2 inputs { key: "A" value { data_type: TYPE_FP32 '
               'dims: [ 5 ] zero_data: true } } inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ] '
               'random_data: true } } }, { name: "rand" batch_size: 1 inputs { key: "A" value { '
               "data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } }, "
               '{ name: "skipped" batch_size: 0 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 2 ] '
               "zero_data: true } } } ]")
    zeros, rand = warmup_samples(c, tmp_path, seed=1)
    assert (zeros.name, zeros.batch_size, zeros.count) == ("zeros", 3, 2)
    a, s = zeros.inputs
    assert a.shape == (1, 5) and a.datatype == "FP32" and not a.data.any()
    assert s.shape == (1, 2) and s.data.tolist() == [[b"", b""]]
    assert rand.count == 1 and rand.inputs[0].shape == (1, 2) and rand.inputs[0].data.dtype == np.float32
    requests = zeros.requests("m")
    assert len(requests) == 3 and requests[0].id == "warmup:zeros" and requests[0].inputs[0].data is a.data


def test_no_batch_dimension_for_non_batching_models(tmp_path: Path):
    c = config('model_warmup { name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 3 ] '
               "zero_data: true } } }", max_batch_size=0)
    (sample,) = warmup_samples(c, tmp_path)
    assert sample.inputs[0].shape == (3,)


def test_input_data_files(tmp_path: Path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.raw").write_bytes(np.arange(4, dtype=np.float32).tobytes() + b"extra")
    (tmp_path / "warmup" / "s.raw").write_bytes(serialize_bytes(np.array([b"hi", b"there"], dtype=object)))
    c = config('model_warmup { name: "f" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 4 ] '
               'input_data_file: "a.raw" } } inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ] '
               'input_data_file: "s.raw" } } }')
    (sample,) = warmup_samples(c, tmp_path)
    assert sample.inputs[0].data.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert sample.inputs[1].data.tolist() == [[b"hi", b"there"]]


@pytest.mark.parametrize("warmup,match", [
    ('{ name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } }',
     "all variable-size dimensions are specified for input 'A'"),
    ('{ name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 2 ] } } }',
     "expects input 'A' to have input_data_type set"),
    ('{ name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 8 ] '
     'input_data_file: "short.raw" } } }', "expects 32 bytes, but the data provided from short.raw only has 4 bytes"),
    ('{ name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 1 ] '
     'input_data_file: "missing.raw" } } }', "failed to read warmup data file 'missing.raw'"),
    ('{ name: "w" batch_size: 1 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 1 ] '
     'input_data_file: "../config.pbtxt" } } }', "must be inside the model's warmup folder"),
    ('{ name: "w" batch_size: 9 inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }',
     "batch_size 9, more than the model's max batch size 4"),
])
def test_bad_settings(tmp_path: Path, warmup, match):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.raw").write_bytes(b"\0" * 4)
    with pytest.raises(TritonError, match=match):
        warmup_samples(config(f"model_warmup [ {warmup} ]"), tmp_path)


class Instance:
    def __init__(self, fail_on: int | None = None, error_response: bool = False) -> None:
        self.calls: list[int] = []
        self.fail_on = fail_on
        self.error_response = error_response

    def execute(self, requests):
        self.calls.append(len(requests))
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("boom")
        if self.error_response:
            return [InferenceResponse(error=TritonError(Code.INTERNAL, "bad output")) if i == 0
                    else InferenceResponse() for i in range(len(requests))]
        return [InferenceResponse() for _ in requests]


def _samples(tmp_path):
    c = config('model_warmup [ { name: "one" batch_size: 2 count: 3 inputs { key: "A" value { data_type: TYPE_FP32 '
               'dims: [ 1 ] zero_data: true } } inputs { key: "S" value { data_type: TYPE_STRING dims: [ 2 ] '
               'zero_data: true } } } ]')
    return warmup_samples(c, tmp_path)


async def _run(instance, samples, validate=lambda r: 1):
    async with open_thread_nursery() as threads:  # as a model version owns its instance threads
        thread = InstanceThread("warmup-test", threads)
        try:
            await warm_up(instance, samples, model_name="m", decoupled=False, validate=validate,
                          make_pending=lambda r: None, thread=thread)
        finally:
            thread.close()


async def test_runs_each_sample_count_times_as_one_batch(tmp_path):
    inst = Instance()
    await _run(inst, _samples(tmp_path))
    assert inst.calls == [2, 2, 2]


async def test_failures_name_the_sample(tmp_path):
    with pytest.raises(TritonError, match="warmup sample 'one' of model 'm' failed: RuntimeError: boom"):
        await _run(Instance(fail_on=2), _samples(tmp_path))

    with pytest.raises(TritonError, match="warmup sample 'one' of model 'm' failed: bad output"):
        await _run(Instance(error_response=True), _samples(tmp_path))

    def refuse(request):
        raise TritonError(Code.INVALID_ARG, "unexpected shape")

    with pytest.raises(TritonError, match="failed: unexpected shape"):
        await _run(Instance(), _samples(tmp_path), validate=refuse)
