"""Client disconnects noticed while an /infer request runs, without a task per request.

Most requests are answered before anyone could notice their client leave, so nothing is
started for them: a connection's task marks the wait for an answer (:meth:`DisconnectWatch.starts`
and :meth:`~DisconnectWatch.ends`: ``busy`` is odd in between), and one ticker per server
(:func:`watch_requests`) looks at every connection each ``WATCH_DELAY`` while requests run.
A request found waiting on two ticks in a row gets its connection's watcher (a task started the
first time it is needed, then parked between requests), which reads the socket until the
request ends: pipelined bytes go to the parser (up to ``MAX_READ_AHEAD``), EOF or a reset
cancels the request and closes the connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from trident.http.limits import MAX_READ_AHEAD, RECEIVE_SIZE, WATCH_DELAY

if TYPE_CHECKING:
    from trident.http.state import ConnectionState, ServerState


class DisconnectWatch:
    """One connection's disconnect watch (see the module docstring). ``request_scope`` is the
    scope of a heavy request (decoded off the loop), which a disconnect cancels instead of the
    connection's, so that its request can be freed off the loop."""

    __slots__ = ("conn", "busy", "seen", "park", "watching", "request_scope", "started")

    def __init__(self, conn: ConnectionState) -> None:
        self.conn = conn
        self.busy = 0  # odd while the connection's task waits for an answer (+1 at its start and end)
        self.seen = -1  # ``busy`` at the ticker's last look
        self.park: trio.CancelScope | None = None  # the watcher's sleep between requests
        self.watching: trio.CancelScope | None = None  # the watcher's scope while it reads the socket
        self.request_scope: trio.CancelScope | None = None
        self.started = False  # the watcher task has started (the first time a request ran long)

    def starts(self) -> None:
        """The connection's task waits for an answer: the ticker may start the watcher if the
        wait runs long."""
        self.busy += 1
        state = self.conn.state
        if state.ticker_park is not None:  # the ticker sleeps (no request was running): wake it
            state.ticker_park.cancel()
            state.ticker_park = None

    def ends(self) -> None:
        """The wait of :meth:`starts` is over: a watcher started meanwhile stops its socket
        wait at once (the socket is the task's again)."""
        self.busy += 1
        if self.watching is not None:
            self.watching.cancel()

    def wake(self) -> None:
        """Watch the socket while the current request runs (the ticker's call)."""
        if self.park is not None:
            self.park.cancel()
            return
        tasks = self.conn.io.tasks
        if tasks is not None and not self.started and self.watching is None:
            tasks.start_soon(self._run, name="trident.http.watch_disconnect")
            self.started = True  # started once

    async def _run(self) -> None:
        """The watcher: while a request runs it reads the socket (pipelined bytes to the parser),
        and EOF or a reset cancels the request's scope (a heavy request's) or stops the
        connection; :meth:`ends` stops the read when the request ends; then it sleeps until
        the ticker wakes it for another long request. Runs until the connection closes."""
        conn = self.conn
        io = conn.io
        parser = conn.parser
        while True:
            if self.busy & 1:
                with trio.CancelScope() as watching:
                    self.watching = watching
                    try:
                        while not (conn.eof or io.broken):
                            if parser.buffered >= MAX_READ_AHEAD:
                                await trio.sleep_forever()
                            await io.wait_readable()
                            if watching.cancel_called:
                                break
                            data = io.read_now(RECEIVE_SIZE)
                            if data is None:
                                continue
                            if not data:
                                if not io.broken:
                                    conn.eof = True
                                # the request and the connection (a heavy request: its own scope)
                                if self.request_scope is not None:
                                    self.request_scope.cancel()
                                else:
                                    conn.stop()
                                break
                            parser.feed(data)
                    finally:
                        self.watching = None
            with trio.CancelScope() as park:
                self.park = park
                try:
                    await trio.sleep_forever()
                finally:
                    self.park = None


async def watch_requests(state: ServerState) -> None:
    """Every ``WATCH_DELAY`` while requests run, start the disconnect watch of each connection
    whose request has been running since the previous tick (so for ``WATCH_DELAY`` to twice
    that): one task for the server, nothing per request. Sleeps while no request runs (the next
    request wakes it). Runs until cancelled.
    """
    while True:
        running = False
        for watch in state.watches:
            busy = watch.busy
            if busy & 1:
                running = True
                if watch.seen == busy:
                    watch.wake()
            watch.seen = busy
        if running:
            await trio.sleep(WATCH_DELAY)
            continue
        with trio.CancelScope() as park:
            state.ticker_park = park
            await trio.sleep_forever()
        state.ticker_park = None
        await trio.sleep(WATCH_DELAY)
