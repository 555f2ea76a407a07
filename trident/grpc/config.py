"""The HTTP/2 and gRPC limits of one gRPC server (:class:`TransportConfig`).

:func:`trident.grpc.serve.transport_config` builds one from the server's options; the
transport (:mod:`trident.grpc.transport`) and the HTTP/2 engines (:mod:`trident.grpc.h2_engine`)
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trident.protocol import grpc_framing as framing
from trident.protocol.h2_guard import GuardLimits


@dataclass(frozen=True)
class TransportConfig:
    """HTTP/2 and gRPC limits of one server (trident.grpc.serve.transport_config builds it from the options).

    Times in seconds; a timeout of 0 disables it.
    """

    max_message_size: int = framing.DEFAULT_MAX_MESSAGE_SIZE
    max_concurrent_streams: int = 1000  # advertised; a stream beyond it gets RST_STREAM(REFUSED_STREAM)
    #: a stream's receive window: a message up to this size flows without waiting for a
    #: WINDOW_UPDATE (1 MiB tensors stalled a round trip at 1 MiB); the bytes a peer may make us
    #: buffer are bounded by the buffer budget below, not by this
    initial_window_size: int = 8 * 1024 * 1024
    max_frame_size: int = 1024 * 1024
    compression_level: int = 0  # gzip level for responses a handler marks compressible; 0 = off
    max_header_list_size: int = 64 * 1024  # advertised; a larger header list fails its stream
    max_header_list_hard: int = 1024 * 1024  # decoded header list that ends the connection (HPACK bomb)
    guard: GuardLimits = GuardLimits()
    max_buffered_bytes: int = 2 * 1024 * 1024 * 1024  # request bytes buffered, all connections
    max_connection_buffered: int = 0  # per connection; 0: max(2 x max_message_size, 256 MiB), capped
    message_timeout: float = 60.0  # a started request message must be complete within this
    #: a write with none of its bytes taken by the socket for this long closes the connection;
    #: a stream whose response waits this long at a zero flow-control window is reset (CANCEL)
    send_timeout: float = 60.0
    handshake_timeout: float = 10.0  # TLS handshake + the client's preface and first SETTINGS
    idle_timeout: float = 120.0  # no call for this long: GOAWAY NO_ERROR and close
    keepalive_time: float = 7200.0  # PING after this long without inbound bytes (calls open)
    keepalive_timeout: float = 20.0  # ... and close when its ACK does not come within this
    keepalive_permit_without_calls: bool = False  # ping (and accept pings) with no call open
    max_pings_without_data: int = 2  # keepalive PINGs between two DATA/HEADERS sent; 0 = unlimited
    min_recv_ping_interval: float = 300.0  # client PINGs closer than this without data: a strike
    max_ping_strikes: int = 2  # strikes beyond this: GOAWAY ENHANCE_YOUR_CALM; 0 = unlimited
    max_connection_age: float = 0.0  # GOAWAY NO_ERROR this long (+-10%) after accept; 0 = never
    max_connection_age_grace: float = 0.0  # ... then calls may run this long, the rest end; 0 = unbounded
    max_connections: int = 4096  # open connections; at the limit the accept loop pauses
    offload_size: int = 1024 * 1024  # heavy messages from this size decode in a worker thread (grpc_codec.is_heavy)
    worker_threads: int = 2  # worker threads for decompression and large decodes, all connections
    http2: str = "trident"  # the HTTP/2 engine: "trident" (trident.protocol.http2) or "h2" (the fallback)

    @property
    def connection_buffer_limit(self) -> int:
        """Request bytes one connection may have buffered."""
        if self.max_connection_buffered:
            return min(self.max_connection_buffered, self.max_buffered_bytes)
        return min(max(2 * self.max_message_size, 256 * 1024 * 1024), self.max_buffered_bytes)
