"""A worker of ``--workers``: ``python -m trident.cluster.worker``, a full trident server whose
control plane is its supervisor's.

The supervisor (:mod:`trident.cluster.supervisor`) starts it with two things handed down: its
listening sockets (``TRIDENT_LISTEN_FDS``, see :mod:`trident.listening`) and one end of a
control channel (``TRIDENT_CONTROL_FD``). The worker asks for its options over the channel
(``hello``), then runs :func:`trident.serve.serve` with a
:class:`~trident.cluster.link.WorkerLink`. When the channel ends (the supervisor is gone) it
drains and exits as on SIGTERM.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import trio

from trident.cluster.channel import ChannelClosed, ControlChannel
from trident.cluster.link import CONTROL_FD_ENV, WorkerLink, options_from_wire
from trident.errors import unavailable


async def run_worker(control_fd: int) -> int:
    """Serve as a worker of the supervisor at the other end of ``control_fd`` until it says
    drain (or goes away, or a signal comes); returns the exit status."""
    from trident.serve import serve

    sock = socket.socket(fileno=control_fd)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    channel = ControlChannel(stream, "the supervisor")
    link: WorkerLink | None = None

    async def handle(op: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        if link is None:
            raise unavailable("the worker is starting")
        return await link.handle(op, msg)

    async with trio.open_nursery() as nursery:
        async def serve_channel() -> None:
            await channel.serve(handle)
            if link is not None:
                link.drain.set()  # the supervisor is gone: stop as on SIGTERM
            else:
                nursery.cancel_scope.cancel()

        nursery.start_soon(serve_channel)
        try:
            hello = await channel.call("hello", pid=os.getpid())
        except ChannelClosed:
            return 1
        options = options_from_wire(hello["options"])
        link = WorkerLink(channel, int(hello["index"]), int(hello["count"]), bool(hello.get("restart")),
                          str(hello["cluster"]))
        status = await serve(options, link=link)
        nursery.cancel_scope.cancel()
    return status


def main() -> int:
    """``python -m trident.cluster.worker``: the process a supervisor starts."""
    from trident.serve import fifo_task_order

    fd = os.environ.get(CONTROL_FD_ENV)
    if not fd:
        sys.stderr.write("trident.cluster.worker: started without a supervisor (no control channel)\n")
        return 2
    fifo_task_order()
    try:
        return trio.run(run_worker, int(fd))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
