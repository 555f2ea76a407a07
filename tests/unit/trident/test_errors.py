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


# ---- the table is the only place an error's status comes from --------------------------------

FRONT_ENDS = ["trident/http", "trident/grpc", "trident/openai", "trident/observability/metrics.py", "trident/server/core.py",
              "trident/serve.py"]
# statuses of the protocol itself, which a front end may name: forbidden by a restriction, no such
# route, method not allowed, timed out, too large, header too large
PROTOCOL_STATUSES = {403, 404, 405, 408, 413, 431}


def _front_end_sources():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[3]
    for entry in FRONT_ENDS:
        path = root / entry
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else [])


def test_front_ends_take_error_statuses_from_the_table():
    import ast

    table_statuses = {errors.http_status(code) for code in Code} - PROTOCOL_STATUSES
    grpc_names = {name for name in vars(errors) if name.startswith("GRPC_") and name != "GRPC_OK"}
    found = []
    for path in _front_end_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in table_statuses:
                found.append(f"{path.name}:{node.lineno}: {node.value}")
            # the gRPC service answers with error codes; protocol statuses are the transport's
            if isinstance(node, ast.Name) and node.id in grpc_names and path.name == "service.py":
                found.append(f"{path.name}:{node.lineno}: {node.id}")
    assert not found, f"HTTP/gRPC error statuses named outside trident/errors.py: {found}"


def test_answers_outside_the_table():
    assert errors.HTTP_NOT_READY == 400
    # Triton's generate endpoints answer 400 for any error a model's response carries
    assert {errors.generate_http_status(code) for code in Code} == {400}
