"""HTTP/1.1 server side, sans-IO (RFC 9112): request parsing and response framing.

:class:`RequestParser` turns received bytes into request heads and body chunks:

* the head (request line and header fields) ends at an empty line; CRLF and bare LF line ends are
  both accepted, a bare CR, a control byte, obsolete line folding or a malformed line is a
  ``400``; a head larger than ``max_head_size`` is a ``431``;
* the body is framed by ``Content-Length`` or by ``Transfer-Encoding: chunked`` (extensions are
  ignored, trailers read and discarded); both at once, or a transfer coding other than
  ``chunked``, is refused;
* requests are handled one at a time: after a body ends the parser waits for
  :meth:`RequestParser.start_next` before it looks at pipelined bytes.

:class:`ResponseFramer` serializes one response from ASGI-style ``start`` and ``body`` calls:
``Content-Length`` when the length is known, chunked transfer coding when a body streams on
HTTP/1.1, close-delimited on HTTP/1.0, and ``Connection`` handling for keep-alive.

Nothing here does I/O. Errors in received bytes are :class:`ProtocolError` carrying the status
to answer with; misuse of the framer is :class:`ResponseError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from email.utils import formatdate
from http import HTTPStatus

from mypy_extensions import mypyc_attr

DEFAULT_MAX_HEAD_SIZE = 64 * 1024
MAX_CHUNK_LINE = 4096  # a chunk-size line, extensions included
_JOIN_LIMIT = 64 * 1024  # wire pieces smaller than this are joined into one write

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"

_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEAD_OK = b"\t\r\n" + bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))
_HEX = b"0123456789abcdefABCDEF"
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_NO_BODY_STATUS = frozenset({HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED})


class ProtocolError(Exception):
    """The received bytes are not an acceptable request; answer ``status`` and close."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@mypyc_attr(native_class=False)  # compiled (trident.native), a RuntimeError subclass must stay a Python class
class ResponseError(RuntimeError):
    """The application asked for a response that cannot be framed (the connection must close)."""


def _bad(message: str) -> ProtocolError:
    return ProtocolError(HTTPStatus.BAD_REQUEST, message)


class RequestHead:
    """A parsed request line and header fields (names lower-cased, values stripped)."""

    __slots__ = ("method", "target", "http_version", "headers", "content_length", "chunked",
                 "keep_alive", "expect_continue")

    def __init__(self, method: str, target: bytes, http_version: str, headers: Sequence[tuple[bytes, bytes]],
                 content_length: int | None, chunked: bool, keep_alive: bool, expect_continue: bool) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version  # "1.1" or "1.0"
        self.headers = headers
        self.content_length = content_length  # None when chunked
        self.chunked = chunked
        self.keep_alive = keep_alive  # what the request allows
        self.expect_continue = expect_continue

    def __repr__(self) -> str:
        return f"RequestHead({self.method} {self.target!r} HTTP/{self.http_version}, {len(self.headers)} headers)"


def parse_head(head: bytes) -> RequestHead:
    """Parse a request head (request line and fields, without the final empty line).

    A head seen before (most clients send the same head again and again) comes from a bounded
    cache of heads that parsed without error. Raises ProtocolError (400, 501 for a transfer
    coding, 505 for an HTTP version other than 1.x).
    """
    hit = _HEAD_CACHE.get(head)
    if hit is not None:
        method, target, http_version, fields, content_length, chunked, keep_alive, expect_continue = hit
        # the cached tuple itself: the same object for every request with this head (callers
        # may cache what they derive from it by identity)
        return RequestHead(method, target, http_version, fields, content_length, chunked, keep_alive,
                           expect_continue)
    parsed = _parse_head(head)
    parsed.headers = tuple(parsed.headers)  # immutable: a cached head's fields are shared
    if len(head) <= _HEAD_CACHE_HEAD and len(_HEAD_CACHE) < _HEAD_CACHE_SIZE:
        _HEAD_CACHE[head] = (parsed.method, parsed.target, parsed.http_version, parsed.headers,
                             parsed.content_length, parsed.chunked, parsed.keep_alive, parsed.expect_continue)
    return parsed


_HEAD_CACHE: dict[bytes, tuple] = {}  # type: ignore[type-arg]
_HEAD_CACHE_SIZE = 256  # heads
_HEAD_CACHE_HEAD = 1024  # bytes: longer heads are parsed each time


