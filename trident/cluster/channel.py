"""A request/reply channel between the supervisor and one worker, over one stream.

Either end calls the other (:meth:`ControlChannel.call`) and answers the other's calls with
the handler given to :meth:`ControlChannel.serve`; each incoming request runs in a task of its
own, so a slow one (a model load) never holds up another (a statistics query). The messages
are :mod:`trident.cluster.wire`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trident.cluster.wire import FrameReader, WireError, encode
from trident.errors import Code, TritonError, internal

log = logging.getLogger("trident.cluster")

Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any] | None]]


async def pump_frames(stream: trio.abc.ReceiveStream, feed: Callable[[bytes | bytearray], list[Any]],
                      handle: Callable[[list[Any]], Awaitable[None]], bad: type[Exception], what: str) -> None:
    """Hand ``handle`` the frames ``feed`` makes of the bytes ``stream`` receives, a batch per
    read, until the peer closes the stream, or sends bytes ``feed`` refuses with ``bad`` (logged,
    naming ``what``). The stream is the caller's to close. Cancellation stops reading."""
    while True:
        try:
            data = await stream.receive_some(1 << 20)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        try:
            frames = feed(data)
        except bad as e:
            log.error("%s: %s; closing it", what, e)
            return
        await handle(frames)


class ChannelClosed(TritonError):
    """The other process is gone (it exited, or closed the channel)."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.UNAVAILABLE, message)


def error_fields(exc: BaseException) -> dict[str, Any]:
    """A reply's ``error`` for an exception of a handler (TritonError keeps its code)."""
    if isinstance(exc, TritonError):
        return {"code": exc.code.value, "message": exc.message}
    return {"code": Code.INTERNAL.value, "message": f"{type(exc).__name__}: {exc}"}


def error_from(fields: dict[str, Any]) -> TritonError:
    try:
        code = Code(fields.get("code"))
    except ValueError:
        code = Code.INTERNAL
    return TritonError(code, str(fields.get("message", "")))


class _Waiter:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None


class ControlChannel:
    """Calls both ways over ``stream``; ``peer`` names the other end in errors ("worker 2")."""

    def __init__(self, stream: trio.abc.Stream, peer: str) -> None:
        self.stream = stream
        self.peer = peer
        self._send_lock = trio.Lock()
        self._next_id = 0
        self._waiting: dict[int, _Waiter] = {}
        self.closed = False

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Ask the peer to do ``op``; returns its reply's fields.

        Raises the peer's TritonError, ChannelClosed (UNAVAILABLE) when the peer is gone before
        it answers. Cancelling the caller abandons the reply (the peer's work goes on).
        """
        if self.closed:
            raise ChannelClosed(f"{self.peer} is gone")
        self._next_id += 1
        ident = self._next_id
        waiter = self._waiting[ident] = _Waiter()
        try:
            await self._send({"id": ident, "op": op, **fields})
            await waiter.done.wait()
        finally:
            self._waiting.pop(ident, None)
        reply = waiter.reply
        if reply is None:
            raise ChannelClosed(f"{self.peer} is gone")
        if "error" in reply:
            raise error_from(reply["error"])
        return reply

    async def _send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        async with self._send_lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                self._close()
                raise ChannelClosed(f"{self.peer} is gone") from e

    async def serve(self, handler: Handler) -> None:
        """Read the peer's messages until it closes the channel, answering its requests with
        ``handler(op, fields)`` (a TritonError becomes the error reply; another exception is
        logged and becomes INTERNAL). Returns at end of stream; calls still waiting then get
        ChannelClosed. Cancellation stops reading and cancels the handlers still running.
        """
        try:
            async with trio.open_nursery() as nursery:
                async def dispatch(messages: list[dict[str, Any]]) -> None:
                    for message in messages:
                        if "re" in message:
                            waiter = self._waiting.get(message["re"])
                            if waiter is not None:
                                waiter.reply = message
                                waiter.done.set()
                        else:
                            nursery.start_soon(self._answer, handler, message)

                await pump_frames(self.stream, FrameReader().feed, dispatch, WireError,
                                  f"control channel with {self.peer}")
                nursery.cancel_scope.cancel()
        finally:
            self._close()

    async def _answer(self, handler: Handler, message: dict[str, Any]) -> None:
        ident = message.get("id")
        op = str(message.get("op", ""))
        try:
            result = await handler(op, message)
            reply: dict[str, Any] = {"re": ident, **(result or {})}
        except TritonError as e:
            reply = {"re": ident, "error": error_fields(e)}
        except Exception as e:
            log.exception("control request '%s' from %s failed", op, self.peer)
            reply = {"re": ident, "error": error_fields(e)}
        try:
            await self._send(reply)
        except ChannelClosed:
            pass

    def _close(self) -> None:
        """Fail the calls still waiting (their peer is gone)."""
        self.closed = True
        for waiter in list(self._waiting.values()):
            waiter.done.set()

    async def aclose(self) -> None:
        self._close()
        await self.stream.aclose()


def unknown_op(op: str) -> TritonError:
    return internal(f"unknown control request '{op}'")
