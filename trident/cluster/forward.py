"""Requests one worker sends to another (``--workers``): the sequence slots of a correlation id
and the models placed on one worker live in one process, whichever worker a client reached.

Every worker serves a Unix socket in the abstract namespace (:func:`address`) with a
:class:`ForwardServer`; a worker that must send a request elsewhere keeps one connection to each
peer it needs (:class:`Peer`). A connection starts with each side handing the other the
descriptor of its :class:`~trident.cluster.arena.Arena`, then carries the frames of
:mod:`trident.cluster.forward_wire` both ways: large tensors cross by one copy into the
sender's arena, small ones inline. Requests on one connection are started in the order they
were sent, so the requests of one sequence keep their order.

The forwarded request counts as in flight in both workers (each drains it), is cancelled in
the serving worker when the client goes away in the other (a ``cancel`` frame), and fails
with UNAVAILABLE, naming the worker, when the serving worker exits meanwhile.
"""

from __future__ import annotations

import array
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.cluster.arena import Arena, PeerArena
from trident.cluster.channel import pump_frames
from trident.cluster.forward_wire import (
    ForwardWireError,
    FrameReader,
    decode_request,
    decode_response,
    encode_control,
    encode_request,
    encode_response,
)
from trident.errors import TritonError, invalid_arg, unavailable
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.cluster")

SendResponse = Callable[[InferenceResponse], Awaitable[None]]
SEND_TIMEOUT_S = 60.0  # a frame that cannot be written in this long ends the connection
_DONE = object()


def address(cluster: str, index: int) -> str:
    """The abstract Unix socket of worker ``index`` of the supervisor ``cluster``."""
    return f"\0trident-forward-{cluster}-{index}"


async def _send_fd(sock: trio.socket.SocketType, fd: int) -> None:
    await sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