def _parse_head(head: bytes) -> RequestHead:
    if head.translate(None, _HEAD_OK):
        raise _bad("control character in the request head")
    if b"\r" in head:
        head = head.replace(b"\r\n", b"\n")
        if b"\r" in head:
            raise _bad("bare CR in the request head")
    lines = head.split(b"\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise _bad("malformed request line")
    raw_method, target, version = parts
    method = _METHODS.get(raw_method)
    if method is None:
        if not raw_method or raw_method.translate(None, _TCHAR):
            raise _bad("malformed method")
        method = raw_method.decode("ascii")
    if version == b"HTTP/1.1":
        http_version = "1.1"
    elif version == b"HTTP/1.0":
        http_version = "1.0"
    elif version.startswith(b"HTTP/") and len(version) == 8 and version[5:6].isdigit() and version[7:8].isdigit():
        raise ProtocolError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HTTP version not supported")
    else:
        raise _bad("malformed HTTP version")
    if not target:
        raise _bad("empty request target")
    headers: list[tuple[bytes, bytes]] = []
    content_length: int | None = None
    transfer_encoding: bytes | None = None
    connection = b""
    expect = b""
    host = False
    cache = _FIELD_CACHE
    for line in lines[1:]:
        field = cache.get(line)
        if field is None:
            field = _parse_field(line)
            if len(line) <= _FIELD_CACHE_LINE and len(cache) < _FIELD_CACHE_SIZE:
                cache[line] = field
        headers.append(field)
        name, value = field
        if name not in _FRAMING:
            continue
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18:
                raise _bad("invalid Content-Length")
            length = int(value)
            if content_length is not None and content_length != length:
                raise _bad("conflicting Content-Length fields")
            content_length = length
        elif name == b"transfer-encoding":
            transfer_encoding = value if transfer_encoding is None else transfer_encoding + b"," + value
        elif name == b"connection":
            connection = connection + b"," + value.lower() if connection else value.lower()
        elif name == b"host":
            host = True
        elif name == b"expect":
            expect = value.lower()
    chunked = False
    if transfer_encoding is not None:
        if http_version == "1.0":
            raise _bad("Transfer-Encoding in an HTTP/1.0 request")
        if content_length is not None:
            raise _bad("both Content-Length and Transfer-Encoding")
        if transfer_encoding.lower().strip(b" \t") != b"chunked":
            raise ProtocolError(HTTPStatus.NOT_IMPLEMENTED, "only the chunked transfer coding is supported")
        chunked = True
    elif content_length is None:
        content_length = 0
    if http_version == "1.1":
        if not host:
            raise _bad("missing Host header")
        keep_alive = not connection or b"close" not in _tokens(connection)
    else:
        keep_alive = bool(connection) and b"keep-alive" in _tokens(connection)
    expect_continue = http_version == "1.1" and expect == b"100-continue"
    return RequestHead(method, target, http_version, headers, content_length, chunked, keep_alive, expect_continue)


# header lines already parsed (validated): most clients send the same lines again and again
_FIELD_CACHE: dict[bytes, tuple[bytes, bytes]] = {}
_FIELD_CACHE_SIZE = 1024  # lines
_FIELD_CACHE_LINE = 256  # bytes: longer lines are parsed each time
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection", b"host", b"expect"})


def _parse_field(line: bytes) -> tuple[bytes, bytes]:
    """``(lower-cased name, stripped value)`` of a header line; raises ProtocolError (400)."""
    name, sep, value = line.partition(b":")
    if not sep or not name or name.translate(None, _TCHAR):
        raise _bad("malformed header field" if line[:1] not in (b" ", b"\t") else "obsolete line folding")
    return name.lower(), value.strip(b" \t")


def _tokens(value: bytes) -> set[bytes]:
    return {t.strip(b" \t") for t in value.split(b",")}


# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _DONE = range(7)


class RequestParser:
    """Incremental parser for the requests of one connection.

    Use: :meth:`feed` received bytes; :meth:`next_head` until it returns a head; then
    :meth:`next_body` until it reports the end of the body; then :meth:`start_next` for the next
    (possibly already buffered, pipelined) request. ``None`` from either method means more
    bytes are needed. Both raise ProtocolError for malformed input; after an error the parser
    must not be used again.
    """

    __slots__ = ("_buf", "_state", "_remaining", "_scanned", "_trailer_bytes", "max_head_size")

    def __init__(self, max_head_size: int = DEFAULT_MAX_HEAD_SIZE) -> None:
        self._buf = bytearray()
        self._state = _HEAD
        self._remaining = 0  # body bytes left (content-length) or chunk bytes left
        self._scanned = 0  # head bytes already searched for the end of the head
        self._trailer_bytes = 0
        self.max_head_size = max_head_size

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return len(self._buf)

    @property
    def body_done(self) -> bool:
        """True once the body of the current request has been read to its end."""
        return self._state == _DONE

    @property
    def waiting_for_head(self) -> bool:
        """True between requests (no head parsed yet for the next one)."""
        return self._state == _HEAD

    @property
    def body_remaining(self) -> int | None:
        """Bytes of the current body still to read, None if unknown (chunked), 0 when done."""
        if self._state == _LENGTH:
            return self._remaining
        if self._state == _DONE:
            return 0
        return None

    @property
    def body_room(self) -> int:
        """Bytes of a Content-Length body that may be read straight into the caller's buffer
        (see :meth:`body_received`): the body still to come when nothing is buffered, else 0
        (the buffered bytes come first, through :meth:`next_body`)."""
        if self._state == _LENGTH and not self._buf:
            return self._remaining
        return 0

    def body_received(self, n: int) -> bool:
        """Count ``n`` body bytes the caller read straight into its own buffer (at most
        :attr:`body_room`); True once the body is whole. Raises ValueError past the room."""
        if not 0 < n <= self.body_room:
            raise ValueError(f"{n} body bytes received outside the room of {self.body_room}")
        self._remaining -= n
        if self._remaining == 0:
            self._state = _DONE
            return True
        return False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._buf += data

    def next_head(self) -> RequestHead | None:
        """The next request head, or None until it has been received.

        Raises ProtocolError (431 when the head exceeds ``max_head_size``, see
        :func:`parse_head` for the others). Raises RuntimeError when the previous request has
        not been finished with :meth:`start_next`.
        """
        if self._state != _HEAD:
            raise RuntimeError("next_head() called before the previous request was finished")
        buf = self._buf
        if not buf:  # the usual state between two requests of a connection
            return None
        if buf[:1] in (b"\r", b"\n"):  # empty lines before a request are ignored (RFC 9112 §2.2)
            del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
            self._scanned = 0
        start = self._scanned - 2 if self._scanned > 2 else 0
        crlf = buf.find(b"\n\r\n", start)
        lf = buf.find(b"\n\n", start, crlf + 1 if crlf >= 0 else len(buf))
        if lf >= 0:
            end, body_start = lf, lf + 2
        elif crlf >= 0:
            end, body_start = crlf, crlf + 3
        else:
            if len(buf) > self.max_head_size:
                raise ProtocolError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
            self._scanned = len(buf)
            return None
        head_end = end - 1 if buf[end - 1] == 0x0D else end  # the last line's CR
        if head_end > self.max_head_size:
            raise ProtocolError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
        head = parse_head(bytes(buf[:head_end]))
        del buf[:body_start]
        self._scanned = 0
        if head.chunked:
            self._state = _CHUNK_SIZE
        else:
            self._remaining = head.content_length or 0
            self._state = _LENGTH if self._remaining else _DONE
        return head

    def next_body(self, max_size: int = 1 << 20) -> tuple[bytes | bytearray, bool] | None:
        """The next piece of the body (at most ``max_size`` bytes) and whether the body ended.

        None means more bytes are needed. Returns ``(b"", True)`` for an empty body. Raises
        ProtocolError for malformed chunked framing.
        """
        state = self._state
        if state == _DONE:
            return b"", True
        if state == _LENGTH:
            buf = self._buf
            if not buf:
                return None
            n = min(self._remaining, len(buf), max_size)
            if n == len(buf):
                data = bytes(buf)
                buf.clear()
            else:
                data = bytes(buf[:n])
                del buf[:n]
            self._remaining -= n
            if self._remaining == 0:
                self._state = _DONE
                return data, True
            return data, False
        if state == _HEAD:
            raise RuntimeError("next_body() called before a request head")
        return self._next_chunked(max_size)

    def body_from(self, data: bytes | bytearray) -> tuple[bytes | bytearray, bool] | None:
        """:meth:`feed` then :meth:`next_body`, without copying ``data`` when it is all body."""
        if self._state == _LENGTH and not self._buf and 0 < len(data) <= self._remaining:
            self._remaining -= len(data)
            if self._remaining == 0:
                self._state = _DONE
                return data, True
            return data, False
        self._buf += data
        return self.next_body()

    def _next_chunked(self, max_size: int) -> tuple[bytes, bool] | None:
        buf = self._buf
        parts: list[bytes] = []
        size = 0
        while True:
            state = self._state
            if state == _CHUNK_SIZE:
                nl = buf.find(b"\n", 0, MAX_CHUNK_LINE + 1)
                if nl < 0:
                    if len(buf) > MAX_CHUNK_LINE:
                        raise _bad("chunk size line too long")
                    break
                line = bytes(buf[:nl]).rstrip(b"\r")
                del buf[: nl + 1]
                text = line.split(b";", 1)[0].strip(b" \t")
                if not text or len(text) > 16 or text.translate(None, _HEX):
                    raise _bad("invalid chunk size")
                chunk = int(text, 16)
                if chunk == 0:
                    self._state = _TRAILERS
                    self._trailer_bytes = 0
                else:
                    self._remaining = chunk
                    self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                if not buf or size >= max_size:
                    break
                n = min(self._remaining, len(buf), max_size - size)
                parts.append(bytes(buf[:n]))
                del buf[:n]
                size += n
                self._remaining -= n
                if self._remaining == 0:
                    self._state = _CHUNK_END
            elif state == _CHUNK_END:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                elif buf[:1] == b"\n":
                    del buf[:1]
                elif buf == b"\r" or not buf:
                    break
                else:
                    raise _bad("missing CRLF after chunk data")
                self._state = _CHUNK_SIZE
            else:  # _TRAILERS
                nl = buf.find(b"\n")
                if nl < 0:
                    if self._trailer_bytes + len(buf) > self.max_head_size:
                        raise ProtocolError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "trailer section too large")
                    break
                line = bytes(buf[:nl]).rstrip(b"\r")
                del buf[: nl + 1]
                self._trailer_bytes += nl + 1
                if self._trailer_bytes > self.max_head_size:
                    raise ProtocolError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "trailer section too large")
                if not line:
                    self._state = _DONE
                    return b"".join(parts), True
                name, sep, _ = line.partition(b":")
                if not sep or not name or name.translate(None, _TCHAR) or line.translate(None, _HEAD_OK):
                    raise _bad("malformed trailer field")
        if parts:
            return (parts[0] if len(parts) == 1 else b"".join(parts)), False
        return None

    def start_next(self) -> None:
        """Begin the next request; raises RuntimeError when the current body was not read to its end."""
        if self._state != _DONE:
            raise RuntimeError("start_next() called before the request body was read to its end")
        self._state = _HEAD
        self._scanned = 0


