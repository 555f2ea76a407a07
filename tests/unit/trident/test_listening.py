"""trident.listening: every waiting connection is accepted in one step, within the limit."""

from __future__ import annotations

import socket

import pytest
import trio

from trident.listening import acquire_slots, open_tcp_listeners


def _connect(port: int, n: int) -> list[socket.socket]:
    # the kernel completes the handshake from the listen queue: connect returns before accept
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]


async def test_accepts_every_waiting_connection_within_the_limit() -> None:
    (listener,) = await open_tcp_listeners(0, host="127.0.0.1")
    clients = _connect(listener.port(), 5)
    try:
        first = await listener.accept_waiting(3)
        assert len(first) == 3
        rest = await listener.accept_waiting(64)
        assert len(rest) == 2
        # the streams are real: bytes written by a client arrive
        clients[0].sendall(b"ping")
        got = [await s.receive_some(16) for s in first[:1]]
        assert got == [b"ping"]
        for s in first + rest:
            await s.aclose()
    finally:
        for c in clients:
            c.close()
        listener.close()


async def test_waits_for_a_connection_and_is_cancellable() -> None:
    (listener,) = await open_tcp_listeners(0, host="127.0.0.1")
    try:
        with trio.move_on_after(0.05) as scope:
            await listener.accept_waiting(8)
        assert scope.cancelled_caught
        async with trio.open_nursery() as nursery:
            got: list[int] = []

            async def accept() -> None:
                got.append(len(await listener.accept_waiting(8)))

            nursery.start_soon(accept)
            await trio.sleep(0.01)
            clients = await trio.to_thread.run_sync(_connect, listener.port(), 1)
        assert got == [1]
        for c in clients:
            c.close()
    finally:
        listener.close()


async def test_close_wakes_a_waiting_accept() -> None:
    (listener,) = await open_tcp_listeners(0, host="127.0.0.1")
    raised: list[BaseException] = []

    async def accept() -> None:
        try:
            await listener.accept_waiting(8)
        except trio.ClosedResourceError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        await trio.sleep(0.01)
        listener.close()
    assert len(raised) == 1
    listener.close()  # twice is harmless
    with pytest.raises(trio.ClosedResourceError):
        await listener.accept_waiting(1)


async def test_bind_failure_is_an_oserror() -> None:
    (listener,) = await open_tcp_listeners(0, host="127.0.0.1")
    try:
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            with pytest.raises(OSError):
                await open_tcp_listeners(other.getsockname()[1], host="127.0.0.1")
    finally:
        listener.close()


async def test_acquire_slots_takes_what_is_free() -> None:
    slots = trio.Semaphore(5)
    assert await acquire_slots(slots, 3) == 3
    assert await acquire_slots(slots, 64) == 2
    assert slots.value == 0
    with trio.move_on_after(0.05) as scope:
        await acquire_slots(slots, 4)
    assert scope.cancelled_caught


async def test_serve_listener_holds_a_slot_per_connection_and_pauses_at_the_limit() -> None:
    from trident.listening import serve_listener

    (listener,) = await open_tcp_listeners(0, host="127.0.0.1")
    slots = trio.Semaphore(2)
    started: list[trio.SocketStream] = []
    limits: list[int] = []
    clients = _connect(listener.port(), 3)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_listener(listener, slots, started.append,
                                                      at_limit=lambda: limits.append(len(started))))
            await trio.sleep(0.1)
            assert len(started) == 2 and slots.value == 0 and limits  # the third waits for a slot
            await started[0].aclose()
            slots.release()  # the connection's owner gives its slot back when it closes
            await trio.sleep(0.1)
            assert len(started) == 3
            nursery.cancel_scope.cancel()
    finally:
        for s in started:
            await s.aclose()
        for c in clients:
            c.close()
        listener.close()
