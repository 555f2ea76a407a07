"""HTTP/1.1 request parsing and response framing (trident.protocol.http1).

Responses are checked with h11 as an independent client-side parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.protocol.http1 import (
    CONTINUE,
    ProtocolError,
    RequestHead,
    RequestParser,
    ResponseError,
    ResponseFramer,
    encode_head,
    error_response,
)


@dataclass
class Req:
    method: str
    target: bytes
    version: str
    headers: list[tuple[bytes, bytes]]  # without framing headers
    body: bytes
    chunked: bool
    chunk_sizes: list[int]
    extensions: bool
    trailers: list[tuple[bytes, bytes]]
    line_end: bytes

    def encode(self) -> bytes:
        e = self.line_end
        lines = [b"%s %s HTTP/%s" % (self.method.encode(), self.target, self.version.encode()), b"Host: example"]
        lines += [n + b": " + v for n, v in self.headers]
        if self.chunked:
            lines.append(b"Transfer-Encoding: chunked")
        elif self.body or self.method == "POST":
            lines.append(b"Content-Length: %d" % len(self.body))
        out = e.join(lines) + e + e
        if not self.chunked:
            return out + self.body
        pos, i = 0, 0
        while pos < len(self.body):
            n = max(1, self.chunk_sizes[i % len(self.chunk_sizes)])
            piece = self.body[pos : pos + n]
            out += b"%x%s%s%s%s" % (len(piece), b";ext=1" if self.extensions else b"", e, piece, e)
            pos += n
            i += 1
        out += b"0" + e + b"".join(n + b": " + v + e for n, v in self.trailers) + e
        return out


tokens = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~", min_size=1, max_size=12)
values = st.binary(max_size=40).map(lambda b: bytes(c for c in b if 0x21 <= c <= 0x7E or c >= 0x80))
targets = st.text("abcxyz019/%?=&-._~", min_size=0, max_size=30).map(lambda t: ("/" + t).encode())


@st.composite
def requests(draw: st.DrawFn) -> Req:
    version = draw(st.sampled_from(["1.1", "1.0"]))
    chunked = version == "1.1" and draw(st.booleans())
    headers = [(b"X-" + draw(tokens).encode(), draw(values)) for _ in range(draw(st.integers(0, 5)))]
    return Req(
        method=draw(st.sampled_from(["GET", "POST", "PUT", "M-SEARCH"])),
        target=draw(targets),
        version=version,
        headers=headers,
        body=draw(st.binary(max_size=3000)),
        chunked=chunked,
        chunk_sizes=draw(st.lists(st.integers(1, 700), min_size=1, max_size=5)),
        extensions=draw(st.booleans()),
        trailers=[(b"X-T", draw(values))] if draw(st.booleans()) else [],
        line_end=draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"])),
    )


def parse_stream(pieces: list[bytes], max_body: int = 1 << 20) -> list[tuple[RequestHead, bytes]]:
    """Feed ``pieces`` one by one; every complete request with its whole body."""
    parser = RequestParser()
    out: list[tuple[RequestHead, bytes]] = []
    head: RequestHead | None = None
    body = b""
    for piece in pieces:
        parser.feed(piece)
        while True:
            if head is None:
                head = parser.next_head()
                if head is None:
                    break
                body = b""
            got = parser.next_body(max_body)
            if got is None:
                break
            body += got[0]
            if got[1]:
                out.append((head, body))
                head = None
                parser.start_next()
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    pieces, pos, i = [], 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        pieces.append(data[pos : pos + step])
        pos += step
        i += 1
    return pieces


@given(st.lists(requests(), min_size=1, max_size=3), st.lists(st.integers(1, 400), min_size=1, max_size=20),
       st.integers(1, 4096))
def test_pipelined_requests_round_trip_in_any_split(reqs, cuts, max_body):
    data = b"".join(r.encode() for r in reqs)
    parsed = parse_stream(split(data, cuts), max_body)
    assert len(parsed) == len(reqs)
    for (head, body), req in zip(parsed, reqs, strict=True):
        assert head.method == req.method
        assert head.target == req.target
        assert head.http_version == req.version
        assert head.chunked == req.chunked
        names = [n for n, _ in head.headers]
        assert all(n == n.lower() for n in names)
        assert [(n, v) for n, v in head.headers if n.startswith(b"x-")] == [(n.lower(), v) for n, v in req.headers]
        assert body == req.body
        assert head.keep_alive == (req.version == "1.1")


@given(requests(), st.integers(1, 64))
def test_body_pieces_respect_max_size(req, max_body):
    parser = RequestParser()
    parser.feed(req.encode())
    assert parser.next_head() is not None
    pieces = []
    while True:
        got = parser.next_body(max_body)
        assert got is not None
        assert len(got[0]) <= max_body
        pieces.append(got[0])
        if got[1]:
            break
    assert b"".join(pieces) == req.body
    assert parser.body_done and parser.buffered == 0


@given(st.binary(max_size=2000), st.lists(st.integers(1, 300), min_size=1, max_size=8))
def test_arbitrary_bytes_give_requests_or_protocol_errors(data, cuts):
    try:
        parse_stream(split(data, cuts))
    except ProtocolError as exc:
        assert exc.status in (HTTPStatus.BAD_REQUEST, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                              HTTPStatus.NOT_IMPLEMENTED, HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)


def test_requests_written_by_h11_parse() -> None:
    client = h11.Connection(h11.CLIENT)
    data = client.send(h11.Request(method="POST", target="/v2/models/m/infer?x=1",
                                   headers=[("Host", "h"), ("Transfer-Encoding", "chunked"), ("X-A", "b")]))
    data += client.send(h11.Data(data=b"hello ")) + client.send(h11.Data(data=b"world"))
    data += client.send(h11.EndOfMessage())
    [(head, body)] = parse_stream([data])
    assert (head.method, head.target, body) == ("POST", b"/v2/models/m/infer?x=1", b"hello world")
    assert (b"x-a", b"b") in head.headers


def one_head(data: bytes) -> RequestHead | None:
    parser = RequestParser(max_head_size=1024)
    parser.feed(data)
    return parser.next_head()


@pytest.mark.parametrize("data, status", [
    (b"GET /\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED),
    (b"GET / HTTX/1.1\r\nHost: a\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),  # no Host
    (b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\rX: 1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
     HTTPStatus.BAD_REQUEST),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", HTTPStatus.NOT_IMPLEMENTED),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", HTTPStatus.BAD_REQUEST),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"y" * 2000 + b"\r\n\r\n", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"y" * 2000, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
])
def test_malformed_heads(data, status):
    with pytest.raises(ProtocolError) as e:
        one_head(data)
    assert e.value.status == status


@pytest.mark.parametrize("chunked_body", [
    b"zz\r\nab\r\n0\r\n\r\n",
    b"2\r\nabc\r\n0\r\n\r\n",
    b"2\r\nab\r\n0\r\nbad trailer\r\n\r\n",
    b"12345678901234567\r\n",
    b"1" * 5000,
])
def test_malformed_chunked_bodies(chunked_body):
    parser = RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body)
    assert parser.next_head() is not None
    with pytest.raises(ProtocolError) as e:
        while parser.next_body() is not None:
            pass
    assert e.value.status == HTTPStatus.BAD_REQUEST


def test_semantics_of_connection_expect_and_lenient_forms():
    head = one_head(b"\r\n\r\nPOST /a HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, Close\r\n"
                    b"Expect: 100-Continue\r\nContent-Length: 3\r\n\r\n")
    assert head is not None and not head.keep_alive and head.expect_continue and head.content_length == 3
    head = one_head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n\r\n")
    assert head is not None and head.keep_alive and not head.expect_continue
    head = one_head(b"GET / HTTP/1.0\nX:  spaced value \t\n\n")
    assert head is not None and not head.keep_alive and head.headers == ((b"x", b"spaced value"),)
    head = one_head(b"GET / HTTP/1.1\r\nHost: a\n\r\n")  # mixed line ends end the head too
    assert head is not None and head.content_length == 0


def test_incomplete_head_then_completion_and_misuse():
    parser = RequestParser()
    parser.feed(b"GET / HTTP/1.1\r\nHo")
    assert parser.next_head() is None
    assert parser.waiting_for_head
    parser.feed(b"st: a\r\n\r")
    assert parser.next_head() is None
    parser.feed(b"\nPOST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nab")
    head = parser.next_head()
    assert head is not None and head.method == "GET" and parser.body_remaining == 0
    with pytest.raises(RuntimeError):
        parser.next_head()
    assert parser.next_body() == (b"", True)
    parser.start_next()
    assert parser.next_head() is not None
    with pytest.raises(RuntimeError):
        parser.start_next()  # body not read
    assert parser.body_remaining == 4
    assert parser.next_body() == (b"ab", False)
    assert parser.body_from(b"cd") == (b"cd", True)
    assert parser.body_done


def test_body_from_keeps_pipelined_bytes():
    parser = RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n")
    assert parser.next_head() is not None
    assert parser.body_from(b"xyGET / HTTP/1.1\r\nHost: a\r\n\r\n") == (b"xy", True)
    parser.start_next()
    head = parser.next_head()
    assert head is not None and head.method == "GET"


def test_rfc9112_6_2_a_content_length_body_read_into_the_callers_buffer():
    """§6.2: the body is exactly Content-Length octets. What is buffered comes through
    next_body first; then the rest may go straight into the caller's buffer, counted with
    body_received, never past the announced length; the next request's bytes stay the parser's."""
    parser = RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab")
    assert parser.next_head() is not None
    assert parser.body_room == 0  # "ab" is buffered: it comes first
    assert parser.next_body() == (b"ab", False)
    assert parser.body_room == 8
    assert parser.body_received(5) is False
    assert parser.body_room == 3 and parser.body_remaining == 3
    with pytest.raises(ValueError):
        parser.body_received(4)  # past the body
    with pytest.raises(ValueError):
        parser.body_received(0)
    assert parser.body_received(3) is True
    assert parser.body_done and parser.body_room == 0
    parser.start_next()
    parser.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    head = parser.next_head()
    assert head is not None and head.method == "GET" and parser.body_room == 0


def test_rfc9112_7_1_a_chunked_body_has_no_room_to_read_into():
    parser = RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert parser.next_head() is not None
    assert parser.body_room == 0
    with pytest.raises(ValueError):
        parser.body_received(1)


# ---- responses ----------------------------------------------------------------------------------


def head_for(raw: bytes) -> RequestHead:
    head = one_head(raw)
    assert head is not None
    return head


GET11 = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"


def client_events(request: bytes, wire: bytes) -> list[object]:
    """What an h11 client reads from ``wire`` after sending ``request``."""
    conn = h11.Connection(h11.CLIENT)
    head = head_for(request)
    # h11 only writes HTTP/1.1 requests; it reads any framing the response uses
    conn.send(h11.Request(method=head.method, target=head.target, headers=list(head.headers)))
    conn.send(h11.EndOfMessage())
    conn.receive_data(wire)
    events: list[object] = []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(b"")
            continue
        events.append(event)
        if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return events


@given(st.lists(st.binary(max_size=500), min_size=1, max_size=6), st.booleans(), st.sampled_from(["1.1", "1.0"]))
def test_framed_responses_read_back_with_h11(parts, declare_length, version):
    request = b"GET / HTTP/%s\r\nHost: a\r\n\r\n" % version.encode()
    framer = ResponseFramer(head_for(request))
    headers = [(b"content-type", b"text/plain")]
    if declare_length:
        headers.append((b"content-length", b"%d" % sum(map(len, parts))))
    framer.start(200, headers)
    wire = b"".join(
        bytes(p) for i, part in enumerate(parts) for p in framer.body(part, more_body=i < len(parts) - 1)
    )
    assert framer.complete
    events = client_events(request, wire)
    response = events[0]
    assert isinstance(response, h11.Response) and response.status_code == 200
    assert b"".join(e.data for e in events if isinstance(e, h11.Data)) == b"".join(parts)
    names = dict(response.headers)
    if version == "1.0":  # no keep-alive asked for
        assert not framer.keep_alive and names[b"connection"] == b"close"
        assert b"transfer-encoding" not in names
    elif not declare_length and len(parts) > 1:
        assert names[b"transfer-encoding"] == b"chunked"
    else:
        assert int(names[b"content-length"]) == sum(map(len, parts))
    assert b"date" in names


def test_keep_alive_rules():
    f = ResponseFramer(head_for(b"GET / HTTP/1.0\r\n\r\n"))
    f.start(200, [])
    assert b"connection: close\r\n" in f.body(b"x", False)[0] and not f.keep_alive
    f = ResponseFramer(head_for(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
    f.start(200, [])
    assert b"connection: keep-alive\r\n" in f.body(b"x", False)[0] and f.keep_alive
    f = ResponseFramer(head_for(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
    f.start(200, [])
    wire = b"".join(bytes(p) for p in f.body(b"x", True))
    assert b"connection: close\r\n" in wire and not f.keep_alive  # close-delimited body
    f = ResponseFramer(head_for(GET11))
    f.start(200, [(b"Connection", b"close")])
    wire = f.body(b"", False)[0]
    assert not f.keep_alive and wire.count(b"onnection") == 1
    f = ResponseFramer(head_for(GET11), allow_keep_alive=False)
    f.start(200, [])
    assert b"connection: close\r\n" in f.body(b"", False)[0]


def test_head_and_no_content_responses_carry_no_body():
    f = ResponseFramer(head_for(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"))
    f.start(200, [(b"content-length", b"10")])
    wire = b"".join(bytes(p) for p in f.body(b"", False))
    assert wire.endswith(b"\r\n\r\n") and b"content-length: 10" in wire
    f = ResponseFramer(head_for(GET11))
    f.start(204, [])
    wire = b"".join(bytes(p) for p in f.body(b"", True)) + b"".join(bytes(p) for p in f.body(b"", False))
    assert b"transfer-encoding" not in wire and b"content-length" not in wire and wire.endswith(b"\r\n\r\n")


def test_large_bodies_are_not_copied_into_the_head():
    f = ResponseFramer(head_for(GET11))
    f.start(200, [(b"content-length", b"%d" % (1 << 17))])
    data = b"z" * (1 << 17)
    parts = f.body(data, False)
    assert len(parts) == 2 and parts[1] is data


@pytest.mark.parametrize("headers, body, more", [
    ([(b"x", b"a\r\nInjected: 1")], b"", False),
    ([(b"bad name", b"1")], b"", False),
    ([(b"content-length", b"2")], b"abc", False),
    ([(b"content-length", b"5")], b"abc", False),
    ([(b"content-length", b"x")], b"", False),
    ([(b"transfer-encoding", b"gzip")], b"", False),
])
def test_unframable_responses_raise(headers, body, more):
    f = ResponseFramer(head_for(GET11))
    with pytest.raises(ResponseError):
        f.start(200, headers)
        f.body(body, more)


def test_framer_misuse_raises():
    f = ResponseFramer(head_for(GET11))
    with pytest.raises(ResponseError):
        f.body(b"", False)
    with pytest.raises(ResponseError):
        f.start(99, [])
    f.start(200, [])
    with pytest.raises(ResponseError):
        f.start(200, [])
    f.body(b"", False)
    with pytest.raises(ResponseError):
        f.body(b"", False)


def test_error_response_and_continue_read_back():
    events = client_events(GET11, error_response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too large"))
    response = events[0]
    assert isinstance(response, h11.Response) and response.status_code == 431
    assert dict(response.headers)[b"connection"] == b"close"
    assert CONTINUE == b"HTTP/1.1 100 Continue\r\n\r\n"


# ---- the parse caches and the fast path's response head ------------------------------------------


def test_a_repeated_head_parses_alike_and_shares_its_immutable_header_tuple():
    """The cached head's fields are one tuple (callers cache by its identity); no caller can change
    what another sees."""
    data = b"POST /v2/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nX-Mixed: V\r\n\r\n"
    first, second = one_head(data), one_head(data)  # the second comes from the head cache
    assert first is not None and second is not None and first is not second
    for name in ("method", "target", "http_version", "headers", "content_length", "chunked", "keep_alive",
                 "expect_continue"):
        assert getattr(first, name) == getattr(second, name), name
    assert isinstance(first.headers, tuple) and first.headers is second.headers
    assert first.headers == ((b"host", b"a"), (b"content-length", b"3"), (b"x-mixed", b"V"))


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nHost: a\r\nBad Name: v\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
])
def test_malformed_heads_are_refused_every_time(data):
    """Errors are never cached: the same bytes, or a valid line seen before in a bad head, still fail."""
    for _ in range(3):
        with pytest.raises(ProtocolError):
            one_head(data)
    assert one_head(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n") is not None


def test_cached_lines_keep_their_framing_meaning():
    """A line cached from one head still frames the body in the next (different) head."""
    for target in (b"/a", b"/b"):
        head = one_head(b"POST %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" % target)
        assert head is not None and head.chunked and head.content_length is None
        head = one_head(b"POST %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 7\r\n\r\n" % target)
        assert head is not None and not head.keep_alive and head.content_length == 7


@pytest.mark.parametrize("version, keep_alive", [("1.1", True), ("1.1", False), ("1.0", True), ("1.0", False)])
def test_encode_head_is_what_the_framer_writes(version, keep_alive, monkeypatch):
    from trident.protocol import http1

    monkeypatch.setattr(http1, "http_date", lambda: b"Tue, 01 Dec 2026 00:00:00 GMT")  # no second boundary
    request = b"POST / HTTP/%s\r\nHost: a\r\n%s\r\n" % (
        version.encode(), b"Connection: keep-alive\r\n" if version == "1.0" and keep_alive else b"")
    head = one_head(request if keep_alive or version == "1.0" else request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert head is not None and head.keep_alive == keep_alive
    headers = [(b"content-type", b"application/json"), (b"inference-header-content-length", b"2")]
    framer = ResponseFramer(head)
    framer.start(200, [*headers, (b"content-length", b"5")])
    framed = b"".join(framer.body(b"hello", False))
    assert encode_head(200, headers, 5, keep_alive, version) + b"hello" == framed