# ---- responses ----------------------------------------------------------------------------------

_STATUS_LINES: dict[int, bytes] = {}
_date_cache: tuple[int, bytes] = (0, b"")


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (the reason phrase is optional: empty for unknown codes)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ResponseError(f"invalid status code {status!r}")
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        line = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        if len(_STATUS_LINES) < 1000:
            _STATUS_LINES[status] = line
    return line


def http_date() -> bytes:
    """The current time as an HTTP date, cached for the current second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode())
    return _date_cache[1]


def encode_chunk(data: bytes | bytearray | memoryview) -> list[bytes | bytearray | memoryview]:
    """One chunk of a chunked body (empty data gives nothing: an empty chunk would end the body)."""
    if not data:
        return []
    return [b"%x\r\n" % len(data), data, b"\r\n"]


def error_response(status: HTTPStatus, message: str) -> bytes:
    """A complete ``text/plain`` response that closes the connection (for ProtocolError)."""
    body = message.encode("utf-8", "replace") + b"\n"
    return b"".join([
        status_line(status), b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body),
        b"connection: close\r\ndate: ", http_date(), b"\r\n\r\n", body,
    ])


def encode_head(status: int, headers: Iterable[tuple[bytes, bytes]], content_length: int, keep_alive: bool,
                http_version: str) -> bytes:
    """The head of a response of ``content_length`` bytes from trusted headers (not validated).

    The bytes are what :class:`ResponseFramer` writes for the same headers followed by a
    ``content-length``: the fields in order, then ``connection`` (``close`` when not
    ``keep_alive``, ``keep-alive`` for a kept HTTP/1.0 connection) and ``date``. Raises
    ResponseError for a status outside 100-999.
    """
    out = [status_line(status)]
    for name, value in headers:
        out += (name, b": ", value, b"\r\n")
    out.append(b"content-length: %d\r\n" % content_length)
    if not keep_alive:
        out.append(b"connection: close\r\n")
    elif http_version == "1.0":
        out.append(b"connection: keep-alive\r\n")
    out += (b"date: ", http_date(), b"\r\n\r\n")
    return b"".join(out)


class ResponseFramer:
    """Serializes one response to the request ``head`` (sans-IO).

    ``start(status, headers)`` records the head; each ``body(data, more_body)`` returns the
    bytes to write (the head goes out with the first body). ``keep_alive`` says afterwards
    whether the connection may carry another request; ``allow_keep_alive=False`` forces it off.
    Raises ResponseError for a second start, a body before start, a header name or value that
    is not allowed, or more or fewer body bytes than a declared ``content-length``.
    """

    __slots__ = ("head", "keep_alive", "started", "complete", "_status", "_headers", "_length",
                 "_sent", "_chunked", "_no_body", "_head_sent", "_has_date", "_has_connection")

    def __init__(self, head: RequestHead, allow_keep_alive: bool = True) -> None:
        self.head = head
        self.keep_alive = head.keep_alive and allow_keep_alive
        self.started = False
        self.complete = False
        self._status = 0
        self._headers: list[bytes] = []
        self._length: int | None = None
        self._sent = 0
        self._chunked = False
        self._no_body = False
        self._head_sent = False
        self._has_date = False
        self._has_connection = False

    def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Record the status and headers; raises ResponseError (see the class)."""
        if self.started:
            raise ResponseError("the response has already started")
        if not isinstance(status, int) or not 200 <= status <= 999:
            raise ResponseError(f"invalid final status {status!r}")
        out = self._headers
        count = 0
        for name, value in headers:
            name = bytes(name).lower()
            if name not in _VALID_NAMES:
                if not name or name.translate(None, _TCHAR):
                    raise ResponseError(f"invalid header name {name!r}")
                if len(_VALID_NAMES) < 512:
                    _VALID_NAMES.add(name)
            out.append(name)
            out.append(b": ")
            out.append(value)
            out.append(b"\r\n")
            count += 1
            if name == b"content-length":
                try:
                    self._length = int(value)
                except ValueError:
                    raise ResponseError(f"invalid content-length {value!r}") from None
            elif name == b"transfer-encoding":
                if bytes(value).lower().strip() != b"chunked":
                    raise ResponseError("only the chunked transfer coding can be sent")
                self._chunked = True
            elif name == b"connection":
                self._has_connection = True
                if b"close" in _tokens(bytes(value).lower()):
                    self.keep_alive = False
            elif name == b"date":
                self._has_date = True
        block = b"".join(out)
        if block.count(b"\n") != count or block.count(b"\r") != count or b"\0" in block:
            raise ResponseError("CR, LF or NUL in a header value")
        self._headers = [block]
        self._status = status
        self._no_body = status in _NO_BODY_STATUS or self.head.method == "HEAD"
        if self._chunked and self.head.http_version == "1.0":
            raise ResponseError("chunked transfer coding in a response to HTTP/1.0")
        self.started = True

    def body(self, data: bytes | bytearray | memoryview, more_body: bool) -> list[bytes | bytearray | memoryview]:
        """The bytes to write for this body message (and the head, the first time)."""
        if not self.started:
            raise ResponseError("response body before http.response.start")
        if self.complete:
            raise ResponseError("the response is already complete")
        out: list[bytes | bytearray | memoryview] = []
        if not self._head_sent:
            out.append(self._encode_head(len(data), more_body))
        n = len(data)
        if self._length is not None and not self._no_body:
            self._sent += n
            if self._sent > self._length:
                raise ResponseError(f"more body bytes than the content-length of {self._length}")
            if not more_body and self._sent < self._length:
                raise ResponseError(f"response ended after {self._sent} of {self._length} bytes")
        if self._no_body:
            pass  # HEAD, 204, 304: framing headers as given, no body bytes
        elif self._chunked:
            out.extend(encode_chunk(data))
            if not more_body:
                out.append(LAST_CHUNK)
        elif n:
            out.append(data)
        if not more_body:
            self.complete = True
        if len(out) > 1 and sum(len(p) for p in out) < _JOIN_LIMIT:
            return [b"".join(out)]
        return out

    def _encode_head(self, first: int, more_body: bool) -> bytes:
        self._head_sent = True
        extra = []
        if self._length is None and not self._chunked and not self._no_body:
            if not more_body:
                self._length = first
                extra.append(b"content-length: %d\r\n" % first)
            elif self.head.http_version == "1.1":
                self._chunked = True
                extra.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # close-delimited body
        if self._no_body:  # framing headers as the application gave them, no body bytes
            self._chunked = False
        if not self._has_connection:
            if not self.keep_alive:
                extra.append(b"connection: close\r\n")
            elif self.head.http_version == "1.0":
                extra.append(b"connection: keep-alive\r\n")
        if not self._has_date:
            extra.append(b"date: " + http_date() + b"\r\n")
        return b"".join([status_line(self._status), self._headers[0], *extra, b"\r\n"])


_VALID_NAMES: set[bytes] = set()
