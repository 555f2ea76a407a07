"""Which handler a gRPC request stream asks for: :class:`Routes`, from its request headers alone.

A header list too large (over ``max_header_list_size``), a method other than POST, a content
type other than gRPC's, an unknown service or method, an unknown ``grpc-encoding`` or a bad
``grpc-timeout`` is refused with its status (and the HTTP status of the trailers-only answer);
anything else names the :class:`~trident.grpc.call.Method`, the message encoding, the timeout
and the encoding the client accepts for responses. A connection keeps the answers for the
header tuples its HTTP/2 engine hands out again (its decode cache repeats them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trident.errors import GRPC_INVALID_ARGUMENT, GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED
from trident.grpc.call import Method
from trident.grpc.config import TransportConfig
from trident.protocol import grpc_framing as framing
from trident.protocol.grpc_framing import FramingError

_CACHE = 64  # request header tuples whose route a connection keeps


class Routes:
    """One connection's routing of request streams to the server's methods (sans-IO)."""

    __slots__ = ("methods", "config", "_cache")

    def __init__(self, methods: dict[str, Method], config: TransportConfig) -> None:
        self.methods = methods
        self.config = config
        #: id(header tuple) -> (that tuple, what _parse made of it)
        self._cache: dict[int, tuple[Any, tuple[Any, ...]]] = {}

    def route(self, headers: Sequence[tuple[bytes, bytes]]) -> tuple[Any, ...]:
        """What a request header list asks for: ``(path, method entry, encoding, timeout
        seconds or None, response encoding or None)``, or ``(status, message, http status)`` to
        refuse it; remembered for a header tuple the engine hands out again."""
        cached = self._cache.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]  # type: ignore[no-any-return]
        parsed = self._parse(headers)
        if isinstance(headers, tuple):  # the engine's decode cache hands out the same tuple again
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            self._cache[id(headers)] = (headers, parsed)  # holds headers: the id stays unique
        return parsed

    def _parse(self, headers: Sequence[tuple[bytes, bytes]]) -> tuple[Any, ...]:
        """:meth:`route` without its cache: depends on the headers alone."""
        size = 0
        for key, value in headers:
            size += len(key) + len(value) + 32
        if size > self.config.max_header_list_size:
            return (GRPC_RESOURCE_EXHAUSTED, f"request header list of {size} bytes exceeds the limit of "
                                             f"{self.config.max_header_list_size}", b"200")
        fields = dict(headers)
        method = fields.get(b":method")
        content_type = fields.get(b"content-type", b"")
        path = fields.get(b":path", b"").decode("latin-1")
        if method != b"POST":
            return GRPC_UNIMPLEMENTED, "gRPC requires the POST method", b"405"
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+proto",
                                                                                   b"application/grpc;"))):
            return (GRPC_INVALID_ARGUMENT, f"invalid gRPC request content-type {content_type.decode('latin-1')!r}",
                    b"415")
        entry = self.methods.get(path)
        if entry is None:
            service, _, name = path.lstrip("/").rpartition("/")
            known = any(p.startswith(f"/{service}/") for p in self.methods) if service else False
            text = f"unknown method {name} for service {service}" if known else f"unknown service {service or path}"
            return GRPC_UNIMPLEMENTED, text, b"200"
        encoding_raw = fields.get(b"grpc-encoding")
        encoding = encoding_raw.decode("latin-1") if encoding_raw is not None else None
        timeout = None
        try:
            framing.check_encoding(encoding)
            timeout_raw = fields.get(b"grpc-timeout")
            if timeout_raw is not None:
                timeout = framing.parse_timeout(timeout_raw)
        except FramingError as e:
            return e.status, e.message, b"200"
        except (ValueError, UnicodeDecodeError) as e:
            return GRPC_INVALID_ARGUMENT, str(e), b"200"
        return path, entry, encoding, timeout, framing.response_encoding(fields.get(b"grpc-accept-encoding", b""))