async def _recv_fd(sock: trio.socket.SocketType) -> int:
    """The descriptor the peer sent with its one-byte handshake. Raises OSError."""
    data, ancdata, _, _ = await sock.recvmsg(1, socket.CMSG_LEN(array.array("i").itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if fds:
                return int(fds[0])
    raise OSError(f"the peer sent no arena ({data!r})")


class _Link:
    """One connection's sending side: frames written whole, one at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.broken = False

    async def write(self, parts: list[bytes | memoryview] | bytes) -> None:
        """Write one frame; raises trio.BrokenResourceError when the connection is gone. The
        write is not cancelled half-way (a frame cut short would corrupt the stream)."""
        with trio.CancelScope(shield=True):
            async with self.lock:
                if self.broken:
                    raise trio.BrokenResourceError("the connection is gone")
                with trio.move_on_after(SEND_TIMEOUT_S) as timer:
                    try:
                        for part in [parts] if isinstance(parts, bytes) else parts:
                            await self.stream.send_all(part)
                        return
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self.broken = True
                        raise trio.BrokenResourceError("the connection is gone") from None
                if timer.cancelled_caught:
                    self.broken = True
                    await trio.aclose_forcefully(self.stream)
                    raise trio.BrokenResourceError("the peer does not read")


class ForwardServer:
    """Serves the requests other workers forward to this one (see the module)."""

    def __init__(self, server: Server, cluster: str, index: int) -> None:
        self.server = server
        self.address = address(cluster, index)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled. Raises OSError when the address is taken."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with sock:
            await sock.bind(self.address)
            sock.listen(64)
            task_status.started()
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(self._connection, conn)

    async def _connection(self, sock: trio.socket.SocketType) -> None:
        own: Arena | None = None
        peer: PeerArena | None = None
        requests: dict[int, InferenceRequest] = {}
        try:
            peer = PeerArena(await _recv_fd(sock))
            own = Arena()
            await _send_fd(sock, own.fd)
        except OSError as e:
            log.warning("a forwarding connection failed its handshake: %s", e)
            sock.close()
            if own is not None:
                own.close()
            return
        stream = trio.SocketStream(sock)
        link = _Link(stream)
        try:
            async with trio.open_nursery() as nursery:
                async def handle(frames: list[tuple[dict[str, Any], bytearray]]) -> None:
                    assert peer is not None and own is not None
                    for header, payload in frames:
                        kind = header.get("k")
                        if kind == "req":
                            rid = int(header["rid"])
                            try:
                                request = decode_request(header, payload, peer.view)
                            except ForwardWireError as e:
                                await self._refuse(link, rid, invalid_arg(f"bad forwarded request: {e}"))
                                continue
                            requests[rid] = request
                            # started in arrival order: the requests of a sequence keep theirs
                            nursery.start_soon(self._run, link, own, requests, rid, request)
                        elif kind == "cancel":
                            cancelled = requests.get(int(header["rid"]))
                            if cancelled is not None:
                                cancelled.cancel()
                        elif kind == "rel":
                            for offset in header.get("offs", []):
                                own.free(int(offset))

                await pump_frames(stream, FrameReader().feed, handle, ForwardWireError, "a forwarding connection")
                for request in requests.values():  # the other worker is gone: so are its clients
                    request.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            peer.close()
            own.close()

    async def _refuse(self, link: _Link, rid: int, error: TritonError) -> None:
        frame, _ = encode_response(rid, InferenceResponse(error=error), done=False)
        try:
            await link.write(frame)
            await link.write(encode_control("done", rid=rid))
        except trio.BrokenResourceError:
            pass

    async def _run(self, link: _Link, own: Arena, requests: dict[int, InferenceRequest], rid: int,
                   request: InferenceRequest) -> None:
        async def send(response: InferenceResponse) -> None:
            frame, _ = encode_response(rid, response, done=False, allocate=own.allocate, arena=own.view)
            await link.write(frame)

        try:
            try:
                await self.server.infer_forwarded(request, send)
            except TritonError as e:
                await send(InferenceResponse(model_name=request.model_name, model_version=request.model_version,
                                             id=request.id, error=e))
            await link.write(encode_control("done", rid=rid))
        except trio.BrokenResourceError:
            request.cancel()  # the worker that asked is gone
        finally:
            requests.pop(rid, None)


class _Pending:
    __slots__ = ("send", "receive", "inputs")

    def __init__(self, inputs: list[int]) -> None:
        self.send, self.receive = trio.open_memory_channel[Any](float("inf"))
        self.inputs = inputs  # arena offsets of the request's inputs: freed when the peer is done


class Peer:
    """This worker's connection to worker ``index``: forwards requests, returns responses."""

    def __init__(self, cluster: str, index: int, nursery: trio.Nursery) -> None:
        self.index = index
        self.address = address(cluster, index)
        self._nursery = nursery
        self._link: _Link | None = None
        self._arena: Arena | None = None
        self._peer: PeerArena | None = None
        self._connecting = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next = 0

    def _gone(self, why: str) -> TritonError:
        return unavailable(f"worker {self.index}, which serves this request, {why}")

    async def _connect(self) -> _Link:
        async with self._connecting:
            if self._link is not None and not self._link.broken:
                return self._link
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            arena = Arena()
            try:
                await sock.connect(self.address)
                await _send_fd(sock, arena.fd)
                peer = PeerArena(await _recv_fd(sock))
            except OSError as e:
                sock.close()
                arena.close()
                raise self._gone(f"is not running ({e.strerror or e})") from None
            link = _Link(trio.SocketStream(sock))
            self._link, self._arena, self._peer = link, arena, peer
            self._nursery.start_soon(self._read, link, arena, peer)
            return link

    async def _read(self, link: _Link, arena: Arena, peer: PeerArena) -> None:
        """Deliver the peer's responses until the connection ends; then fail what waits."""
        stream = link.stream

        async def handle(frames: list[tuple[dict[str, Any], bytearray]]) -> None:
            for header, payload in frames:
                kind = header.get("k")
                entry = self._pending.get(int(header.get("rid", -1)))
                if kind == "res":
                    try:
                        response = decode_response(header, payload, peer.view)
                    except ForwardWireError as e:
                        response = InferenceResponse(error=self._gone(f"sent a bad response: {e}"))
                    shared = [int(o[4]) for o in header.get("outputs", []) if o[3] == "s"]
                    if shared:  # copied out: the peer may reuse that space
                        try:
                            await link.write(encode_control("rel", offs=shared))
                        except trio.BrokenResourceError:
                            pass
                    if entry is not None:
                        entry.send.send_nowait(response)
                elif kind == "done" and entry is not None:
                    for offset in entry.inputs:
                        arena.free(offset)
                    entry.send.send_nowait(_DONE)
                    self._pending.pop(int(header["rid"]), None)

        try:
            await pump_frames(stream, FrameReader().feed, handle, ForwardWireError,
                              f"the forwarding connection to worker {self.index}")
        finally:
            link.broken = True
            if self._link is link:
                self._link = None
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            for entry in list(self._pending.values()):
                entry.send.send_nowait(self._gone("exited while serving it"))
            self._pending.clear()
            peer.close()
            arena.close()

    async def stream(self, request: InferenceRequest, send: SendResponse) -> None:
        """Serve ``request`` in the peer: ``await send(response)`` for each of its responses.
        Raises TritonError (UNAVAILABLE when the peer is not running or exits meanwhile; the
        error of a request the peer refused). Cancellation cancels the request in the peer."""
        link = await self._connect()
        assert self._arena is not None
        self._next += 1
        rid = self._next
        frame, used = encode_request(rid, request, stream=True, allocate=self._arena.allocate,
                                     arena=self._arena.view)
        entry = self._pending[rid] = _Pending(used)
        try:
            await link.write(frame)
        except trio.BrokenResourceError:
            self._pending.pop(rid, None)
            raise self._gone("exited") from None
        first = True
        try:
            while True:
                item = await entry.receive.receive()
                if item is _DONE:
                    return
                if isinstance(item, TritonError):
                    raise item
                if first and item.error is not None and item.final and not item.outputs:
                    raise item.error  # refused before any response: as a local request raises
                first = False
                await send(item)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                try:
                    await link.write(encode_control("cancel", rid=rid))
                except trio.BrokenResourceError:
                    pass
            raise

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """The one response of ``request``, served in the peer. Raises as :meth:`stream`, and
        the error of an error response."""
        result: InferenceResponse | None = None

        async def keep(response: InferenceResponse) -> None:
            nonlocal result
            result = response

        await self.stream(request, keep)
        if result is None:
            raise self._gone("sent no response")
        if result.error is not None:
            raise result.error
        return result
