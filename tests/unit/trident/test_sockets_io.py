"""The socket layer both front ends share (trident.sockets_io): reads, writev of parts, one write
at a time in order, writes left for the end of the round, back-pressure, a broken socket."""

from __future__ import annotations

import socket

import trio
import trio.testing

from trident.sockets_io import Flusher, SocketIO, consume


def pair(buffer: int | None = None) -> tuple[SocketIO, socket.socket]:
    """A SocketIO on one end of a TCP-like socket pair, the plain other end (small kernel
    buffers when ``buffer``, so that a write fills them)."""
    a, b = socket.socketpair()
    if buffer is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    b.setblocking(False)
    return SocketIO(trio.SocketStream(trio.socket.from_stdlib_socket(a))), b


async def read_all(peer: socket.socket, size: int) -> bytes:
    """``size`` bytes read from the plain end."""
    got = bytearray()
    sock = trio.socket.from_stdlib_socket(peer)
    while len(got) < size:
        chunk = await sock.recv(size - len(got))
        assert chunk
        got += chunk
    return bytes(got)


def test_consume_drops_whole_parts_and_cuts_the_first_left():
    parts = [b"abc", bytearray(b"de"), memoryview(b"fgh")]
    consume(parts, 4)
    assert [bytes(p) for p in parts] == [b"e", b"fgh"]
    consume(parts, 4)
    assert parts == []


async def test_receive_reads_what_waits_and_notes_a_wait():
    io, peer = pair()
    with peer:
        peer.send(b"hello")
        assert await io.receive(100) == b"hello"
        assert not io.yielded  # the bytes were there: no wait
        assert io.drained  # a short read: the next one waits first

        async def later() -> None:
            await trio.sleep(0.01)
            peer.send(b"again")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            assert await io.receive(100) == b"again"
        assert io.yielded
        peer.shutdown(socket.SHUT_WR)
        assert await io.receive(100) == b""  # EOF


async def test_receive_into_fills_the_callers_buffer():
    io, peer = pair()
    store = bytearray(8)
    with peer:
        peer.send(b"hello")
        assert await io.receive_into(memoryview(store)[2:]) == 5
        assert store == b"\0\0hello\0" and not io.yielded and io.drained

        async def later() -> None:
            await trio.sleep(0.01)
            peer.send(b"abcdef")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            assert await io.receive_into(memoryview(store)[:3]) == 3  # no more than the view
        assert store == b"abcello\0" and io.yielded and not io.drained
        assert await io.receive_into(memoryview(store)[5:]) == 3
        assert store == b"abceldef"
        peer.shutdown(socket.SHUT_WR)
        assert await io.receive_into(memoryview(store)) == 0  # EOF


async def test_receive_into_over_a_stream_without_a_socket():
    left, right = trio.testing.memory_stream_pair()
    io = SocketIO(left)
    store = bytearray(6)
    await right.send_all(b"abc")
    assert await io.receive_into(memoryview(store)[1:]) == 3
    assert store == b"\0abc\0\0"


async def test_parts_go_out_in_one_write_in_order():
    io, peer = pair()
    with peer:
        parts = [b"head ", bytearray(b"body "), memoryview(b"tail")]
        assert io.write_now(parts, 14)
        assert await read_all(peer, 14) == b"head body tail"
        await io.write([b"x", b"yz"])
        assert await read_all(peer, 3) == b"xyz"


async def test_a_rest_written_by_a_task_keeps_its_place_and_later_writes_wait_for_it():
    """A peer that does not read: the write that cannot wait leaves its rest to a task holding
    the connection's turn; a later write waits for it, and the peer reads both whole, in order."""
    io, peer = pair(buffer=4096)
    with peer:
        big = bytes(range(256)) * 4096  # 1 MiB: far more than the buffers
        async with trio.open_nursery() as nursery:
            io.tasks = nursery
            io.write_soon([big])
            assert io.busy is not None  # the rest is a task's, which holds the turn
            done: list[bool] = []

            async def after() -> None:
                await io.write([b"after"])
                done.append(True)

            nursery.start_soon(after)
            await trio.testing.wait_all_tasks_blocked()
            assert not done  # back-pressure: the second write waits behind the first
            assert await read_all(peer, len(big) + 5) == big + b"after"
        assert done and io.busy is None and not io.broken


async def test_a_turn_taken_for_parts_made_later_goes_first():
    io, peer = pair()
    with peer:
        previous, busy = io.take_turn()
        assert previous is None
        order: list[str] = []

        async def second() -> None:
            await io.write([b"second"])
            order.append("second")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert order == []
            await io.write_in_turn([b"first "])
            io.end_turn(busy)
        assert await read_all(peer, 12) == b"first second"


