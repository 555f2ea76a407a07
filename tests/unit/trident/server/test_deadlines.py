"""The deadline decisions (trident.server.deadlines) and the BLS inheritance rule."""

from __future__ import annotations

import pytest

from trident.backends.python._runtime import inherited_deadline
from trident.errors import Code, TritonError
from trident.server.deadlines import (
    MAX_TIMEOUT_US,
    apply_timeout_parameter,
    cancel_reason,
    timeout_expired,
    timeout_us,
)
from trident.types import InferenceRequest


def request(**parameters: object) -> InferenceRequest:
    return InferenceRequest("m", [], parameters=dict(parameters))  # type: ignore[arg-type]


def test_timeout_parameter_values():
    assert timeout_us({}) == 0
    assert timeout_us({"timeout": 0}) == 0  # Triton's "no timeout"
    assert timeout_us({"timeout": 250}) == 250
    assert timeout_us({"timeout": MAX_TIMEOUT_US}) == MAX_TIMEOUT_US
    for bad in (-1, MAX_TIMEOUT_US + 1, "100", 1.5, True, None):
        with pytest.raises(TritonError) as e:
            timeout_us({"timeout": bad})
        assert e.value.code is Code.INVALID_ARG and "timeout" in e.value.message


def test_apply_keeps_the_earlier_deadline():
    r = request(timeout=200_000)
    apply_timeout_parameter(r, 10.0)
    assert r.deadline == pytest.approx(10.2)
    r = request(timeout=200_000)
    r.deadline = 10.1  # a gRPC deadline that comes first
    apply_timeout_parameter(r, 10.0)
    assert r.deadline == 10.1
    r = request(timeout=200_000)
    r.deadline = 99.0
    apply_timeout_parameter(r, 10.0)
    assert r.deadline == pytest.approx(10.2)
    r = request(timeout=0)
    apply_timeout_parameter(r, 10.0)
    assert r.deadline is None


def test_timeout_expired_is_triton_queue_timeout():
    e = timeout_expired()
    assert e.code is Code.UNAVAILABLE and e.message == "Request timeout expired"


def test_bls_child_inherits_the_latest_parent_deadline():
    a, b, c = request(), request(), request()
    assert inherited_deadline([]) is None
    assert inherited_deadline([a]) is None
    a.deadline, b.deadline = 5.0, 7.0
    assert inherited_deadline([a, b]) == 7.0  # it serves both
    assert inherited_deadline([a, b, c]) is None  # one parent has all the time it needs


def test_cancel_reason():
    r = request(timeout=1000)
    apply_timeout_parameter(r, 10.0)
    assert cancel_reason(r, 10.0005) == "CANCELED"  # cancelled before its timeout: the client left
    assert cancel_reason(r, 10.001) == "REJECTED"  # its timeout ran out: Triton's queue-timeout reason
    g = request()
    g.deadline = 10.0  # a gRPC deadline: the client left, as before deadlines
    assert cancel_reason(g, 11.0) == "CANCELED"
