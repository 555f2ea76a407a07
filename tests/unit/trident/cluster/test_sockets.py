"""The supervisor's ports: per-worker SO_REUSEPORT sockets and the shared accept queue."""

from __future__ import annotations

import errno
import socket

import pytest

from trident.cluster.sockets import PER_WORKER, SHARED, Port


def test_per_worker_sockets_share_the_port_and_listen_only_when_told():
    port = Port("HTTP", "127.0.0.1", 0, PER_WORKER, reuse=False)
    port.open()
    try:
        first, second = port.for_worker(), port.for_worker()
        assert first[0].getsockname()[1] == second[0].getsockname()[1] == port.port
        # bound, not listening: a connection is refused until a worker listens
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port.port), timeout=5).close()
        first[0].listen(8)
        socket.create_connection(("127.0.0.1", port.port), timeout=5).close()
        for s in first + second:
            s.close()
    finally:
        port.close()


def test_a_port_another_process_listens_on_is_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        for mode in (PER_WORKER, SHARED):
            port = Port("HTTP", "127.0.0.1", taken.getsockname()[1], mode, reuse=False)
            with pytest.raises(OSError) as e:
                port.open()
            assert e.value.errno == errno.EADDRINUSE


def test_a_reuseport_listener_of_another_server_is_in_use_unless_reuse_is_asked():
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        number = other.getsockname()[1]
        with pytest.raises(OSError):
            Port("HTTP", "127.0.0.1", number, PER_WORKER, reuse=False).open()
        sharing = Port("HTTP", "127.0.0.1", number, PER_WORKER, reuse=True)
        sharing.open()
        sharing.close()


def test_shared_mode_hands_every_worker_the_same_listening_socket():
    port = Port("GRPC", "127.0.0.1", 0, SHARED, reuse=False)
    port.open()
    try:
        a, b = port.for_worker(), port.for_worker()
        assert [s.fileno() for s in a] == [s.fileno() for s in b]
        socket.create_connection(("127.0.0.1", port.port), timeout=5).close()
    finally:
        port.close()
