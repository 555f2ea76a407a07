"""Triton's error codes and the one table that maps them to HTTP and gRPC statuses.

No other module names an HTTP status number or a gRPC status code for an inference error:
front ends call :func:`http_status` / :func:`grpc_status` with the error's code, and the two
answers Triton gives outside the table come from here too (:data:`HTTP_NOT_READY`,
:func:`generate_http_status`). A front end names only protocol statuses itself (no such
route, method not allowed, forbidden by a restriction, too large, timed out);
``tests/unit/trident/test_errors.py`` reads the front ends' source to hold them to it.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Triton's error codes (TRITONSERVER_Error_Code)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# gRPC status codes by number (grpc/status.h); the names are the canonical ones.
GRPC_OK = 0
GRPC_CANCELLED = 1
GRPC_UNKNOWN = 2
GRPC_INVALID_ARGUMENT = 3
GRPC_DEADLINE_EXCEEDED = 4
GRPC_NOT_FOUND = 5
GRPC_ALREADY_EXISTS = 6
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_UNIMPLEMENTED = 12
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14

# code -> (HTTP status, gRPC status). The only table of its kind in trident.
_TABLE: dict[Code, tuple[int, int]] = {
    Code.INVALID_ARG: (400, GRPC_INVALID_ARGUMENT),
    Code.NOT_FOUND: (404, GRPC_NOT_FOUND),
    Code.UNAVAILABLE: (503, GRPC_UNAVAILABLE),
    Code.UNSUPPORTED: (501, GRPC_UNIMPLEMENTED),
    Code.ALREADY_EXISTS: (400, GRPC_ALREADY_EXISTS),
    Code.CANCELLED: (400, GRPC_CANCELLED),
    Code.INTERNAL: (500, GRPC_INTERNAL),
    Code.UNKNOWN: (400, GRPC_UNKNOWN),
}


#: Triton's HTTP answer to a health or readiness probe that is not live/ready (server or model)
HTTP_NOT_READY = 400


def generate_http_status(code: Code) -> int:
    """HTTP status of an error a model's response carries on ``/generate`` and
    ``/generate_stream``: 400 whatever its code, as Triton answers (tritonserver 2.51: a Python
    model's INTERNAL error is 400 there, 500 on ``/infer``)."""
    return 400


def http_status(code: Code) -> int:
    """HTTP status for a Triton error code (Triton's ``HttpCodeFromError``)."""
    return _TABLE[code][0]


def grpc_status(code: Code) -> int:
    """gRPC status number for a Triton error code (Triton's ``grpc_utils.cc``)."""
    return _TABLE[code][1]


class TritonError(Exception):
    """An error with a Triton code; the message is what the client sees."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"

    #: seconds a client should wait before it tries again (HTTP ``Retry-After``); 0: not said
    retry_after_s = 0

    @property
    def http_status(self) -> int:
        return http_status(self.code)

    @property
    def grpc_status(self) -> int:
        return grpc_status(self.code)


def invalid_arg(message: str) -> TritonError:
    return TritonError(Code.INVALID_ARG, message)


def not_found(message: str) -> TritonError:
    return TritonError(Code.NOT_FOUND, message)


def unavailable(message: str) -> TritonError:
    return TritonError(Code.UNAVAILABLE, message)


def overloaded(message: str, retry_after_s: int) -> TritonError:
    """UNAVAILABLE for a request refused because the model is overloaded (load shedding), with
    the seconds to wait before trying again (at least 1)."""
    error = TritonError(Code.UNAVAILABLE, message)
    error.retry_after_s = max(1, int(retry_after_s))
    return error


def unsupported(message: str) -> TritonError:
    return TritonError(Code.UNSUPPORTED, message)


def internal(message: str) -> TritonError:
    return TritonError(Code.INTERNAL, message)


def cancelled(message: str = "request cancelled") -> TritonError:
    return TritonError(Code.CANCELLED, message)
