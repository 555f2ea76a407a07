"""atheris target for the HTTP/1.1 request parser and response framer (trident.protocol.http1).

Input layout: the first byte picks how the rest is cut into received pieces (``1 + b % 97``
bytes each, the step growing with the byte) and the largest body piece asked for; the rest is
the byte stream of one connection, parsed as pipelined requests. Every parsed request is
answered through a ResponseFramer that echoes its headers and body, which must give a
well-formed response or ResponseError.

Accepted outcomes are ProtocolError (from parsing) and ResponseError (from framing); any other
exception, or a broken invariant (a body piece over its limit, a body longer than its
Content-Length, a complete response that is not complete), is a bug.

Run: ``python fuzz/fuzz_http1.py fuzz/corpus/http1`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_http1.py).
"""

from __future__ import annotations

import sys

from trident.protocol.http1 import ProtocolError, RequestHead, RequestParser, ResponseError, ResponseFramer


def one_input(data: bytes) -> None:
    """Parse one connection's bytes; raises only for bugs."""
    if not data:
        return
    mode, stream = data[0], data[1:]
    max_body = 1 + mode * 7
    parser = RequestParser(max_head_size=2048)
    head: RequestHead | None = None
    body = bytearray()
    pos, step = 0, 1 + mode % 97
    try:
        while pos < len(stream):
            piece = stream[pos : pos + step]
            pos += step
            step = step % 97 + 1
            if head is not None and not parser.buffered and parser.body_remaining:
                got = parser.body_from(piece)
                if got is not None:
                    head, body = _body_piece(parser, head, body, got, max_body)
            else:
                parser.feed(piece)
            while True:
                if head is None:
                    head = parser.next_head()
                    if head is None:
                        break
                    body = bytearray()
                got = parser.next_body(max_body)
                if got is None:
                    break
                head, body = _body_piece(parser, head, body, got, max_body)
    except ProtocolError as exc:
        assert 400 <= exc.status <= 505 and exc.message


def _body_piece(parser: RequestParser, head: RequestHead, body: bytearray, got: tuple[bytes, bool],
                max_body: int) -> tuple[RequestHead | None, bytearray]:
    piece, done = got
    body += piece
    if head.content_length is not None:
        assert len(body) <= head.content_length
    if not done:
        assert piece
        return head, body
    if head.content_length is not None:
        assert len(body) == head.content_length
    _respond(head, bytes(body))
    parser.start_next()
    return None, bytearray()


def _respond(head: RequestHead, body: bytes) -> None:
    framer = ResponseFramer(head)
    try:
        framer.start(200, head.headers)
        wire = b"".join(bytes(p) for p in framer.body(body, more_body=bool(body)))
        if body:
            wire += b"".join(bytes(p) for p in framer.body(b"", more_body=False))
    except ResponseError:
        return
    assert framer.complete
    assert wire.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\n\r\n" in wire


def main() -> None:
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
