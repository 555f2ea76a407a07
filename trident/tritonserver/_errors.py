"""The exception classes of Triton's ``tritonserver`` package, and the one mapping from
trident's error codes (:class:`trident.errors.Code`) to them.

Each class stands for one Triton error code (``TRITONSERVER_Error_Code``), as in Triton's
package: CANCELLED has no class of its own there and is an :class:`UnknownError`.
"""

from __future__ import annotations

from trident.errors import Code
from trident.errors import TritonError as CoreError


class TritonError(Exception):
    """Base class of every error the API raises (Triton: ``tritonserver.TritonError``)."""


class UnknownError(TritonError):
    """TRITONSERVER_ERROR_UNKNOWN (and CANCELLED, as Triton's package maps it)."""


class InternalError(TritonError):
    """TRITONSERVER_ERROR_INTERNAL."""


class NotFoundError(TritonError):
    """TRITONSERVER_ERROR_NOT_FOUND."""


class InvalidArgumentError(TritonError):
    """TRITONSERVER_ERROR_INVALID_ARG."""


class UnavailableError(TritonError):
    """TRITONSERVER_ERROR_UNAVAILABLE."""


class UnsupportedError(TritonError):
    """TRITONSERVER_ERROR_UNSUPPORTED: what Triton does and trident's in-process API cannot."""


class AlreadyExistsError(TritonError):
    """TRITONSERVER_ERROR_ALREADY_EXISTS."""


_BY_CODE: dict[Code, type[TritonError]] = {
    Code.UNKNOWN: UnknownError,
    Code.INTERNAL: InternalError,
    Code.NOT_FOUND: NotFoundError,
    Code.INVALID_ARG: InvalidArgumentError,
    Code.UNAVAILABLE: UnavailableError,
    Code.UNSUPPORTED: UnsupportedError,
    Code.ALREADY_EXISTS: AlreadyExistsError,
    Code.CANCELLED: UnknownError,
}


def from_core(error: CoreError) -> TritonError:
    """The API's exception for one of the server's errors (same message)."""
    return _BY_CODE[error.code](error.message)


def to_api(error: BaseException) -> BaseException:
    """``error`` as the API raises it: the server's errors mapped by code, ValueError (a bad
    option or setting) as InvalidArgumentError, OSError (a file or socket) as InternalError;
    the API's own errors and anything else unchanged."""
    if isinstance(error, CoreError):
        return from_core(error)
    if isinstance(error, ValueError):
        return InvalidArgumentError(str(error))
    if isinstance(error, OSError):
        return InternalError(str(error))
    return error
