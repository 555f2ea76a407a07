"""The HTTP/2 engines the gRPC transport can run on: trident's own and the ``h2`` library's.

:func:`make_engine` builds one for a connection from its :class:`~trident.grpc.config.TransportConfig`
(``http2="trident"``: :class:`trident.protocol.http2.H2Server`; ``"h2"``: :class:`H2LibEngine`,
kept selectable for one release as the fallback). Both give the transport the same interface:
``receive_data(bytes) -> list[event tuple]`` (the event kinds of :mod:`trident.protocol.http2`;
raises :class:`~trident.protocol.http2.ProtocolError` after queueing a GOAWAY) with
``header_work`` / ``continue_headers()`` (a large header block decoded in pieces),
``send_headers`` / ``send_data`` / ``reset_stream`` / ``local_flow_control_window`` (raise
:class:`~trident.protocol.http2.StreamClosedError` for a stream not open for sending),
``acknowledge_received_data``, ``ping``, ``goaway``, ``has_data_to_send``, ``data_to_send``,
``max_outbound_frame_size`` and ``highest_inbound_stream_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trident.grpc.config import TransportConfig
from trident.protocol import http2

_MAX_WINDOW = 2**31 - 1
_H2_MAX_STREAMS = 2**31 - 1  # h2's own limit ends the connection; trident refuses streams first
ENGINES = ("trident", "h2")


def make_engine(config: TransportConfig) -> Any:
    """A new server-side HTTP/2 engine for one connection (its preface queued).

    Raises ValueError for an unknown ``config.http2``."""
    if config.http2 == "trident":
        engine = http2.H2Server(
            max_concurrent_streams=config.max_concurrent_streams,
            initial_window_size=config.initial_window_size,
            max_frame_size=config.max_frame_size,
            max_header_list_size=config.max_header_list_size,
            max_header_list_hard=config.max_header_list_hard,
            max_header_block=config.guard.max_header_block,
            # the transport refuses streams over max_concurrent_streams itself (charging the guard)
            max_open_streams=max(config.max_concurrent_streams * 2, 1024),
        )
        engine.initiate_connection()
        return engine
    if config.http2 == "h2":
        return H2LibEngine(config)
    raise ValueError(f"unknown HTTP/2 implementation {config.http2!r} (expected one of {', '.join(ENGINES)})")


class H2LibEngine:
    """The ``h2`` library behind the interface of :class:`trident.protocol.http2.H2Server`.

    h2 decodes each header block whole, inside :meth:`receive_data` (``hpack``'s decoder): it
    never leaves :attr:`header_work` pending; the frame guard's slices still give a large block
    a slice of its own."""

    header_work = None

    def continue_headers(self) -> list[Any]:
        """Nothing to continue (:attr:`header_work` is always None)."""
        return []

    def __init__(self, config: TransportConfig) -> None:
        import h2.config
        import h2.connection
        import h2.events
        import h2.exceptions
        import h2.settings
        from hyperframe.frame import DataFrame

        # h2 logs repr(frame) for every frame it receives, eagerly, whatever the logger;
        # hyperframe's DATA frame repr serializes and hex-encodes the whole payload to show 10
        # bytes of it, which cost ~15% of the server's CPU with 1 MiB tensors. Only the repr changes.
        setattr(DataFrame, "_body_repr", _data_frame_repr)  # noqa: B010
        self._events = h2.events
        self._error = h2.exceptions.ProtocolError
        conn = self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        codes = h2.settings.SettingCodes
        # Our settings go in the first SETTINGS frame and apply at once: set with update_settings()
        # after initiate_connection() they would wait for the client's ACK, and a client opening
        # more than h2's default 100 streams before that ACK would get a connection error.
        advertised = {
            codes.MAX_CONCURRENT_STREAMS: config.max_concurrent_streams,
            codes.INITIAL_WINDOW_SIZE: config.initial_window_size,
            codes.MAX_FRAME_SIZE: config.max_frame_size,
            codes.MAX_HEADER_LIST_SIZE: config.max_header_list_size,
        }
        conn.local_settings = h2.settings.Settings(client=False, initial_values=advertised)
        conn.max_inbound_frame_size = config.max_frame_size  # h2 copied the default in __init__
        conn.initiate_connection()
        # h2 enforces its local settings by ending the connection (TooManyStreamsError, an
        # oversized header list mid-decode): it gets higher limits than the advertised ones,
        # which trident enforces as stream errors once the header block is decoded, so the
        # HPACK state stays in step.
        conn.local_settings = h2.settings.Settings(client=False, initial_values={
            **advertised,
            codes.MAX_CONCURRENT_STREAMS: _H2_MAX_STREAMS,
            codes.MAX_HEADER_LIST_SIZE: config.max_header_list_hard,
        })
        conn.decoder.max_header_list_size = config.max_header_list_hard
        conn.increment_flow_control_window(_MAX_WINDOW - 65535)  # the connection window starts at 65535
        self._extra = b""  # frames written beside h2's state machine (GOAWAY)

    @property
    def highest_inbound_stream_id(self) -> int:
        return int(self.h2.highest_inbound_stream_id)

    @property
    def max_outbound_frame_size(self) -> int:
        return int(self.h2.max_outbound_frame_size)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """h2's events as :mod:`trident.protocol.http2` event tuples. Raises http2.ProtocolError."""
        ev = self._events
        try:
            events = self.h2.receive_data(bytes(data) if isinstance(data, memoryview) else data)
        except self._error as e:
            raise http2.ProtocolError(int(getattr(e, "error_code", http2.PROTOCOL_ERROR)), str(e)) from None
        out: list[Any] = []
        for event in events:
            if isinstance(event, ev.DataReceived):
                out.append((http2.DATA, event.stream_id, event.data, event.flow_controlled_length, False))
            elif isinstance(event, ev.RequestReceived):
                out.append((http2.REQUEST, event.stream_id, event.headers, event.stream_ended is not None))
            elif isinstance(event, ev.StreamEnded):
                out.append((http2.TRAILERS, event.stream_id, ()))
            elif isinstance(event, ev.StreamReset):
                out.append((http2.RESET, event.stream_id, int(event.error_code)))
            elif isinstance(event, ev.WindowUpdated):
                out.append((http2.WINDOW, event.stream_id))
            elif isinstance(event, ev.RemoteSettingsChanged):
                out.append((http2.WINDOW, 0))
            elif isinstance(event, ev.PingReceived):
                out.append((http2.PING, event.ping_data))
            elif isinstance(event, ev.PingAckReceived):
                out.append((http2.PING_ACK, event.ping_data))
            elif isinstance(event, ev.ConnectionTerminated):
                out.append((http2.GOAWAY, int(event.error_code), event.last_stream_id or 0,
                            event.additional_data or b""))
        return out

    def has_data_to_send(self) -> bool:
        """Always True: h2 does not say (the transport then flushes as it always did)."""
        return True

    def data_to_send(self) -> bytes | bytearray:
        data = self.h2.data_to_send()
        if self._extra:
            data, self._extra = data + self._extra, b""
        return bytes(data)

    def send_headers(self, stream_id: int, headers: Sequence[tuple[bytes, bytes]], end_stream: bool = False) -> None:
        try:
            self.h2.send_headers(stream_id, headers, end_stream=end_stream)
        except self._error:
            raise http2.StreamClosedError(f"stream {stream_id} is not open for sending") from None

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> None:
        try:
            self.h2.send_data(stream_id, data, end_stream=end_stream)
        except self._error:
            raise http2.StreamClosedError(f"stream {stream_id} is not open for sending") from None

    def local_flow_control_window(self, stream_id: int) -> int:
        try:
            return int(self.h2.local_flow_control_window(stream_id))
        except self._error:
            raise http2.StreamClosedError(f"stream {stream_id} is closed") from None

    def reset_stream(self, stream_id: int, error_code: int = http2.NO_ERROR) -> None:
        try:
            self.h2.reset_stream(stream_id, error_code)
        except self._error:
            raise http2.StreamClosedError(f"stream {stream_id} is closed") from None

    def acknowledge_received_data(self, size: int, stream_id: int) -> None:
        if size:
            self.h2.acknowledge_received_data(size, stream_id)

    def ping(self, data: bytes) -> None:
        try:
            self.h2.ping(data)
        except self._error:
            pass  # the connection is closing

    def goaway(self, error_code: int = http2.NO_ERROR, debug_data: bytes = b"",
               last_stream_id: int | None = None) -> None:
        """A GOAWAY written beside h2's state machine: h2's close_connection() would forbid
        sending on the streams still running."""
        from hyperframe.frame import GoAwayFrame

        frame = GoAwayFrame(0)
        frame.last_stream_id = self.highest_inbound_stream_id if last_stream_id is None else last_stream_id
        frame.error_code = error_code
        frame.additional_data = debug_data
        self._extra += frame.serialize()


def _data_frame_repr(frame: Any) -> str:
    return f"data=<{len(frame.data)} bytes>"
