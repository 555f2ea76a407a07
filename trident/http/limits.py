"""Sizes and times of trident's HTTP/1.1 server (:mod:`trident.http.fastserver`).

The limits a client controls come from the server's options (``--http-header-timeout-secs``,
``--http-body-timeout-secs``, ``--http-send-timeout-secs``, ``--http-max-connections``: :class:`trident.options.ServerOptions`
holds their defaults, repeated nowhere); the rest are the server's own.
"""

from __future__ import annotations

from trident.options import ServerOptions

RECEIVE_SIZE = 64 * 1024
BODY_RECEIVE_SIZE = 256 * 1024
MAX_READ_AHEAD = 64 * 1024  # pipelined bytes buffered while a request runs; beyond, reading pauses
DRAIN_LIMIT = 64 * 1024  # an unread request body up to this is skipped to keep the connection open
LINGER_SECONDS = 2.0  # lingering close: longest pause in what the client still sends
LINGER_TOTAL_SECONDS = 30.0
WATCH_DELAY = 0.02  # a request waited on this long gets its connection's disconnect watcher
YIELD_EVERY = 8  # a connection serving requests without waiting for its socket yields after this many
YIELD_BYTES = 256 * 1024  # ... and after moving this many bytes
KEEP_ALIVE_TIMEOUT = 75.0
HEADER_TIMEOUT = ServerOptions.http_header_timeout_secs
BODY_TIMEOUT = ServerOptions.http_body_timeout_secs
SEND_TIMEOUT = ServerOptions.http_send_timeout_secs  # a response write with no byte taken this long: close
MAX_CONNECTIONS = ServerOptions.http_max_connections
MIN_BODY_RATE = 64 * 1024  # bytes/s: a body's deadline grows by 1 s per this many bytes received
DEFER_BYTES = 64 * 1024  # an /infer answer up to this size waits for the end of the loop's round
DEFER_LIMIT = 32  # answers waiting for the end of the round: at this many they are written at once
