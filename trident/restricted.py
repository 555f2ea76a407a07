"""Restricted API groups: ``--http-restricted-api`` and ``--grpc-restricted-protocol``.

tritonserver's syntax, one flag per group of APIs that share a header::

    --http-restricted-api=model-repository,statistics:admin-key=secret
    --grpc-restricted-protocol=model-repository:admin-key=secret

A request to an API of a restricted group is served only when it carries the header with
exactly that value; otherwise HTTP answers 403 ``{"error": "This API is restricted, expecting
header 'admin-key'"}`` and gRPC answers UNAVAILABLE "This protocol is restricted, expecting
header 'triton-grpc-protocol-admin-key'" (gRPC metadata keys get Triton's
``triton-grpc-protocol-`` prefix). HTTP header names compare case-insensitively, values
exactly. Unrestricted groups are served to everyone. This module only parses and decides;
the front ends name the group of each route or RPC.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trident.options import ServerOptions

#: the API groups, in Triton's spelling
CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

HTTP_MESSAGE = "This API is restricted, expecting header '{}'"
GRPC_MESSAGE = "This protocol is restricted, expecting header '{}'"


@dataclass(frozen=True)
class Restriction:
    """The header (lower-case name as sent on the wire) and the value a group requires."""

    header: str
    value: str

    def allows(self, value: str | bytes | None) -> bool:
        if value is None:
            return False
        raw = value.encode("latin-1") if isinstance(value, str) else bytes(value)
        return hmac.compare_digest(raw, self.value.encode("latin-1", "replace"))


class Restrictions:
    """Which groups require which header. Empty (nothing restricted) by default."""

    def __init__(self, by_category: Mapping[str, Restriction] | None = None) -> None:
        self._by_category = dict(by_category or {})

    def __bool__(self) -> bool:
        return bool(self._by_category)

    def get(self, category: str) -> Restriction | None:
        return self._by_category.get(category)

    def refused(self, category: str, headers: Iterable[tuple[bytes, bytes]]) -> Restriction | None:
        """The restriction of ``category`` that ``headers`` (HTTP ``(name, value)`` pairs, any
        case of name) do not satisfy; None when the group is open or the header matches."""
        restriction = self._by_category.get(category)
        if restriction is None:
            return None
        wanted = restriction.header.encode("latin-1")
        for key, value in headers:
            if key.lower() == wanted and restriction.allows(value):
                return None
        return restriction

    @classmethod
    def parse(cls, specs: Iterable[str], flag: str, header_prefix: str = "") -> Restrictions:
        """Restrictions from flag values ``<api>[,<api>...]:<key>=<value>``.

        ``header_prefix`` is prepended to each key (gRPC: GRPC_HEADER_PREFIX). Raises
        ValueError with tritonserver's messages: a malformed value, an unknown group, a group
        named in two values.
        """
        out: dict[str, Restriction] = {}
        for spec in specs:
            names, sep, setting = spec.partition(":")
            key, eq, value = setting.partition("=")
            if not sep or not eq or not names or not key or not value:
                raise ValueError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {spec}")
            restriction = Restriction(header_prefix + key.strip().lower(), value)
            for name in names.split(","):
                name = name.strip()
                if name not in CATEGORIES:
                    raise ValueError(f"unknown restricted api '{name}'")
                if name in out:
                    raise ValueError(f"restricted api '{name}' can not be specified in multiple config groups")
                out[name] = restriction
        return cls(out)


def http_restrictions(options: ServerOptions) -> Restrictions:
    """The HTTP front end's restrictions from server options. Raises ValueError."""
    return Restrictions.parse(options.http_restricted_api, "--http-restricted-api")


def grpc_restrictions(options: ServerOptions) -> Restrictions:
    """The gRPC front end's restrictions from server options. Raises ValueError."""
    return Restrictions.parse(options.grpc_restricted_protocol, "--grpc-restricted-protocol", GRPC_HEADER_PREFIX)
