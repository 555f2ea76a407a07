"""The server core: the in-process :class:`Server` and what it owns.

Modules: :mod:`.core` (the Server facade and ``open_server``), :mod:`.repository` (the model
repository and model control), :mod:`.cloud_repository` (object-storage repositories),
:mod:`.model` (a model version: lifetime, drain, cache, tracing, statistics),
:mod:`.execution` (running batches on instances), :mod:`.handle` (a request in flight, as
the Server hands it to its caller), :mod:`.shared_memory` (client regions),
:mod:`.devices`, :mod:`.worker_threads` (threads with owners) and :mod:`.threaded` (the server
on a thread of its own, for asyncio and plain threads).
"""

from __future__ import annotations

from trident.server.core import EXTENSIONS, Server, open_server
from trident.server.handle import RequestHandle

__all__ = ["EXTENSIONS", "RequestHandle", "Server", "open_server"]
