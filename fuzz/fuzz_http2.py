"""atheris target for trident.protocol.http2 (the sans-IO HTTP/2 server).

Input layout: the first byte is the mode, the rest the client's bytes.

* bit 0 set: the valid preface and an empty SETTINGS frame go first (so the frames themselves
  are fuzzed); clear: the input is the whole byte stream, preface included;
* bits 1-3: how the bytes are cut into chunks (1, 2, 7, 9, 64, 1000, 16384 bytes or whole);
* bits 4-7: what the consumer does with the events: acknowledge DATA, answer requests (headers,
  a DATA message, trailers), reset every third stream, send PINGs and GOAWAY.

Two servers are fed the same chunks, one with the HPACK caches and large header blocks decoded
in pieces of 256 bytes (each chunk's pending block run to the end with ``continue_headers``),
one without caches decoding every block whole: their events and their output must be equal
byte for byte (a cached result is exactly what decoding or encoding gives, and decoding in
pieces what decoding whole gives). Accepted outcome: :class:`~trident.protocol.http2.ProtocolError` (after which
the last frame sent must be a GOAWAY with its code); any other exception is a bug, and so is
output beyond 64 bytes per input byte plus 4 KiB, a DATA event carrying more bytes than its
flow-controlled length, or a stream table larger than ``max_open_streams``.

Run: ``python fuzz/fuzz_http2.py fuzz/corpus/http2`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_http2.py).
"""

from __future__ import annotations

import struct
import sys

from trident.protocol import http2

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
CHUNKS = (1, 2, 7, 9, 64, 1000, 16384, 1 << 30)
MAX_STREAMS = 8
RESPONSE = ((b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding", b"gzip"))
TRAILERS_OK = ((b"grpc-status", b"0"),)


def _server(cache: bool) -> http2.H2Server:
    s = http2.H2Server(max_concurrent_streams=MAX_STREAMS, initial_window_size=65535, max_frame_size=16384,
                       max_header_list_size=8192, max_header_list_hard=65536, max_header_block=32768,
                       max_open_streams=MAX_STREAMS, connection_window=1 << 20, header_cache=cache,
                       header_step=256 if cache else 0)
    s.initiate_connection()
    return s


def _normal(event: tuple) -> tuple:
    """The event with its byte views as bytes (a DATA event's list of slices joined)."""
    return tuple(bytes(x) if isinstance(x, memoryview) else b"".join(x) if isinstance(x, list) else x
                 for x in event)


def _consume(s: http2.H2Server, events: list, mode: int, counter: list[int]) -> None:
    """Act on the events as a gRPC transport would (what it does depends on ``mode``)."""
    for event in events:
        kind = event[0]
        if kind == http2.DATA:
            data = event[2]
            assert (sum(map(len, data)) if isinstance(data, list) else len(data)) <= event[3], event
            if mode & 0x10:
                s.acknowledge_received_data(event[3], event[1])
        elif kind == http2.REQUEST:
            stream_id = event[1]
            counter[0] += 1
            if mode & 0x40 and counter[0] % 3 == 0:
                try:
                    s.reset_stream(stream_id, http2.CANCEL)
                except http2.StreamClosedError:
                    # reset by the client (or a stream error) later in the same chunk: the
                    # transport's _reset_quietly ignores it the same way
                    assert stream_id not in s.streams
            elif mode & 0x20:
                try:
                    s.send_headers(stream_id, RESPONSE)
                    if s.local_flow_control_window(stream_id) >= 7:
                        s.send_data(stream_id, b"\x00\x00\x00\x00\x02hi")
                    s.send_headers(stream_id, TRAILERS_OK if counter[0] % 2 else (
                        (b"grpc-status", b"13"), (b"grpc-message", b"m%d" % counter[0])), end_stream=True)
                    if stream_id in s.streams:
                        s.reset_stream(stream_id, http2.NO_ERROR)
                except http2.StreamClosedError:
                    # reset by the client (or a stream error) later in the same chunk
                    assert stream_id not in s.streams
    if mode & 0x80 and events:
        s.ping(b"trident\x00")
        if counter[0] > 4:
            s.goaway(http2.NO_ERROR)


def one_input(data: bytes) -> None:
    """Run one fuzz input; raises only for bugs."""
    if not data:
        return
    mode, body = data[0], data[1:]
    if mode & 1:
        body = http2.PREFACE + SETTINGS + body
    step = CHUNKS[(mode >> 1) & 7]
    servers = (_server(True), _server(False))
    outputs = [bytearray(s.data_to_send()) for s in servers]
    counters = [[0], [0]]
    errors: list[int | None] = [None, None]
    for pos in range(0, len(body), step):
        chunk = body[pos : pos + step]
        results = []
        for i, s in enumerate(servers):
            if errors[i] is not None:
                results.append(None)
                continue
            try:
                events = s.receive_data(chunk)
                for _ in range(len(body) + 1):  # a large block pending: its pieces, then what followed
                    if s.header_work is None:
                        break
                    events += s.continue_headers()
                assert s.header_work is None
            except http2.ProtocolError as e:
                errors[i] = e.error_code
                out = s.data_to_send()
                goaway = out.rfind(b"\x07\x00\x00\x00\x00\x00")  # type GOAWAY, flags 0, stream 0
                assert goaway >= 3 and struct.unpack_from(">I", out, goaway + 10)[0] == e.error_code
                outputs[i] += out
                results.append(None)
                continue
            results.append([_normal(e) for e in events])
            _consume(s, events, mode, counters[i])
            assert len(s.streams) <= MAX_STREAMS
            outputs[i] += s.data_to_send()
        assert results[0] == results[1], "the HPACK caches changed what was decoded"
        assert errors[0] == errors[1]
        if errors[0] is not None:
            break
    assert outputs[0] == outputs[1], "the HPACK caches changed what was sent"
    assert len(outputs[0]) <= 64 * len(body) + 4096, (len(outputs[0]), len(body))


def main() -> None:
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
