import pytest

from trident import errors
from trident.errors import Code, TritonError


@pytest.mark.parametrize(
    "code,http,grpc",
    [
        (Code.INVALID_ARG, 400, 3),
        (Code.NOT_FOUND, 404, 5),
        (Code.UNAVAILABLE, 503, 14),
        (Code.UNSUPPORTED, 501, 12),
        (Code.ALREADY_EXISTS, 400, 6),
        (Code.CANCELLED, 400, 1),
        (Code.INTERNAL, 500, 13),
        (Code.UNKNOWN, 400, 2),
    ],
)
def test_table_matches_design(code, http, grpc):
    assert errors.http_status(code) == http
    assert errors.grpc_status(code) == grpc
    e = TritonError(code, "m")
    assert (e.http_status, e.grpc_status, e.message) == (http, grpc, "m")


def test_every_code_is_mapped():
    for code in Code:
        assert errors.http_status(code) >= 400


def test_helpers_carry_codes():
    assert errors.invalid_arg("x").code is Code.INVALID_ARG
    assert errors.not_found("x").code is Code.NOT_FOUND
    assert errors.unavailable("x").code is Code.UNAVAILABLE
    assert errors.unsupported("x").code is Code.UNSUPPORTED
    assert errors.internal("x").code is Code.INTERNAL
    assert errors.cancelled().code is Code.CANCELLED
    assert "INVALID_ARG" in repr(errors.invalid_arg("boom"))
