"""Request deadlines (README "Deadlines"): pure decisions, no tasks.

A request's deadline (``InferenceRequest.deadline``, trio's clock) comes from the gRPC
``grpc-timeout`` header (the front end sets it), from Triton's ``timeout`` request parameter
(µs, HTTP and gRPC alike: :func:`apply_timeout_parameter`), and from the request it serves: an
ensemble step takes its ensemble request's, a BLS child the latest of its parents' (all of them
must have one: ``trident.backends.python._runtime.inherited_deadline``), each the earlier of that
and its own. The server answers a request whose
deadline passes with Triton's queue-timeout status (:func:`timeout_expired`), and no work of the
request starts after it (the executor drops it, an ensemble starts no further step).
"""

from __future__ import annotations

from typing import Any

from trident.batching.policy import TIMEOUT_EXPIRED
from trident.errors import TritonError, invalid_arg, unavailable
from trident.observability.stats import CANCELED, REJECTED

#: the longest ``timeout`` accepted (one year, in µs): more is a client's unit mistake
MAX_TIMEOUT_US = 365 * 24 * 3600 * 1_000_000


def timeout_expired() -> TritonError:
    """Triton's status for a request whose time ran out (its dynamic batcher's queue timeout)."""
    return unavailable(TIMEOUT_EXPIRED)


def timeout_us(parameters: dict[str, Any]) -> int:
    """The ``timeout`` parameter in µs, 0 when absent or 0 (no timeout, as in Triton).

    Raises TritonError(INVALID_ARG) for a value that is not an integer, negative, or more than
    a year.
    """
    value = parameters.get("timeout", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_arg(f"invalid value type for 'timeout' parameter, expected an integer number of "
                          f"microseconds, got {type(value).__name__}")
    if value < 0:
        raise invalid_arg(f"'timeout' parameter must not be negative, got {value} (microseconds)")
    if value > MAX_TIMEOUT_US:
        raise invalid_arg(f"'timeout' parameter {value} is more than a year in microseconds (at most "
                          f"{MAX_TIMEOUT_US})")
    return value


def apply_timeout_parameter(request: Any, now: float) -> bool:
    """Make the request's ``timeout`` parameter (if any) its deadline: ``now`` plus the timeout,
    or the deadline it already has when that is earlier. True when it has a timeout (the server
    then answers it by its deadline; a deadline set by a front end or a BLS call is kept by
    their own cancel scopes). Raises as :func:`timeout_us`."""
    us = timeout_us(request.parameters)
    if not us:
        return False
    deadline = now + us / 1_000_000
    if request.deadline is None or deadline < request.deadline:
        request.deadline = deadline
    return True


def cancel_reason(request: Any, now: float) -> str:
    """The failure reason of a request cancelled at ``now``: REJECTED (Triton's reason for a
    queue timeout) when its ``timeout`` parameter ran out, else CANCELED (its client left, a
    gRPC deadline included, as before deadlines)."""
    deadline = request.deadline
    if deadline is not None and now >= deadline and request.parameters.get("timeout"):
        return REJECTED
    return CANCELED
