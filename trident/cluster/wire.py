"""The supervisor <-> worker control messages on the wire (sans-IO).

A message is a JSON object (orjson) behind a 4-byte big-endian length. Requests carry
``{"id": n, "op": name, ...}``, replies ``{"re": n, ...}`` with either the result fields or
``"error": {"code": <trident.errors.Code value>, "message": ...}``; ``n`` counts per sender.
Bytes travel as base64 text (:func:`encode_bytes`; only model files of a load do).

:class:`FrameReader` takes bytes as they arrive and hands out whole messages; a length over
:data:`MAX_MESSAGE` or a body that is not a JSON object raises :class:`WireError` (the peer is
one of our own processes: that is a bug, and the channel is closed).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson

MAX_MESSAGE = 512 * 1024 * 1024  # bytes; model files of a load are the only large payload
_LENGTH = struct.Struct(">I")


class WireError(Exception):
    """A frame that is not a control message."""


def encode(message: dict[str, Any]) -> bytes:
    """One framed message. Raises WireError past MAX_MESSAGE, TypeError for a value that is not JSON."""
    body = orjson.dumps(message)
    if len(body) > MAX_MESSAGE:
        raise WireError(f"control message of {len(body)} bytes exceeds {MAX_MESSAGE}")
    return _LENGTH.pack(len(body)) + body


def encode_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_bytes(text: str) -> bytes:
    """Raises WireError for text that is not base64."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise WireError(f"bad base64 in a control message: {e}") from None


class FrameReader:
    """Whole messages out of a byte stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[dict[str, Any]]:
        """Add received bytes; returns the messages completed by them, in order. Raises WireError."""
        self._buffer += data
        out: list[dict[str, Any]] = []
        while len(self._buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._buffer)
            if size > MAX_MESSAGE:
                raise WireError(f"control message of {size} bytes exceeds {MAX_MESSAGE}")
            end = _LENGTH.size + size
            if len(self._buffer) < end:
                break
            try:
                message = orjson.loads(bytes(self._buffer[_LENGTH.size:end]))
            except orjson.JSONDecodeError as e:
                raise WireError(f"control message is not JSON: {e}") from None
            del self._buffer[:end]
            if not isinstance(message, dict):
                raise WireError("control message is not a JSON object")
            out.append(message)
        return out

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole message."""
        return len(self._buffer)
