"""Response cache: config parsing, 64-bit keys, LRU by bytes, statistics."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.batching.cache import ResponseCache, parse_cache_config, request_key
from trident.errors import Code, TritonError
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor


def req(x, name="x", outputs=()):
    return InferenceRequest("m", [Tensor.from_numpy(name, np.asarray(x))], outputs=list(outputs))


def resp(n_floats, value=1.0):
    return InferenceResponse(outputs=[Tensor.from_numpy("y", np.full(n_floats, value, np.float32))],
                             parameters={"p": 1})


def test_parse_cache_config():
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1048576"]).size == 1048576
    for bad, match in [(["local"], "expects"), (["redis,host=x"], "not supported"), (["local,size=x"], "invalid"),
                       (["local,cap=3"], "unknown"), (["local,size=-1"], "invalid")]:
        with pytest.raises(ValueError, match=match):
            parse_cache_config(bad)


def test_key_covers_model_version_inputs_and_requested_outputs():
    base = request_key("m", 1, req([1.0, 2.0]))
    assert base == request_key("m", 1, req([1.0, 2.0]))
    assert 0 <= base < 2**64
    different = [
        request_key("n", 1, req([1.0, 2.0])),
        request_key("m", 2, req([1.0, 2.0])),
        request_key("m", 1, req([1.0, 3.0])),
        request_key("m", 1, req([[1.0, 2.0]])),  # shape
        request_key("m", 1, req(np.array([1, 2], np.float32))),  # datatype
        request_key("m", 1, req([1.0, 2.0], name="z")),
        request_key("m", 1, req([1.0, 2.0], outputs=[RequestedOutput("y")])),
        request_key("m", 1, req([1.0, 2.0], outputs=[RequestedOutput("y", {"classification": 2})])),
    ]
    assert base not in different and len(set(different)) == len(different)
    # binary_data only changes the wire encoding, not the answer
    assert request_key("m", 1, req([1.0], outputs=[RequestedOutput("y", {"binary_data": True})])) == \
        request_key("m", 1, req([1.0], outputs=[RequestedOutput("y", {"binary_data": False})]))


def test_key_of_bytes_and_non_contiguous_inputs():
    a = np.array([b"ab", b"c"], dtype=object)
    assert request_key("m", 1, req(a)) == request_key("m", 1, req(a.copy()))
    assert request_key("m", 1, req(a)) != request_key("m", 1, req(np.array([b"a", b"bc"], dtype=object)))
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert request_key("m", 1, req(m.T)) == request_key("m", 1, req(np.ascontiguousarray(m.T)))
    assert request_key("m", 1, req(np.zeros((0, 3), np.float32))) != request_key("m", 1, req(np.zeros((3, 0))))


@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=8))
def test_key_is_deterministic(values):
    assert request_key("m", 1, req(np.array(values, np.float32))) == request_key(
        "m", 1, req(np.array(values, np.float32)))


def test_hit_returns_a_fresh_copy():
    cache = ResponseCache(10_000)
    original = resp(4)
    assert cache.lookup(7) is None
    assert cache.insert(7, original)
    original.outputs[0].data[:] = 5  # the cache kept its own copy
    hit = cache.lookup(7)
    assert hit is not None and hit.outputs[0].data.tolist() == [1.0] * 4 and hit.parameters == {"p": 1}
    hit.outputs.clear()
    assert cache.lookup(7).outputs[0].name == "y"
    assert not cache.insert(7, resp(4))  # already there
    assert not cache.insert(8, InferenceResponse(error=TritonError(Code.INTERNAL, "x")))


def test_lru_eviction_by_bytes():
    entry = 128 + 64 + 400  # overhead + tensor overhead + 100 floats
    cache = ResponseCache(3 * entry)
    for k in range(3):
        assert cache.insert(k, resp(100))
    assert cache.lookup(0) is not None  # 0 becomes most recent
    assert cache.insert(3, resp(100))  # evicts 1, the least recently used
    assert 1 not in cache and 0 in cache and 2 in cache and 3 in cache
    assert not cache.insert(9, resp(1000))  # larger than the cache: not stored
    s = cache.statistics()
    assert (s.entries, s.used, s.capacity, s.inserts, s.evictions) == (3, 3 * entry, 3 * entry, 4, 1)
    assert (s.lookups, s.hits, s.misses) == (1, 1, 0) and s.utilization == 1.0
    assert ResponseCache(0).statistics().utilization == 0.0
