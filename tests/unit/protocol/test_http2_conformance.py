"""Conformance of trident.protocol.http2 (the sans-IO HTTP/2 server) to RFC 9113 and RFC 7541.

Each test names the section it checks. Frames are built with hyperframe and header blocks with
hpack (independent implementations), fed to the state machine as raw bytes, and what it sends
back is parsed with hyperframe again and compared exactly.
"""

from __future__ import annotations

import struct

import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from trident.protocol import http2
from trident.protocol.http2 import (
    COMPRESSION_ERROR,
    DATA,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    NO_ERROR,
    PING,
    PING_ACK,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    REQUEST,
    RESET,
    STREAM_CLOSED,
    TRAILERS,
    WINDOW,
    H2Server,
    ProtocolError,
)
from trident.protocol.http2_headers import table_neutral

REQUEST_HEADERS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/pkg.Svc/Method"),
                   (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def parse(data: bytes) -> list[Frame]:
    """Every frame in ``data`` (which must end at a frame boundary)."""
    frames = []
    view = memoryview(data)
    while view:
        frame, length = Frame.parse_frame_header(view[:9])
        frame.parse_body(view[9 : 9 + length])
        frames.append(frame)
        view = view[9 + length :]
    return frames


def settings(**values: int) -> bytes:
    f = SettingsFrame(0)
    for key, value in values.items():
        f.settings[getattr(SettingsFrame, key.upper())] = value
    return f.serialize()


def server(**kwargs) -> H2Server:
    """A server past the handshake (client preface + empty SETTINGS), nothing left to send."""
    s = H2Server(**kwargs)
    s.initiate_connection()
    s.data_to_send()
    assert s.receive_data(PREFACE + settings()) == []
    assert [type(f) for f in parse(s.data_to_send())] == [SettingsFrame]
    return s


class Client:
    """Builds the client side's header blocks with its own HPACK encoder."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def headers(self, stream_id: int, headers=None, *, end_stream: bool = False, end_headers: bool = True,
                extra=()) -> bytes:
        f = HeadersFrame(stream_id)
        f.data = self.encoder.encode(list(headers or REQUEST_HEADERS) + list(extra))
        if end_stream:
            f.flags.add("END_STREAM")
        if end_headers:
            f.flags.add("END_HEADERS")
        return f.serialize()


def data(stream_id: int, payload: bytes, *, end_stream: bool = False, pad: int | None = None) -> bytes:
    f = DataFrame(stream_id)
    f.data = payload
    if end_stream:
        f.flags.add("END_STREAM")
    if pad is not None:
        f.flags.add("PADDED")
        f.pad_length = pad
    return f.serialize()


def raw(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


def connection_error(s: H2Server, chunk: bytes, code: int) -> GoAwayFrame:
    """Feed ``chunk``: it must be a connection error with ``code``; returns the GOAWAY sent."""
    with pytest.raises(ProtocolError) as info:
        s.receive_data(chunk)
    assert info.value.error_code == code
    frames = parse(s.data_to_send())
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == code
    assert s.closed and s.receive_data(data(1, b"late")) == []  # a dead connection reads nothing
    return frames[-1]


def sent(s: H2Server) -> list[Frame]:
    return parse(s.data_to_send())


def rst(stream_id: int, code: int) -> list[tuple[type, int, int]]:
    return [(RstStreamFrame, stream_id, code)]


def resets(frames: list[Frame]) -> list[tuple[type, int, int]]:
    return [(type(f), f.stream_id, f.error_code) for f in frames]


def opened(s: H2Server, c: Client, stream_id: int = 1, **kwargs) -> None:
    events = s.receive_data(c.headers(stream_id, **kwargs))
    assert [e[:2] for e in events] == [(REQUEST, stream_id)]


# ---- RFC 9113 §3.4: the connection preface ---------------------------------------------------


def test_rfc9113_3_4_server_preface_is_settings_then_connection_window():
    s = H2Server(max_concurrent_streams=7, initial_window_size=1 << 20, max_frame_size=1 << 20,
                 max_header_list_size=9999, connection_window=2**31 - 1)
    s.initiate_connection()
    first, window = parse(s.data_to_send())
    assert isinstance(first, SettingsFrame) and not first.flags
    assert first.settings == {SettingsFrame.MAX_CONCURRENT_STREAMS: 7, SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 20,
                              SettingsFrame.MAX_FRAME_SIZE: 1 << 20, SettingsFrame.MAX_HEADER_LIST_SIZE: 9999,
                              SettingsFrame.ENABLE_PUSH: 0}
    assert isinstance(window, WindowUpdateFrame) and window.stream_id == 0
    assert window.window_increment == 2**31 - 1 - 65535


def test_rfc9113_3_4_invalid_preface_is_protocol_error():
    s = H2Server()
    s.initiate_connection()
    s.data_to_send()
    connection_error(s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", PROTOCOL_ERROR)


def test_rfc9113_3_4_preface_may_arrive_byte_by_byte():
    s = H2Server()
    s.initiate_connection()
    s.data_to_send()
    for i in range(len(PREFACE)):
        assert s.receive_data(PREFACE[i : i + 1]) == []
    s.receive_data(settings())
    assert [type(f) for f in sent(s)] == [SettingsFrame]


def test_rfc9113_3_4_first_frame_must_be_settings():
    s = H2Server()
    s.initiate_connection()
    s.data_to_send()
    connection_error(s, PREFACE + PingFrame(0).serialize(), PROTOCOL_ERROR)


def test_rfc9113_3_4_first_frame_must_not_be_a_settings_ack():
    s = H2Server()
    s.initiate_connection()
    connection_error(s, PREFACE + raw(4, 1, 0, b""), PROTOCOL_ERROR)


# ---- §4: frames ------------------------------------------------------------------------------


def test_rfc9113_4_1_unknown_frame_types_and_flags_are_ignored():
    s, c = server(), Client()
    assert s.receive_data(raw(0xFA, 0xFF, 0, b"whatever") + raw(0x21, 0, 3, b"")) == []
    assert sent(s) == []
    events = s.receive_data(raw(1, 0x4 | 0x1 | 0x40 | 0x80, 1, c.encoder.encode(REQUEST_HEADERS)))
    assert events == [(REQUEST, 1, tuple(REQUEST_HEADERS), True)]


def test_rfc9113_4_2_frame_over_max_frame_size_is_frame_size_error():
    s = server()
    connection_error(s, raw(0, 0, 1, b"x" * 16385)[:9 + 100], FRAME_SIZE_ERROR)


def test_rfc9113_4_2_frames_up_to_the_advertised_max_frame_size_are_accepted():
    s, c = server(max_frame_size=1 << 20, initial_window_size=1 << 20), Client()
    opened(s, c)
    payload = b"y" * 100_000
    events = s.receive_data(data(1, payload))
    assert b"".join(bytes(e[2]) for e in events) == payload and sum(e[3] for e in events) == len(payload)


def test_rfc9113_4_1_frames_split_anywhere_parse_the_same():
    c = Client()
    stream = (c.headers(1) + data(1, b"abc", pad=3) + PingFrame(0, opaque_data=b"12345678").serialize()
              + data(1, b"defgh", end_stream=True))
    for step in (1, 2, 5, 9, 10, 13):
        s = server()
        events = []
        for i in range(0, len(stream), step):
            events += s.receive_data(stream[i : i + step])
        assert events[0] == (REQUEST, 1, tuple(REQUEST_HEADERS), False)
        payload = b"".join(bytes(e[2]) for e in events if e[0] == DATA)
        assert payload == b"abcdefgh"
        assert sum(e[3] for e in events if e[0] == DATA) == (3 + 1 + 3) + 5  # padding is flow-controlled
        assert [e for e in events if e[0] == DATA][-1][4] is True
        assert (PING, b"12345678") in events


# ---- §5.1: stream states ---------------------------------------------------------------------


def test_rfc9113_5_1_data_on_an_idle_stream_is_protocol_error():
    connection_error(server(), data(1, b"x"), PROTOCOL_ERROR)


def test_rfc9113_5_1_rst_stream_on_an_idle_stream_is_protocol_error():
    connection_error(server(), RstStreamFrame(5).serialize(), PROTOCOL_ERROR)


def test_rfc9113_5_1_window_update_on_an_idle_stream_is_protocol_error():
    connection_error(server(), WindowUpdateFrame(3, window_increment=1).serialize(), PROTOCOL_ERROR)


def test_rfc9113_5_1_priority_on_an_idle_stream_is_allowed():
    s = server()
    assert s.receive_data(PriorityFrame(9, depends_on=0, stream_weight=16).serialize()) == []
    assert sent(s) == []


def test_rfc9113_5_1_data_after_end_stream_is_stream_closed():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    events = s.receive_data(data(1, b"late"))
    assert events == [(RESET, 1, STREAM_CLOSED)]
    assert resets(sent(s)) == rst(1, STREAM_CLOSED)


def test_rfc9113_5_1_headers_after_end_stream_is_stream_closed():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    events = s.receive_data(c.headers(1, [(b"x-late", b"1")], end_stream=True))
    assert events == [(RESET, 1, STREAM_CLOSED)]
    assert resets(sent(s)) == rst(1, STREAM_CLOSED)
    opened(s, c, 3)  # HPACK stayed in step


def test_rfc9113_5_1_frames_on_a_stream_we_reset_are_ignored():
    s, c = server(connection_window=65535, max_frame_size=1 << 16), Client()
    opened(s, c)
    s.reset_stream(1, http2.CANCEL)
    assert resets(sent(s)) == rst(1, http2.CANCEL)
    assert s.receive_data(data(1, b"x" * 40_000) + WindowUpdateFrame(1, window_increment=5).serialize()) == []
    # nothing answered, but the dropped DATA's connection window is given back
    frames = sent(s)
    assert [(type(f), f.stream_id, f.window_increment) for f in frames] == [(WindowUpdateFrame, 0, 40_000)]


def test_rfc9113_5_1_frames_on_a_stream_the_client_reset_are_ignored():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(RstStreamFrame(1, error_code=http2.CANCEL).serialize()) == [(RESET, 1, http2.CANCEL)]
    assert s.receive_data(data(1, b"x") + RstStreamFrame(1).serialize()) == []
    assert sent(s) == []  # never RST_STREAM in answer to RST_STREAM (§5.4.2)


def test_rfc9113_5_1_data_on_a_closed_stream_is_stream_closed():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    s.send_headers(1, [(b":status", b"200")], end_stream=True)
    sent(s)
    assert s.streams == {}
    assert s.receive_data(data(1, b"x")) == []
    assert resets(sent(s)) == rst(1, STREAM_CLOSED)


def test_rfc9113_5_1_1_even_client_stream_id_is_protocol_error():
    connection_error(server(), Client().headers(2), PROTOCOL_ERROR)


def test_rfc9113_5_1_1_lower_stream_id_is_a_closed_stream():
    s, c = server(), Client()
    opened(s, c, 5)
    assert s.receive_data(c.headers(3)) == []
    assert resets(sent(s)) == rst(3, STREAM_CLOSED)
    opened(s, c, 7)  # the block was decoded: HPACK stays in step


def test_rfc9113_5_1_2_streams_over_the_limit_are_refused():
    s, c = server(max_open_streams=2), Client()
    opened(s, c, 1)
    opened(s, c, 3)
    assert s.receive_data(c.headers(5)) == []
    assert resets(sent(s)) == rst(5, REFUSED_STREAM)
    s.reset_stream(1)
    sent(s)
    opened(s, c, 7)


# ---- §5.4: error handling --------------------------------------------------------------------


def test_rfc9113_5_4_1_goaway_names_the_last_stream_processed():
    s, c = server(), Client()
    opened(s, c, 1)
    opened(s, c, 3)
    goaway = connection_error(s, raw(5, 0, 3, b"\x00\x00\x00\x02"), PROTOCOL_ERROR)
    assert goaway.last_stream_id == 3 and goaway.additional_data == b"PUSH_PROMISE from a client"


def test_rfc9113_5_4_2_a_stream_error_leaves_the_connection_and_other_streams_alone():
    s, c = server(), Client()
    opened(s, c, 1)
    bad = REQUEST_HEADERS + [(b"Upper", b"x")]
    assert s.receive_data(c.headers(3, bad)) == []
    assert resets(sent(s)) == rst(3, PROTOCOL_ERROR)
    events = s.receive_data(data(1, b"ok", end_stream=True))
    assert [(e[0], e[1], bytes(e[2])) for e in events] == [(DATA, 1, b"ok")]


def test_rfc9113_5_5_unknown_frame_inside_a_header_block_is_protocol_error():
    s, c = server(), Client()
    connection_error(s, c.headers(1, end_headers=False) + raw(0xBB, 0, 0, b""), PROTOCOL_ERROR)


# ---- §6.1 DATA -------------------------------------------------------------------------------


def test_rfc9113_6_1_data_on_stream_0_is_protocol_error():
    connection_error(server(), raw(0, 0, 0, b"x"), PROTOCOL_ERROR)


def test_rfc9113_6_1_padding_is_removed_and_flow_controlled():
    s, c = server(), Client()
    opened(s, c)
    events = s.receive_data(data(1, b"payload", pad=10, end_stream=True))
    assert [(e[0], e[1], bytes(e[2]), e[3], e[4]) for e in events] == [(DATA, 1, b"payload", 18, True)]


def test_rfc9113_6_1_padding_as_long_as_the_payload_is_protocol_error():
    s, c = server(), Client()
    opened(s, c)
    connection_error(s, raw(0, 0x8, 1, b"\x05abcd"), PROTOCOL_ERROR)


def test_rfc9113_6_1_empty_data_with_end_stream_ends_the_stream():
    s, c = server(), Client()
    opened(s, c)
    events = s.receive_data(data(1, b"", end_stream=True))
    assert [(e[0], e[1], bytes(e[2]), e[3], e[4]) for e in events] == [(DATA, 1, b"", 0, True)]


def test_rfc9113_6_1_large_data_comes_out_as_slices_of_the_input_without_copies():
    s, c = server(max_frame_size=1 << 20, initial_window_size=1 << 20), Client()
    opened(s, c)
    frame = data(1, b"z" * 300_000, end_stream=True)
    chunks = [frame[:100_000], frame[100_000:200_000], frame[200_000:]]
    events = [e for chunk in chunks for e in s.receive_data(chunk)]
    assert [e[0] for e in events] == [DATA, DATA, DATA]
    assert all(isinstance(e[2], memoryview) and e[2].obj is chunk for e, chunk in zip(events, chunks, strict=True))
    assert sum(len(e[2]) for e in events) == 300_000 == sum(e[3] for e in events)
    assert [e[4] for e in events] == [False, False, True]


def test_rfc9113_6_1_views_of_bytes_are_sliced_other_buffers_copied():
    """A chunk that cannot change (bytes, or a view of bytes: the transport's slices of one read)
    is handed out in slices; a view of a bytearray may change after the call and is copied."""
    payload = b"q" * 50
    frames = data(1, payload) + data(1, payload)
    for chunk, sliced in ((memoryview(frames)[0:], True), (memoryview(bytes(3) + frames)[3:], True),
                          (memoryview(bytearray(frames)), False), (bytearray(frames), False)):
        s, c = server(), Client()
        opened(s, c)
        (event,) = s.receive_data(chunk)
        assert event[0] == DATA and [bytes(p) for p in event[2]] == [payload, payload]
        if sliced:
            assert all(isinstance(p, memoryview) and p.obj is chunk.obj for p in event[2])
        else:
            assert all(isinstance(p, bytes) for p in event[2])


def test_rfc9113_6_1_data_frames_in_a_row_on_a_stream_come_out_as_one_event_of_their_slices():
    s, c = server(), Client()
    opened(s, c, 1)
    opened(s, c, 3)
    chunk = (data(1, b"a" * 10) + data(1, b"b" * 20, pad=4) + data(1, b"c" * 30)
             + data(3, b"x") + data(3, b"y", end_stream=True) + data(1, b"d") + PingFrame(0, opaque_data=b"12345678").serialize()
             + data(1, b"e", end_stream=True))
    events = s.receive_data(chunk)
    assert [(e[0], e[1], e[3], e[4]) if e[0] == DATA else e for e in events] == [
        (DATA, 1, 10 + (20 + 1 + 4) + 30, False), (DATA, 3, 2, True), (DATA, 1, 1, False), (PING, b"12345678"),
        (DATA, 1, 1, True)]
    first = events[0][2]
    assert isinstance(first, list) and [bytes(p) for p in first] == [b"a" * 10, b"b" * 20, b"c" * 30]
    assert all(isinstance(p, memoryview) and p.obj is chunk for p in first)  # slices, nothing copied
    assert [bytes(p) for p in events[1][2]] == [b"x", b"y"]
    assert bytes(events[2][2]) == b"d" and bytes(events[4][2]) == b"e"  # one frame: a plain slice


# ---- §6.2 HEADERS, §6.10 CONTINUATION --------------------------------------------------------


def test_rfc9113_6_2_headers_on_stream_0_is_protocol_error():
    connection_error(server(), raw(1, 0x4, 0, Client().encoder.encode(REQUEST_HEADERS)), PROTOCOL_ERROR)


def test_rfc9113_6_2_padded_headers_with_priority():
    s, c = server(), Client()
    f = HeadersFrame(1, data=c.encoder.encode(REQUEST_HEADERS), pad_length=7, depends_on=0, stream_weight=200)
    for flag in ("END_HEADERS", "PADDED", "PRIORITY"):
        f.flags.add(flag)
    assert s.receive_data(f.serialize()) == [(REQUEST, 1, tuple(REQUEST_HEADERS), False)]


def test_rfc9113_5_3_1_headers_depending_on_itself_is_a_stream_error():
    s, c = server(), Client()
    f = HeadersFrame(1, data=c.encoder.encode(REQUEST_HEADERS), depends_on=1)
    for flag in ("END_HEADERS", "PRIORITY"):
        f.flags.add(flag)
    assert s.receive_data(f.serialize()) == []
    assert resets(sent(s)) == rst(1, PROTOCOL_ERROR)


def test_rfc9113_6_10_header_block_across_continuations():
    s, c = server(), Client()
    block = c.encoder.encode(REQUEST_HEADERS + [(b"x-meta", b"v" * 300)])
    first = HeadersFrame(1, data=block[:10])
    first.flags.add("END_STREAM")
    middle = ContinuationFrame(1, data=block[10:100])
    last = ContinuationFrame(1, data=block[100:])
    last.flags.add("END_HEADERS")
    events = s.receive_data(first.serialize() + middle.serialize() + last.serialize())
    assert events == [(REQUEST, 1, tuple(REQUEST_HEADERS + [(b"x-meta", b"v" * 300)]), True)]


def test_rfc9113_6_10_continuation_interleaved_with_another_frame_is_protocol_error():
    s, c = server(), Client()
    connection_error(s, c.headers(1, end_headers=False) + data(1, b"x"), PROTOCOL_ERROR)


def test_rfc9113_6_10_continuation_on_another_stream_is_protocol_error():
    s, c = server(), Client()
    other = ContinuationFrame(3, data=b"\x82")
    other.flags.add("END_HEADERS")
    connection_error(s, c.headers(1, end_headers=False) + other.serialize(), PROTOCOL_ERROR)


def test_rfc9113_6_10_continuation_without_headers_is_protocol_error():
    f = ContinuationFrame(1, data=b"\x82")
    f.flags.add("END_HEADERS")
    connection_error(server(), f.serialize(), PROTOCOL_ERROR)


def test_rfc9113_6_10_continuation_flood_is_bounded():
    s, c = server(max_header_block=4096), Client()
    chunk = c.headers(1, end_headers=False) + ContinuationFrame(1, data=b"\x00" * 1100).serialize() * 3
    assert s.receive_data(chunk) == []
    goaway = connection_error(s, ContinuationFrame(1, data=b"\x00" * 1100).serialize(), ENHANCE_YOUR_CALM)
    assert goaway.additional_data == b"header_block_too_large"


# ---- §6.3 PRIORITY, §6.4 RST_STREAM ----------------------------------------------------------


def test_rfc9113_6_3_priority_is_ignored():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(PriorityFrame(1, depends_on=3, stream_weight=5).serialize()) == []
    assert sent(s) == []


def test_rfc9113_6_3_priority_of_the_wrong_length_is_a_stream_error():
    s = server()
    assert s.receive_data(raw(2, 0, 1, b"\x00" * 4)) == []
    assert resets(sent(s)) == rst(1, FRAME_SIZE_ERROR)


def test_rfc9113_6_3_priority_of_the_wrong_length_resets_an_open_stream():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(raw(2, 0, 1, b"\x00" * 6)) == [(RESET, 1, FRAME_SIZE_ERROR)]
    assert resets(sent(s)) == rst(1, FRAME_SIZE_ERROR) and s.streams == {}


def test_rfc9113_6_3_priority_on_stream_0_is_protocol_error():
    connection_error(server(), raw(2, 0, 0, b"\x00" * 5), PROTOCOL_ERROR)


def test_rfc9113_6_4_rst_stream_resets_the_stream():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(RstStreamFrame(1, error_code=8).serialize()) == [(RESET, 1, 8)]
    assert s.streams == {}
    with pytest.raises(http2.StreamClosedError):
        s.send_headers(1, [(b":status", b"200")])


def test_rfc9113_6_4_rst_stream_of_the_wrong_length_is_frame_size_error():
    s, c = server(), Client()
    opened(s, c)
    connection_error(s, raw(3, 0, 1, b"\x00" * 3), FRAME_SIZE_ERROR)


def test_rfc9113_6_4_rst_stream_on_stream_0_is_protocol_error():
    connection_error(server(), raw(3, 0, 0, b"\x00" * 4), PROTOCOL_ERROR)


# ---- §6.5 SETTINGS ---------------------------------------------------------------------------


def test_rfc9113_6_5_3_settings_ack():
    s = server()
    assert s.receive_data(settings(max_concurrent_streams=10, enable_push=0)) == []
    f, = sent(s)
    assert isinstance(f, SettingsFrame) and f.flags == {"ACK"} and not f.settings


def test_rfc9113_6_5_3_ack_of_our_settings_needs_no_answer():
    s = server()
    ack = SettingsFrame(0)
    ack.flags.add("ACK")
    assert s.receive_data(ack.serialize()) == [] and sent(s) == []


def test_rfc9113_6_5_settings_ack_with_payload_is_frame_size_error():
    connection_error(server(), raw(4, 1, 0, b"\x00\x01\x00\x00\x00\x00"), FRAME_SIZE_ERROR)


def test_rfc9113_6_5_settings_length_not_a_multiple_of_6_is_frame_size_error():
    connection_error(server(), raw(4, 0, 0, b"\x00\x01\x00\x00\x00"), FRAME_SIZE_ERROR)


def test_rfc9113_6_5_settings_on_a_stream_is_protocol_error():
    connection_error(server(), raw(4, 0, 1, b""), PROTOCOL_ERROR)


@pytest.mark.parametrize(("setting", "value", "code"), [
    (2, 2, PROTOCOL_ERROR),  # SETTINGS_ENABLE_PUSH not 0/1
    (4, 2**31, FLOW_CONTROL_ERROR),  # SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1
    (5, 16383, PROTOCOL_ERROR),  # SETTINGS_MAX_FRAME_SIZE under 2^14
    (5, 2**24, PROTOCOL_ERROR),  # SETTINGS_MAX_FRAME_SIZE over 2^24-1
    (8, 2, PROTOCOL_ERROR),  # SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441 §3) not 0/1
])
def test_rfc9113_6_5_2_invalid_setting_values(setting, value, code):
    connection_error(server(), raw(4, 0, 0, struct.pack(">HI", setting, value)), code)


def test_rfc9113_6_5_2_unknown_settings_are_ignored():
    s = server()
    assert s.receive_data(raw(4, 0, 0, struct.pack(">HI", 0x99, 12345))) == []
    assert [type(f) for f in sent(s)] == [SettingsFrame]


def test_rfc9113_6_5_2_max_frame_size_sets_the_size_of_data_sent():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    assert s.receive_data(settings(max_frame_size=20000)) == [(WINDOW, 0)]
    sent(s)
    s.send_data(1, b"d" * 50000)
    assert [len(f.data) for f in sent(s)] == [20000, 20000, 10000]


def test_rfc9113_6_5_2_data_frames_from_parts_are_the_frames_send_data_makes():
    """data_frames: the same DATA frames as send_data (max frame size, one stream, windows
    charged), as headers and views of the parts (nothing copied), frames spanning parts."""
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    assert s.receive_data(settings(max_frame_size=20000)) == [(WINDOW, 0)]
    sent(s)
    payload = bytes(range(256)) * 200  # 51,200 bytes in three uneven parts
    view = memoryview(payload)
    buffers, frames = s.data_frames(1, [view[:5], view[5:30000], view[30000:]], len(payload))
    assert frames == 3 and not s.has_data_to_send()
    assert all(b.obj is payload for b in buffers if isinstance(b, memoryview))  # views, not copies
    wire = b"".join(bytes(b) for b in buffers)
    seen, body, pos = [], b"", 0
    while pos < len(wire):
        length = int.from_bytes(wire[pos:pos + 3], "big")
        seen.append((wire[pos + 3], wire[pos + 4], int.from_bytes(wire[pos + 5:pos + 9], "big"), length))
        body += wire[pos + 9:pos + 9 + length]
        pos += 9 + length
    assert seen == [(0, 0, 1, 20000), (0, 0, 1, 20000), (0, 0, 1, 11200)] and body == payload
    assert s.local_flow_control_window(1) == 65535 - len(payload)
    with pytest.raises(http2.FlowControlError):
        s.data_frames(1, [memoryview(b"x" * 20000)], 20000)


@pytest.mark.parametrize("frame_size, sizes", [
    (16384, [5, 1 << 20]), (16384, [1 << 20]), (16384, [5, 16384 * 3, 16384]), (100, [3, 4000, 7, 7000, 1]),
    (100, [250]), (100, [200]), (100, [100, 100, 1]), (16384, [16384]), (16384, [1, 16383, 16385])])
def test_rfc9113_6_5_2_data_frames_of_large_parts_split_as_send_data_does(frame_size, sizes):
    """Full frames that lie inside one part are sliced in bulk: the wire is the same as
    send_data's for any part sizes (frames inside parts, across parts, ending on part ends)."""
    payload = bytes(i % 251 for i in range(sum(sizes)))
    view, parts, pos = memoryview(payload), [], 0
    for n in sizes:
        parts.append(view[pos:pos + n])
        pos += n
    wires = []
    for how in ("data_frames", "send_data"):
        s, c = server(initial_window_size=1 << 21, connection_window=1 << 21), Client()
        opened(s, c, end_stream=True)
        s.receive_data(settings(max_frame_size=max(frame_size, 16384), initial_window_size=1 << 21)
                       + WindowUpdateFrame(0, window_increment=1 << 21).serialize())
        s.max_outbound_frame_size = frame_size
        sent(s)
        if how == "data_frames":
            buffers, frames = s.data_frames(1, parts, len(payload))
            assert frames == -(-len(payload) // frame_size)
            wires.append(b"".join(bytes(b) for b in buffers))
        else:
            s.send_data(1, payload)
            wires.append(bytes(s.data_to_send()))
    assert wires[0] == wires[1]


# ---- §6.6 PUSH_PROMISE, §6.7 PING, §6.8 GOAWAY -----------------------------------------------


def test_rfc9113_6_6_push_promise_from_a_client_is_protocol_error():
    s, c = server(), Client()
    opened(s, c)
    f = PushPromiseFrame(1, promised_stream_id=2, data=c.encoder.encode(REQUEST_HEADERS))
    f.flags.add("END_HEADERS")
    connection_error(s, f.serialize(), PROTOCOL_ERROR)


def test_rfc9113_6_7_ping_is_answered_with_an_ack_of_the_same_data():
    s = server()
    assert s.receive_data(PingFrame(0, opaque_data=b"abcdefgh").serialize()) == [(PING, b"abcdefgh")]
    f, = sent(s)
    assert isinstance(f, PingFrame) and f.flags == {"ACK"} and f.opaque_data == b"abcdefgh"


def test_rfc9113_6_7_ping_ack_is_not_answered():
    s = server()
    ack = PingFrame(0, opaque_data=b"12345678")
    ack.flags.add("ACK")
    assert s.receive_data(ack.serialize()) == [(PING_ACK, b"12345678")]
    assert sent(s) == []


def test_rfc9113_6_7_ping_of_the_wrong_length_is_frame_size_error():
    connection_error(server(), raw(6, 0, 0, b"1234567"), FRAME_SIZE_ERROR)


def test_rfc9113_6_7_ping_on_a_stream_is_protocol_error():
    connection_error(server(), raw(6, 0, 1, b"12345678"), PROTOCOL_ERROR)


def test_rfc9113_6_7_server_ping():
    s = server()
    s.ping(b"trident\x00")
    f, = sent(s)
    assert isinstance(f, PingFrame) and not f.flags and f.opaque_data == b"trident\x00"


def test_rfc9113_6_8_goaway_from_the_client_is_an_event():
    s = server()
    f = GoAwayFrame(0, last_stream_id=0, error_code=ENHANCE_YOUR_CALM, additional_data=b"bye")
    assert s.receive_data(f.serialize()) == [(GOAWAY, ENHANCE_YOUR_CALM, 0, b"bye")]


def test_rfc9113_6_8_goaway_shorter_than_8_bytes_is_frame_size_error():
    connection_error(server(), raw(7, 0, 0, b"\x00" * 7), FRAME_SIZE_ERROR)


def test_rfc9113_6_8_server_goaway_names_the_last_stream_and_open_streams_go_on():
    s, c = server(), Client()
    opened(s, c, 1)
    s.goaway(NO_ERROR, b"draining")
    f, = sent(s)
    assert isinstance(f, GoAwayFrame) and (f.last_stream_id, f.error_code, f.additional_data) == (1, 0, b"draining")
    s.send_headers(1, [(b":status", b"200")])  # a stream already open may still be answered
    assert [type(f) for f in sent(s)] == [HeadersFrame]


# ---- §6.9 WINDOW_UPDATE and flow control -----------------------------------------------------


def test_rfc9113_6_9_window_update_grows_the_send_window():
    s, c = server(), Client()
    opened(s, c)
    assert s.local_flow_control_window(1) == 65535
    assert s.receive_data(WindowUpdateFrame(1, window_increment=1000).serialize()) == [(WINDOW, 1)]
    assert s.local_flow_control_window(1) == 65535  # the connection window is the smaller one
    assert s.receive_data(WindowUpdateFrame(0, window_increment=5000).serialize()) == [(WINDOW, 0)]
    assert s.local_flow_control_window(1) == 66535


def test_rfc9113_6_9_zero_increment_on_a_stream_is_a_stream_error():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(raw(8, 0, 1, b"\x00\x00\x00\x00")) == [(RESET, 1, PROTOCOL_ERROR)]
    assert resets(sent(s)) == rst(1, PROTOCOL_ERROR)


def test_rfc9113_6_9_zero_increment_on_the_connection_is_protocol_error():
    connection_error(server(), raw(8, 0, 0, b"\x00\x00\x00\x00"), PROTOCOL_ERROR)


def test_rfc9113_6_9_window_update_of_the_wrong_length_is_frame_size_error():
    connection_error(server(), raw(8, 0, 0, b"\x00\x00\x01"), FRAME_SIZE_ERROR)


def test_rfc9113_6_9_1_stream_window_overflow_is_a_stream_error():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(WindowUpdateFrame(1, window_increment=2**31 - 1).serialize()) == [
        (RESET, 1, FLOW_CONTROL_ERROR)]
    assert resets(sent(s)) == rst(1, FLOW_CONTROL_ERROR)


def test_rfc9113_6_9_1_connection_window_overflow_is_flow_control_error():
    connection_error(server(), WindowUpdateFrame(0, window_increment=2**31 - 1).serialize(), FLOW_CONTROL_ERROR)


def test_rfc9113_6_9_1_data_beyond_the_stream_window_is_a_stream_error():
    s, c = server(initial_window_size=100, connection_window=65535), Client()
    opened(s, c)
    assert s.receive_data(data(1, b"x" * 101)) == [(RESET, 1, FLOW_CONTROL_ERROR)]
    frames = sent(s)
    assert resets(frames[:1]) == rst(1, FLOW_CONTROL_ERROR)


def test_rfc9113_6_9_1_data_beyond_the_connection_window_is_flow_control_error():
    s, c = server(initial_window_size=1 << 20, max_frame_size=1 << 20, connection_window=65535), Client()
    opened(s, c)
    connection_error(s, data(1, b"x" * 65536), FLOW_CONTROL_ERROR)


def test_rfc9113_6_9_1_windows_are_checked_frame_by_frame_in_a_run_of_data_frames():
    # frames that fit come out (one event), the one past the stream window is a stream error
    s, c = server(initial_window_size=100, connection_window=65535), Client()
    opened(s, c)
    events = s.receive_data(data(1, b"a" * 40) + data(1, b"b" * 40) + data(1, b"c" * 40))
    assert [e[:2] for e in events] == [(DATA, 1), (RESET, 1)]
    assert b"".join(bytes(p) for p in events[0][2]) == b"a" * 40 + b"b" * 40 and events[0][3] == 80
    assert events[1] == (RESET, 1, FLOW_CONTROL_ERROR)
    # and past the connection window, a connection error
    s, c = server(initial_window_size=1 << 20, max_frame_size=1 << 20, connection_window=65535), Client()
    opened(s, c)
    connection_error(s, data(1, b"x" * 40_000) + data(1, b"y" * 25_000) + data(1, b"z" * 1000), FLOW_CONTROL_ERROR)


def test_rfc9113_4_2_a_frame_over_the_size_limit_in_a_run_of_data_frames_is_frame_size_error():
    s, c = server(), Client()
    opened(s, c)
    connection_error(s, data(1, b"a" * 100) + data(1, b"b" * 16385), FRAME_SIZE_ERROR)


def test_rfc9113_6_9_1_acknowledged_data_reopens_the_windows():
    s, c = server(initial_window_size=1000, connection_window=65535), Client()
    opened(s, c)
    events = s.receive_data(data(1, b"x" * 400))
    s.acknowledge_received_data(events[0][3], 1)
    assert sent(s) == []  # less than half a window used: no WINDOW_UPDATE yet
    events = s.receive_data(data(1, b"x" * 400))
    s.acknowledge_received_data(events[0][3], 1)
    assert [(f.stream_id, f.window_increment) for f in sent(s)] == [(1, 800)]
    assert s.receive_data(data(1, b"x" * 1000)) != [(RESET, 1, FLOW_CONTROL_ERROR)]


def test_rfc9113_6_9_1_sending_more_than_the_window_raises():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    s.send_data(1, b"x" * 65535)
    assert s.local_flow_control_window(1) == 0
    with pytest.raises(http2.FlowControlError):
        s.send_data(1, b"x")


def test_rfc9113_6_9_2_initial_window_size_change_adjusts_open_streams():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    s.send_data(1, b"x" * 60000)
    s.receive_data(WindowUpdateFrame(0, window_increment=1 << 20).serialize())
    assert s.local_flow_control_window(1) == 5535
    assert s.receive_data(settings(initial_window_size=1000)) == [(WINDOW, 0)]
    assert s.local_flow_control_window(1) == 5535 - 64535  # may go negative (§6.9.2)
    assert s.receive_data(settings(initial_window_size=100_000)) == [(WINDOW, 0)]
    assert s.local_flow_control_window(1) == 40000


def test_rfc9113_6_9_2_initial_window_size_change_overflowing_a_stream_is_flow_control_error():
    s, c = server(), Client()
    opened(s, c)
    s.receive_data(WindowUpdateFrame(1, window_increment=2**31 - 1 - 65535).serialize())
    connection_error(s, settings(initial_window_size=65536), FLOW_CONTROL_ERROR)


# ---- §8: HTTP semantics (request validation as h2 does it for gRPC) ---------------------------


def test_rfc9113_8_1_trailers_end_the_stream():
    s, c = server(), Client()
    opened(s, c)
    events = s.receive_data(c.headers(1, [(b"x-trailer", b"1")], end_stream=True))
    assert events == [(TRAILERS, 1, ((b"x-trailer", b"1"),))]


def test_rfc9113_8_1_trailers_without_end_stream_are_a_stream_error():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(c.headers(1, [(b"x-trailer", b"1")])) == [(RESET, 1, PROTOCOL_ERROR)]
    assert resets(sent(s)) == rst(1, PROTOCOL_ERROR)


def test_rfc9113_8_1_pseudo_headers_in_trailers_are_a_stream_error():
    s, c = server(), Client()
    opened(s, c)
    assert s.receive_data(c.headers(1, [(b":path", b"/x")], end_stream=True)) == [(RESET, 1, PROTOCOL_ERROR)]


@pytest.mark.parametrize("headers", [
    REQUEST_HEADERS + [(b"X-Upper", b"1")],  # §8.2.1 uppercase name
    REQUEST_HEADERS + [(b"bad name", b"1")],  # §8.2.1 space in a name
    REQUEST_HEADERS + [(b"x-colon:", b"1")],  # §8.2.1 colon past the first character
    REQUEST_HEADERS + [(b"x-v", b"a\nb")],  # §8.2.1 LF in a value
    REQUEST_HEADERS + [(b"x-v", b" padded")],  # §8.2.1 leading whitespace
    REQUEST_HEADERS + [(b"connection", b"keep-alive")],  # §8.2.2 connection-specific
    REQUEST_HEADERS + [(b"transfer-encoding", b"chunked")],  # §8.2.2
    REQUEST_HEADERS + [(b"upgrade", b"h2c")],  # §8.2.2
    [*REQUEST_HEADERS[:5], (b"te", b"gzip")],  # §8.2.2 TE other than trailers
    REQUEST_HEADERS[1:],  # §8.3.1 no :method
    [REQUEST_HEADERS[0], *REQUEST_HEADERS[2:]],  # §8.3.1 no :scheme
    [*REQUEST_HEADERS[:2], *REQUEST_HEADERS[3:]],  # §8.3.1 no :path
    [*REQUEST_HEADERS[:2], (b":path", b""), *REQUEST_HEADERS[3:]],  # §8.3.1 empty :path
    [REQUEST_HEADERS[0], *REQUEST_HEADERS],  # §8.3 duplicate pseudo-header
    [(b"x-first", b"1"), *REQUEST_HEADERS],  # §8.3 pseudo-header after a regular field
    [(b":status", b"200"), *REQUEST_HEADERS],  # §8.3.2 response pseudo-header in a request
    [*REQUEST_HEADERS[:3], *REQUEST_HEADERS[4:]],  # §8.3.1 no :authority and no host
    REQUEST_HEADERS + [(b"host", b"elsewhere")],  # §8.3.1 host differs from :authority
    REQUEST_HEADERS + [(b"", b"x")],  # §8.2 empty name
])
def test_rfc9113_8_2_and_8_3_malformed_requests_are_stream_errors(headers):
    s, c = server(), Client()
    assert s.receive_data(c.headers(1, headers)) == []
    assert resets(sent(s)) == rst(1, PROTOCOL_ERROR)
    opened(s, c, 3)  # the connection and its HPACK state go on


def test_rfc9113_8_2_2_te_trailers_and_host_equal_to_authority_are_accepted():
    s, c = server(), Client()
    opened(s, c, headers=REQUEST_HEADERS + [(b"host", b"localhost"), (b"x-bin-bin", b"AAE=")])


# ---- sending ---------------------------------------------------------------------------------


def test_rfc9113_8_1_response_headers_data_and_trailers_frames():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    s.send_headers(1, ((b":status", b"200"), (b"content-type", b"application/grpc")))
    s.send_data(1, b"\x00\x00\x00\x00\x02hi")
    s.send_headers(1, ((b"grpc-status", b"0"),), end_stream=True)
    frames = sent(s)
    assert [type(f) for f in frames] == [HeadersFrame, DataFrame, HeadersFrame]
    decoder = hpack.Decoder()
    assert decoder.decode(frames[0].data, raw=True) == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert frames[0].flags == {"END_HEADERS"} and frames[1].data == b"\x00\x00\x00\x00\x02hi"
    assert decoder.decode(frames[2].data, raw=True) == [(b"grpc-status", b"0")]
    assert frames[2].flags == {"END_HEADERS", "END_STREAM"}
    assert s.streams == {}
    with pytest.raises(http2.StreamClosedError):
        s.send_data(1, b"x")


def test_rfc9113_6_10_large_response_header_block_uses_continuation():
    s, c = server(), Client()
    opened(s, c, end_stream=True)
    big = [(b":status", b"200"), (b"x-big", bytes(range(256)) * 100)]
    s.send_headers(1, big)
    frames = sent(s)
    assert [type(f) for f in frames] == [HeadersFrame] + [ContinuationFrame] * (len(frames) - 1)
    assert len(frames) > 1 and all(len(f.data) <= 16384 for f in frames)
    assert [("END_HEADERS" in f.flags) for f in frames] == [False] * (len(frames) - 1) + [True]
    assert hpack.Decoder().decode(b"".join(f.data for f in frames), raw=True) == big


def test_rfc9113_6_4_reset_stream_sends_rst_and_closes():
    s, c = server(), Client()
    opened(s, c)
    s.reset_stream(1, REFUSED_STREAM)
    assert resets(sent(s)) == rst(1, REFUSED_STREAM)
    with pytest.raises(http2.StreamClosedError):
        s.reset_stream(1)


# ---- RFC 7541: HPACK -------------------------------------------------------------------------


@pytest.mark.parametrize("block", [
    b"\xff\x80",  # §6.1 an index past the tables (truncated integer)
    b"\xbf\x7f",  # §2.3.3 index 190: past the static and the empty dynamic table
    b"\x00\x85abc",  # §5.2 string shorter than its length
    b"\x3f\xe2\x1f",  # §6.3 table size update above SETTINGS_HEADER_TABLE_SIZE (4096)
    b"\x82\x20",  # §4.2 table size update not at the start of the block
])
def test_rfc7541_decoding_errors_are_compression_error(block):
    s = server()
    f = HeadersFrame(1, data=block)
    f.flags.add("END_HEADERS")
    connection_error(s, f.serialize(), COMPRESSION_ERROR)


def test_rfc7541_4_1_decoded_header_list_over_the_hard_limit_is_enhance_your_calm():
    s, c = server(max_header_list_hard=10_000, header_step=0), Client()  # decoded whole (in pieces: below)
    connection_error(s, c.headers(1, extra=[(b"x-big", b"v" * 12_000)]), ENHANCE_YOUR_CALM)


@pytest.mark.parametrize(("block", "neutral"), [
    (b"\x82\x86\x84", True),  # §6.1 indexed fields only
    (b"\x04\x05/path", True),  # §6.2.2 literal without indexing, indexed name
    (b"\x00\x01a\x01b", True),  # §6.2.2 literal without indexing, new name
    (b"\x10\x01a\x01b", True),  # §6.2.3 never indexed
    (b"\x44\x05/path", False),  # §6.2.1 literal with incremental indexing
    (b"\x20\x82", False),  # §6.3 dynamic table size update
    (b"\x82\x04\x85ab", False),  # truncated string: not neutral
])
def test_rfc7541_6_table_neutral_blocks(block, neutral):
    assert table_neutral(block) is neutral


def test_rfc7541_2_3_2_repeated_block_is_decoded_from_the_cache():
    s, c = server(), Client()
    blocks = []
    for stream_id in (1, 3, 5, 7):
        frame = c.headers(stream_id, end_stream=True)
        blocks.append(frame[9:])
        assert s.receive_data(frame) == [(REQUEST, stream_id, tuple(REQUEST_HEADERS), True)]
    # the first block indexes the fields (table changed), the later ones only reference them
    assert blocks[1] == blocks[2] == blocks[3] != blocks[0]
    assert (s.header_codec.misses, s.header_codec.hits) == (2, 2)


def test_rfc7541_2_3_2_cache_is_invalidated_by_a_block_that_changes_the_table():
    s, reference = server(), hpack.Decoder()

    def request(stream_id: int, block: bytes) -> tuple:
        events = s.receive_data(raw(1, 0x5, stream_id, block))
        assert events[0][2] == tuple(reference.decode(block, raw=True))  # exactly what decoding gives
        return events[0][2]

    # :method POST, :scheme http (§6.1 indexed), :path and :authority (§6.2.2 without indexing)
    base = b"\x83\x86\x04\x0f/pkg.Svc/Method\x01\x09localhost"
    request(1, base + b"\x40\x03x-a\x011")  # §6.2.1: x-a: 1 becomes dynamic entry 62
    referencing = base + b"\xbe"  # §6.1: index 62, whatever it holds
    assert table_neutral(referencing)
    assert request(3, referencing)[-1] == (b"x-a", b"1")
    assert request(5, referencing)[-1] == (b"x-a", b"1")
    assert s.header_codec.hits == 1
    inserting = base + b"\x40\x03x-b\x012"  # x-b: 2 becomes entry 62, x-a moves to 63
    assert not table_neutral(inserting)
    request(7, inserting)
    assert s.header_codec.decode_cache == {}
    assert request(9, referencing)[-1] == (b"x-b", b"2")  # the same bytes mean another field now
    assert s.header_codec.hits == 1


def test_rfc7541_6_3_cache_is_invalidated_by_a_table_size_update():
    s, c = server(), Client()
    for stream_id in (1, 3, 5):
        s.receive_data(c.headers(stream_id, end_stream=True))
    assert s.header_codec.hits == 1
    c.encoder.header_table_size = 0  # the next block starts with a size update that empties the table
    frame = c.headers(7, end_stream=True)
    assert frame[9] & 0xE0 == 0x20
    assert s.receive_data(frame) == [(REQUEST, 7, tuple(REQUEST_HEADERS), True)]
    assert s.header_codec.decode_cache == {}
    # the old block would now reference entries that are gone: decoding (not the cache) says so
    old = Client()
    old.encoder.encode(REQUEST_HEADERS)
    stale = old.headers(9, end_stream=True)
    connection_error(s, stale, COMPRESSION_ERROR)


def test_rfc7541_4_2_settings_header_table_size_invalidates_the_encode_cache():
    s, c = server(), Client()
    decoder = hpack.Decoder()
    response = ((b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-accept-encoding", b"gzip"))
    blocks = []
    for stream_id in (1, 3, 5):
        opened(s, c, stream_id, end_stream=True)
        s.send_headers(stream_id, response, end_stream=True)
        f, = sent(s)
        blocks.append(f.data)
        assert decoder.decode(f.data, raw=True) == list(response)
    assert blocks[1] == blocks[2] and response in s.header_codec.encode_cache
    s.receive_data(settings(header_table_size=0))
    assert s.header_codec.encode_cache == {}
    sent(s)
    opened(s, c, 7, end_stream=True)
    decoder.header_table_size = 0
    s.send_headers(7, response, end_stream=True)
    f, = sent(s)
    assert f.data[0] & 0xE0 == 0x20  # §6.3: the block starts with the size update
    assert decoder.decode(f.data, raw=True) == list(response)


def test_rfc7541_encode_cache_never_replays_a_block_that_changed_the_table():
    s, c = server(), Client()
    decoder = hpack.Decoder()
    for stream_id, message in ((1, b"a"), (3, b"b"), (5, b"a")):
        opened(s, c, stream_id, end_stream=True)
        trailers = [(b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", message)]
        s.send_headers(stream_id, tuple(trailers), end_stream=True)
        f, = sent(s)
        assert decoder.decode(f.data, raw=True) == trailers


def test_rfc9113_6_1_data_cut_inside_its_padding_hands_out_no_padding():
    s, c = server(), Client()
    opened(s, c)
    frame = data(1, b"0123456789", pad=20, end_stream=True)
    for cut in (10, 15, 20, 25, 35, 39):  # in the pad length, the payload, the padding
        s, c = server(), Client()
        opened(s, c)
        events = s.receive_data(frame[:cut]) + s.receive_data(frame[cut:])
        assert b"".join(bytes(e[2]) for e in events) == b"0123456789"
        assert sum(e[3] for e in events) == 31 and events[-1][4] is True
        assert all(len(e[2]) <= e[3] for e in events)


def test_rfc9113_6_1_padded_data_without_a_pad_length_is_frame_size_error():
    s, c = server(), Client()
    opened(s, c)
    connection_error(s, raw(0, 0x8, 1, b""), FRAME_SIZE_ERROR)


def test_rfc7541_5_1_an_overlong_integer_is_compression_error_and_no_address_goes_out():
    """hpack's message names the block's repr ("<memory at 0x...>"): the GOAWAY's debug data
    keeps the message, not the address (found by fuzzing: it made two servers' output differ)."""
    s = server()
    f = HeadersFrame(1, data=b"\x3f" + b"\xff" * 12 + b"\x01")  # §5.1: an integer that never ends
    f.flags.add("END_HEADERS")
    goaway = connection_error(s, f.serialize(), COMPRESSION_ERROR)
    assert goaway.additional_data.startswith(b"HPACK decoding failed")
    assert b" at 0x" not in goaway.additional_data


# ---- RFC 7541 §4.1 / §6: a large header block decoded in pieces (header_step) -----------------

BIG = [(b"x-big", b"0123456789abcdefghijklmnopqrstuvwxyz" * 800)]  # ~29 KB; Huffman-coded ~22 KB


def finish(s: H2Server) -> tuple[list, int]:
    """Run continue_headers until no block is pending: (its events, the number of calls)."""
    events, calls = [], 0
    while s.header_work is not None:
        events += s.continue_headers()
        calls += 1
        assert calls < 10_000
    return events, calls


def test_rfc7541_a_large_block_is_decoded_in_pieces_with_the_same_events():
    """Everything after the large block waits for it; the events, and what the server sends,
    are exactly those of a server that decodes the block whole."""
    c = Client()
    chunk = (c.headers(1, extra=BIG) + data(1, b"m", end_stream=True)
             + PingFrame(0, opaque_data=b"12345678").serialize() + c.headers(3, end_stream=True))
    whole = server(max_frame_size=1 << 20, header_step=0)
    expected = whole.receive_data(chunk)
    assert [e[0] for e in expected] == [REQUEST, DATA, PING, REQUEST]
    s = server(max_frame_size=1 << 20, header_step=4096)
    assert s.receive_data(chunk) == [] and s.header_work is not None
    assert s.data_to_send() == b""  # nothing after the block was read yet: no PING ACK
    events, calls = finish(s)
    assert calls > 5  # ~22 KB of block in 4 KiB pieces, then the field checks
    assert events == expected
    assert s.data_to_send() == whole.data_to_send()  # the PING ACK, exactly
    assert events[0][2] == tuple(REQUEST_HEADERS + BIG)


def test_rfc7541_input_that_arrives_while_a_block_is_pending_waits_behind_it():
    c = Client()
    s = server(max_frame_size=1 << 20, header_step=4096)
    big = c.headers(1, extra=BIG)
    # the block's frame split across two reads, then a read of the next stream while it is pending
    assert s.receive_data(big[:1000]) == [] and s.header_work is None
    assert s.receive_data(big[1000:]) == [] and s.header_work is not None
    assert s.receive_data(c.headers(3, end_stream=True)) == []
    events, _ = finish(s)
    assert [(e[0], e[1]) for e in events] == [(REQUEST, 1), (REQUEST, 3)]
    # in CONTINUATION frames: the block is pending once its END_HEADERS frame is in
    block = c.encoder.encode(REQUEST_HEADERS + BIG)
    first = raw(0x1, 0, 5, block[:10_000])
    rest = raw(0x9, 0x4, 5, block[10_000:])
    assert s.receive_data(first) == [] and s.header_work is None
    assert s.receive_data(rest + data(5, b"m", end_stream=True)) == [] and s.header_work is not None
    events, _ = finish(s)
    assert [(e[0], e[1]) for e in events] == [(REQUEST, 5), (DATA, 5)]
    assert events[0][2] == tuple(REQUEST_HEADERS + BIG)


def test_rfc7541_errors_found_in_a_later_piece_end_the_connection():
    c = Client()
    # §2.3.3: an index past the tables at the end of a large block
    s = server(max_frame_size=1 << 20, header_step=4096)
    block = c.encoder.encode(REQUEST_HEADERS + BIG) + b"\xff\x7f"
    assert s.receive_data(raw(0x1, 0x4, 1, block)) == []
    with pytest.raises(ProtocolError) as info:
        finish(s)
    assert info.value.error_code == COMPRESSION_ERROR and s.closed
    assert isinstance(sent(s)[-1], GoAwayFrame)
    assert s.receive_data(c.headers(3)) == [] and s.continue_headers() == []
    # §4.1: the hard limit on the decoded list
    s = server(max_frame_size=1 << 20, header_step=4096, max_header_list_hard=20_000)
    assert s.receive_data(Client().headers(1, extra=BIG)) == []
    with pytest.raises(ProtocolError) as info:
        finish(s)
    assert info.value.error_code == ENHANCE_YOUR_CALM
    # a malformed request in a large block is a stream error, as in a small one (§8.1.1)
    s = server(max_frame_size=1 << 20, header_step=4096)
    assert s.receive_data(Client().headers(1, headers=REQUEST_HEADERS[1:], extra=BIG)) == []
    assert finish(s)[0] == [] and resets(sent(s)) == rst(1, PROTOCOL_ERROR)


def test_rfc7541_frames_kept_behind_a_large_block_are_all_read_whatever_comes_first():
    """Found by fuzzing: a large block followed, in the same read, by two whole frames the first
    of which is not DATA left more than one frame in the kept input, and the server looped on it
    for ever (the event loop stalled: every client's). Each order, each way of cutting the reads,
    gives the events of a server that decodes the block whole."""
    ping = PingFrame(0, opaque_data=b"12345678").serialize()
    window = WindowUpdateFrame(0, window_increment=100).serialize()
    for tail in ((ping, ping), (ping, "h3"), ("h3", ping, "d3"), (window, ping, "h3"), ("d1", ping, "h3")):
        c_whole, c_pieces = Client(), Client()
        streams = []
        for c in (c_whole, c_pieces):
            parts = [c.headers(1, extra=BIG)]
            for part in tail:
                parts.append(c.headers(3) if part == "h3" else data(3, b"m", end_stream=True) if part == "d3"
                             else data(1, b"m", end_stream=True) if part == "d1" else part)
            streams.append(b"".join(parts))
        assert streams[0] == streams[1]
        whole = server(max_frame_size=1 << 20, header_step=0)
        expected = whole.receive_data(streams[0])
        expected_out = whole.data_to_send()
        for cut in (len(streams[0]), len(streams[0]) - 9, 5000):
            s = server(max_frame_size=1 << 20, header_step=4096)
            events = s.receive_data(streams[1][:cut])
            events += finish(s)[0]
            events += s.receive_data(streams[1][cut:])
            events += finish(s)[0]
            assert [e[:2] for e in events] == [e[:2] for e in expected], (tail, cut)
            assert s.data_to_send() == expected_out


def test_rfc9113_4_2_a_frame_over_the_size_limit_behind_a_large_block_is_found_when_its_header_is():
    """Found by fuzzing: the frame header kept behind a pending block waited for the frame's
    whole (over-size) length before being checked; a server decoding the block whole fails in
    the same read, so this one must fail once the block is done, not on some later read."""
    c = Client()
    chunk = c.headers(1, extra=BIG) + struct.pack(">I", 1 << 20)[1:] + b"\x06\x00\x00\x00\x00\x00"
    whole = server(max_frame_size=1 << 16, header_step=0)
    connection_error(whole, chunk, FRAME_SIZE_ERROR)
    s = server(max_frame_size=1 << 16, header_step=4096)
    assert s.receive_data(chunk) == [] and s.header_work is not None
    with pytest.raises(ProtocolError) as info:
        finish(s)
    assert info.value.error_code == FRAME_SIZE_ERROR and s.closed
    assert isinstance(sent(s)[-1], GoAwayFrame)
