"""trident.perf.wire: prebuilt requests decode with trident's own codecs; the lean response
readers find response boundaries, statuses and errors; the HTTP/2 client speaks to h2."""

from __future__ import annotations

import json
import struct

import h2.config
import h2.connection
import h2.events
import numpy as np
import pytest

from trident.perf.wire import (
    H2Connection,
    HTTPResponseReader,
    PerfError,
    Tensor,
    decode_fields,
    grpc_infer_message,
    grpc_messages,
    http_infer_request,
)
from trident.protocol.grpc_codec import decode_model_infer_request

X = np.arange(16, dtype=np.float32)
T = [Tensor("INPUT0", "FP32", (1, 16), X.tobytes()), Tensor("INPUT1", "FP32", (1, 16), (X * 2).tobytes())]


def test_http_request_is_a_binary_tensor_post():
    raw = http_infer_request("h:1", "add_sub", "2", T, ["OUTPUT0"])
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/add_sub/versions/2/infer HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert int(fields["Content-Length"]) == len(body)
    n = int(fields["Inference-Header-Content-Length"])
    header = json.loads(body[:n])
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [64, 64]
    assert header["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    assert np.array_equal(np.frombuffer(body[n:n + 64], np.float32), X)


def test_http_request_with_shared_memory_has_no_tensor_bytes():
    shm = [Tensor("INPUT0", "FP32", (16,), b"", ("in", 64, 64))]
    raw = http_infer_request("h", "m", "", shm, ["OUT"], {"OUT": ("out", 0, 100)})
    body = raw.partition(b"\r\n\r\n")[2]
    header = json.loads(body)
    assert header["inputs"][0]["parameters"] == {"shared_memory_region": "in", "shared_memory_offset": 64,
                                                 "shared_memory_byte_size": 64}
    assert header["outputs"][0]["parameters"]["shared_memory_region"] == "out"


def test_grpc_message_decodes_with_tridents_codec():
    msg = grpc_infer_message("add_sub", "1", T, ["OUTPUT1"], parameters={"flag": True, "n": 3, "s": "x"})
    req = decode_model_infer_request(msg)
    assert req.model_name == "add_sub" and req.model_version == "1"
    assert [t.name for t in req.inputs] == ["INPUT0", "INPUT1"]
    assert np.array_equal(req.inputs[1].data.reshape(-1), X * 2) and req.inputs[0].data.shape == (1, 16)
    assert [o.name for o in req.outputs] == ["OUTPUT1"]
    assert req.parameters == {"flag": True, "n": 3, "s": "x"}


def test_http_reader_splits_and_joins_responses():
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    r = HTTPResponseReader()
    assert r.feed(ok) == [(200, b"")]
    assert r.feed(ok) == [(200, b"")]  # the cached whole answer
    both = ok + b"HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\n{\"error\":\"x\"}"
    assert r.feed(both[:10]) == []
    assert r.feed(both[10:50]) == [(200, b"")]
    assert r.feed(both[50:]) == [(400, b'{"error":"x"}')]


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", b"garbage\r\n\r\n"])
def test_http_reader_refuses_what_it_can_not_frame(head):
    with pytest.raises(PerfError):
        HTTPResponseReader().feed(head)


def test_http_reader_bounds_the_head():
    with pytest.raises(PerfError, match="64 KiB"):
        HTTPResponseReader().feed(b"HTTP/1.1 200 OK\r\n" + b"x" * 70000)


def test_decode_fields_and_grpc_messages():
    msg = grpc_infer_message("m", "", T[:1], [])
    f = decode_fields(msg)
    assert f[1] == [b"m"] and len(f[7][0]) == 64  # type: ignore[arg-type]
    buf = bytearray(b"\x00" + struct.pack(">I", 3) + b"abc" + b"\x00\x00")
    assert list(grpc_messages(buf)) == [b"abc"] and buf == b"\x00\x00"
    with pytest.raises(PerfError):
        decode_fields(b"\x0a\x05ab")  # length past the end
    with pytest.raises(PerfError):
        list(grpc_messages(bytearray(b"\x01\x00\x00\x00\x00")))  # compressed


def _server() -> h2.connection.H2Connection:
    s = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    s.initiate_connection()
    return s


def test_h2_client_against_h2_server():
    c = H2Connection("h:1")
    server = _server()
    sid = c.start("/inference.GRPCInferenceService/ModelInfer")
    c.send_message(sid, b"x" * 100_000, end=True)  # larger than the default window: waits for updates
    events = server.receive_data(c.initiate() + c.outgoing())
    got = bytearray()
    for _ in range(20):
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                got += ev.data
                server.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        done = [ev for ev in events if isinstance(ev, h2.events.StreamEnded)]
        if done:
            break
        assert c.receive(server.data_to_send()) == []
        events = server.receive_data(c.outgoing())
    assert len(got) == 100_005
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    server.send_data(sid, b"\x00\x00\x00\x00\x02ok")
    server.send_headers(sid, [("grpc-status", "5"), ("grpc-message", "not%20found")], end_stream=True)
    ended = c.receive(server.data_to_send())
    assert [(e.stream, e.status, e.message) for e in ended] == [(sid, 5, "not found")]
    # the second request's header block is a few bytes of indexes
    sid2 = c.start("/inference.GRPCInferenceService/ModelInfer")
    c.send_message(sid2, b"", end=True)
    out = c.outgoing()
    assert len(out) < 40
    events = server.receive_data(out)
    req = [ev for ev in events if isinstance(ev, h2.events.RequestReceived)][0]
    assert (":path", "/inference.GRPCInferenceService/ModelInfer") in req.headers


def test_h2_client_reports_resets_and_goaway():
    c = H2Connection("h:1")
    server = _server()
    sid = c.start("/x")
    c.send_message(sid, b"", end=True)
    server.receive_data(c.initiate() + c.outgoing())
    server.reset_stream(sid, 8)
    ended = c.receive(server.data_to_send())
    assert ended[0].status == -1 and "reset" in ended[0].message
    server.close_connection(error_code=2)
    with pytest.raises(PerfError, match="GOAWAY"):
        c.receive(server.data_to_send())


def _answer(server: h2.connection.H2Connection, sid: int, status: str = "0", body: bytes = b"ok") -> bytes:
    server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    server.send_data(sid, b"\x00" + struct.pack(">I", len(body)) + body)
    server.send_headers(sid, [("grpc-status", status)], end_stream=True)
    return server.data_to_send()


def test_h2_client_recognises_a_repeated_answer_whole():
    """A unary answer that repeats byte for byte (but the stream id) ends its call without
    decoding, and anything else (another status, another body) is decoded in full."""
    c = H2Connection("h:1")
    server = _server()
    payload = b"\x0a\x01x"
    sid, data = c.unary("/m", payload)
    server.receive_data(c.initiate() + data)
    c.receive(server.data_to_send())  # SETTINGS and its ACK
    assert [(e.stream, e.status) for e in c.receive(_answer(server, sid))] == [(sid, 0)]
    for _ in range(3):  # the second answer becomes the template, later ones match it
        sid, data = c.unary("/m", payload)
        server.receive_data(data)
        assert [(e.stream, e.status) for e in c.receive(_answer(server, sid))] == [(sid, 0)]
        assert c.open_streams == 0
    assert c._answer is not None
    sid, data = c.unary("/m", payload)
    server.receive_data(data)
    assert [(e.stream, e.status) for e in c.receive(_answer(server, sid, status="3"))] == [(sid, 3)]
    sid, data = c.unary("/m", payload)
    server.receive_data(data)
    assert [(e.stream, e.status) for e in c.receive(_answer(server, sid, body=b"no"))] == [(sid, 0)]


def test_h2_client_recognises_an_answer_followed_by_a_window_update():
    """gRPC C++ servers (Triton) write the answer and a connection WINDOW_UPDATE for the
    request's bytes together: the template includes it and returns the window each time; a
    WINDOW_UPDATE for the stream, or one before the trailers, is decoded frame by frame."""
    c = H2Connection("h:1")
    server = _server()
    payload = b"\x0a\x01x"
    sid, data = c.unary("/m", payload)
    server.receive_data(c.initiate() + data)
    c.receive(server.data_to_send())
    c.receive(_answer(server, sid))
    start = c._conn_window
    for _ in range(4):
        sid, data = c.unary("/m", payload)
        server.receive_data(data)
        update = struct.pack(">I", 4)[1:] + bytes([8, 0]) + struct.pack(">II", 0, len(payload) + 5)
        assert [(e.stream, e.status) for e in c.receive(_answer(server, sid) + update)] == [(sid, 0)]
        assert c._conn_window == start and c.open_streams == 0
    assert c._answer is not None and c._answer[3] == len(payload) + 5
    from trident.perf.wire import _whole_answer

    answer = bytes(c._answer[0])
    sid = int.from_bytes(answer[5:9], "big")
    bare, update = answer[:-13], answer[-13:]
    assert _whole_answer(bare + update + update, sid)[3] == 2 * (len(payload) + 5)  # type: ignore[index]
    per_stream = struct.pack(">I", 4)[1:] + bytes([8, 0]) + struct.pack(">II", sid, 8)
    assert _whole_answer(bare + per_stream, sid) is None
    assert _whole_answer(update + bare, sid) is None  # before the answer
    assert _whole_answer(bare + update + bare[-10:], sid) is None  # a frame after it


def test_h2_client_drops_its_template_when_the_table_changes():
    """The template's index bytes mean other headers once a block adds to the dynamic table."""
    import hpack

    enc = hpack.Encoder()

    def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload

    def answer(sid: int, status: str) -> bytes:
        return (frame(1, 4, sid, enc.encode([(":status", "200")])) + frame(0, 0, sid, b"\x00\x00\x00\x00\x00")
                + frame(1, 5, sid, enc.encode([("grpc-status", status)])))

    c = H2Connection("h:1")
    got = []
    for status in ("0", "0", "0", "7", "7", "0"):
        sid, _ = c.unary("/m", b"")
        raw = answer(sid, status)
        got.append([e.status for e in c.receive(raw)])
    # the third "0" matched the template whole; the second "7" is the template's bytes exactly
    # (grpc-status 7 took index 62, where "grpc-status: 0" was), and must still read as 7
    assert got == [[0], [0], [0], [7], [7], [0]]


def test_table_neutral_hpack_blocks():
    from trident.perf.wire import _whole_answer, table_neutral

    assert table_neutral(b"\x88\xc0\xbf")  # indexed fields only
    assert table_neutral(b"\x0f\x10\x01" + b"0")  # literal without indexing, indexed name (index 31)
    assert table_neutral(b"\x10\x03abc\x01x")  # never indexed, literal name
    assert not table_neutral(b"\x40\x03abc\x01x")  # incremental indexing adds an entry
    assert not table_neutral(b"\x3f\xe1\x1f")  # a table size update
    assert not table_neutral(b"\x00\x05ab")  # truncated string
    frame = struct.pack(">I", 3)[1:] + bytes([1, 4]) + struct.pack(">I", 3)
    assert _whole_answer(frame + b"\x88\xc0\xbf", 3) is None  # no DATA and trailers