async def test_deferred_answers_go_out_at_the_end_of_the_round_or_before_the_next_write():
    flusher = Flusher(limit=3)
    ios = [pair() for _ in range(2)]
    for io, _ in ios:
        io.flusher = flusher
    (one, peer_one), (two, peer_two) = ios
    with peer_one, peer_two:
        one.defer([b"a1"])
        one.defer([b"a2"])  # pipelined: kept together
        two.defer([b"b1"])
        assert flusher.waiting == [one, two]
        flusher.end_of_round()
        assert await read_all(peer_one, 4) == b"a1a2" and await read_all(peer_two, 2) == b"b1"
        one.defer([b"c"])
        await one.write([b"d"])  # carries what was deferred first
        assert await read_all(peer_one, 2) == b"cd"
        flusher.flush()  # nothing left for it
    others = [pair() for _ in range(3)]
    for io, _ in others:
        io.flusher = flusher
        io.defer([b"x"])
    assert flusher.waiting == []  # at the limit they were written at once
    for _, peer in others:
        with peer:
            assert await read_all(peer, 1) == b"x"


async def test_a_broken_socket_is_marked_and_never_raises():
    """A peer that goes away under a write left to a task: the socket is marked broken, its user
    told (``on_broken``), and later writes are no-ops; nothing raises."""
    io, peer = pair(buffer=4096)
    seen: list[bool] = []
    io.on_broken = lambda: seen.append(True)
    async with trio.open_nursery() as nursery:
        io.tasks = nursery
        io.write_soon([b"x" * (1 << 20)])
        assert io.busy is not None  # the rest is the task's
        await trio.testing.wait_all_tasks_blocked()
        peer.close()
    assert io.broken and seen == [True] and io.busy is None
    await io.write([b"more"])
    assert io.write_now([b"ignored"])


async def test_a_busy_connection_yields_every_yield_bytes():
    io, peer = pair()
    io.yield_bytes = 8
    with peer:
        peer.send(b"0123456789")
        io.yielded = False
        assert await io.receive(10) == b"0123456789"
        assert io.yielded and io.moved == 0


async def test_a_stream_without_a_socket_goes_through_trio():
    """A TLS stream, say: the same calls, through trio's stream (no descriptor)."""
    left, right = trio.testing.memory_stream_pair()
    io = SocketIO(left)
    assert io.fd == -1
    await io.write([b"ab", memoryview(b"cd")])
    assert await right.receive_some(10) == b"abcd"
    await right.send_all(b"back")
    assert await io.receive(10) == b"back" and io.yielded


# ---- the send timeout ----------------------------------------------------------------------------


def test_a_write_none_of_whose_bytes_are_taken_gives_up_after_the_send_timeout():
    from trident.sockets_io import BACKLOG

    async def main() -> None:
        io, peer = pair(buffer=4096)
        io.send_timeout = 0.2
        io.protocol = "test"
        before = BACKLOG.timed_out.get(("test", "connection"), 0)
        waiting = BACKLOG.waiting
        with trio.fail_after(5):
            await io.write([b"x" * (1 << 20)])  # the peer never reads
        assert io.broken and io.timed_out
        assert BACKLOG.timed_out[("test", "connection")] == before + 1
        assert BACKLOG.waiting == waiting  # what it held is no longer counted
        await io.write([b"more"])  # nothing more is written, nothing waits
        peer.close()

    trio.run(main)


def test_a_slow_reader_that_takes_bytes_within_the_timeout_keeps_its_connection():
    async def main() -> None:
        io, peer = pair(buffer=4096)
        io.send_timeout = 0.3
        size = 256 * 1024

        async def slow_reader() -> bytes:
            got = bytearray()
            sock = trio.socket.from_stdlib_socket(peer)
            while len(got) < size:
                await trio.sleep(0.05)  # a pause shorter than the timeout between reads
                got += await sock.recv(8192)
            return bytes(got)

        async with trio.open_nursery() as nursery:
            result: list[bytes] = []

            async def read() -> None:
                result.append(await slow_reader())

            nursery.start_soon(read)
            with trio.fail_after(60):
                await io.write([b"y" * size])
        assert not io.broken and not io.timed_out
        assert result == [b"y" * size]

    trio.run(main)


def test_a_stream_without_a_descriptor_times_out_by_slices():
    """TLS and other streams (no descriptor): each slice must go within the timeout."""
    from trident.sockets_io import BACKLOG

    async def main() -> None:
        a, _b = trio.testing.lockstep_stream_pair()  # send_all waits for a reader that never comes
        io = SocketIO(a, send_timeout=0.2, protocol="test-stream")
        waiting = BACKLOG.waiting
        with trio.fail_after(5):
            await io.write([b"z" * 100_000])
        assert io.broken and io.timed_out
        assert BACKLOG.timed_out[("test-stream", "connection")] == 1
        assert BACKLOG.waiting == waiting

    trio.run(main)
