"""A worker's link to its supervisor (``--workers``): the server's control plane goes through it.

A worker (:mod:`trident.cluster.worker`) runs :func:`trident.serve.serve` with a
:class:`WorkerLink`: its front ends serve requests as a single server does, and what must be
the same in every worker goes through the link to the supervisor
(:mod:`trident.cluster.supervisor`), which applies it to all of them (model loads in two
phases, unloads, shared-memory registrations, trace and log settings) or gathers it from all of
them (statistics, metrics). The requests the supervisor sends a worker are answered by
:meth:`WorkerLink.handle`.
"""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import trio

from trident.cluster.channel import ControlChannel, unknown_op
from trident.cluster.forward import ForwardServer, Peer
from trident.cluster.merge import stats_from_wire, stats_to_wire
from trident.cluster.wire import decode_bytes, encode_bytes
from trident.errors import TritonError, invalid_arg, unavailable
from trident.options import ServerOptions
from trident.types import ModelStatistics

if TYPE_CHECKING:
    from trident.protocol.generated.inference import ModelConfig
    from trident.server import Server

log = logging.getLogger("trident.cluster")

CONTROL_FD_ENV = "TRIDENT_CONTROL_FD"


def options_to_wire(options: ServerOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in fields(ServerOptions)}


def options_from_wire(values: dict[str, Any]) -> ServerOptions:
    known = {f.name for f in fields(ServerOptions)}
    options = ServerOptions(**{k: v for k, v in values.items() if k in known})
    options.ignored_flags = [tuple(x) for x in options.ignored_flags]  # type: ignore[misc]
    return options


class _Staged:
    """One two-phase load in this worker: prepared (its versions ready, waiting at the gate),
    then committed or abandoned by the supervisor."""

    def __init__(self) -> None:
        self.prepared = trio.Event()
        self.decided = trio.Event()
        self.finished = trio.Event()
        self.commit = False
        self.reason = ""
        self.error: BaseException | None = None
        self.config: ModelConfig | None = None
        self.versions: list[int] = []

    async def gate(self, config: ModelConfig, versions: list[int]) -> None:
        """The repository's gate: report ready, then wait for the supervisor's decision."""
        self.config, self.versions = config, versions
        self.prepared.set()
        await self.decided.wait()
        if not self.commit:  # the reason is the failure elsewhere, so that every worker records it
            raise unavailable(self.reason or "the load was abandoned")


def sequence_owner(correlation_id: Any, count: int) -> int:
    """The worker that serves the sequence ``correlation_id`` (an integer, or a string: by its
    CRC-32), the same in every worker."""
    if isinstance(correlation_id, str):
        return zlib.crc32(correlation_id.encode("utf-8", "surrogatepass")) % count
    return int(correlation_id) % count


class WorkerLink:
    """This worker's side of the control channel: the server's :class:`ClusterLink` (calls to
    the supervisor) and the handler of the supervisor's requests."""

    def __init__(self, channel: ControlChannel, index: int, count: int, restart: bool = False,
                 cluster: str = "") -> None:
        self.channel = channel
        self.index = index
        self.count = count
        #: names this supervisor's workers' forwarding sockets (trident.cluster.forward)
        self.cluster = cluster
        self._peers: dict[int, Peer] = {}
        #: started again after a worker exited: it serves only once brought in step (in_step)
        self.restart = restart
        self.in_step = trio.Event()
        #: every worker is ready (the supervisor says so): part of the server's readiness
        self.ready = False
        #: the supervisor asked this worker to drain and exit (or is gone)
        self.drain = trio.Event()
        self.server: Server | None = None
        self._nursery: trio.Nursery | None = None
        self._staged: dict[int, _Staged] = {}

    async def attach(self, server: Server, nursery: trio.Nursery) -> None:
        """Serve ``server``'s control plane and the requests other workers forward to it; the
        staged loads, the forwarding server and connections run in ``nursery`` (the server's).
        Raises OSError when the forwarding socket cannot be bound."""
        self.server = server
        self._nursery = nursery
        server.cluster = self
        if self.count > 1:
            await nursery.start(ForwardServer(server, self.cluster, self.index).serve)

    # ---- where requests are served ------------------------------------------------------------

    def peer(self, index: int) -> Peer:
        """The connection to worker ``index`` (opened on first use)."""
        peer = self._peers.get(index)
        if peer is None:
            assert self._nursery is not None
            peer = self._peers[index] = Peer(self.cluster, index, self._nursery)
        return peer

    def route_for(self, name: str, config: ModelConfig, backend: Any) -> Any:
        """A model version's route (trident.server.model.ModelVersion.route): a model placed on
        another worker (trident.cluster.placement) sends every request there; a sequence model's
        requests go to the worker that owns their correlation id (:func:`sequence_owner`); any
        other model is served where it is asked. None: always here."""
        if getattr(backend, "remote", False):  # placed on another worker: everything goes there
            placed = self.peer(backend.owner)
            return lambda request: placed
        if self.count < 2 or config.sequence_batching is None:
            return None
        index, count, peer = self.index, self.count, self.peer

        def route(request: Any) -> Peer | None:
            sid = request.parameters.get("sequence_id")
            if not sid:
                return None  # refused here, with Triton's message
            owner = sequence_owner(sid, count)
            return None if owner == index else peer(owner)

        return route

    # ---- the server's ClusterLink: calls to the supervisor ------------------------------------

    async def load(self, name: str, config: str | None, files: dict[str, bytes] | None) -> None:
        wire_files = {k: encode_bytes(v) for k, v in files.items()} if files else None
        await self.channel.call("load", name=name, config=config, files=wire_files)

    async def unload(self, name: str, unload_dependents: bool) -> None:
        await self.channel.call("unload", name=name, dependents=unload_dependents)

    async def statistics(self, name: str, version: str) -> list[ModelStatistics]:
        reply = await self.channel.call("statistics", name=name, version=version)
        return [stats_from_wire(s) for s in reply["stats"]]

    async def call_all(self, op: str, **fields: Any) -> None:
        await self.channel.call("broadcast", bop=op, fields=fields)

    async def call_first(self, op: str, **fields: Any) -> dict[str, Any]:
        reply = await self.channel.call("broadcast", bop=op, fields=fields)
        return dict(reply["result"])

    # ---- the supervisor's requests ---------------------------------------------------------

    async def handle(self, op: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Answer one request of the supervisor. Raises TritonError (the error reply)."""
        server = self.server
        if op == "drain":
            self.drain.set()
            return None
        if op == "in_step":
            self.in_step.set()
            return None
        if server is None:
            raise unavailable("the worker's server is not running yet")
        repo = server.repository
        if op == "prepare":
            return await self._prepare(msg)
        if op in ("commit", "abort"):
            return await self._decide(msg, op == "commit")
        if op == "unload":
            if msg.get("poll"):
                await repo.poll_unload(msg["name"])
            else:
                await repo.unload(msg["name"], bool(msg.get("dependents")))
            return None
        if op == "placement":
            from trident.cluster.placement import placement_of

            config = await repo.read_config(str(msg["name"]), msg.get("config"))
            return {"owner": placement_of(str(msg["name"]), config, self.count)}
        if op == "config_of":
            from trident.config import config_to_json

            serving = repo.serving_config(str(msg["name"]))
            if serving is None:
                raise unavailable(f"model '{msg['name']}' is not loaded in worker {self.index}, where it is placed")
            return {"config": json.dumps(config_to_json(serving[0])), "versions": serving[1]}
        if op == "mark_failed":
            repo.record_failure(str(msg["name"]), str(msg["reason"]))
            return None
        if op == "startup_plan":
            first, second = await repo.startup_plan()
            return {"phases": [first, second]}
        if op == "poll_plan":
            changed, removed = await repo.poll_plan()
            return {"changed": changed, "removed": removed}
        if op == "set_ready":
            self.ready = bool(msg["ready"])
            server.loading = False
            return None
        if op == "stats_local":
            try:
                snapshots = server.model_statistics(str(msg.get("name", "")), str(msg.get("version", "")))
            except TritonError as e:
                return {"error_local": {"code": e.code.value, "message": e.message}}
            return {"stats": [stats_to_wire(s) for s in snapshots]}
        if op == "metrics_local":
            from trident.observability.metrics import worker_exposition

            return {"text": worker_exposition(server).decode()}
        if op == "index":
            return {"index": [[e.name, e.version, e.state, e.reason] for e in server.repository_index()]}
        if op == "tables":
            from trident.startup import startup_tables

            return {"tables": startup_tables(server)}
        if op == "broadcast_local":
            return {"result": await self._apply(str(msg["bop"]), dict(msg["fields"]))}
        raise unknown_op(op)

    async def _apply(self, op: str, f: dict[str, Any]) -> dict[str, Any]:
        """One broadcast operation applied here (the same in every worker)."""
        assert self.server is not None
        shm = self.server.shared_memory
        if op == "shm_register_system":
            shm.register_system(f["name"], f["key"], int(f["offset"]), int(f["byte_size"]))
        elif op == "shm_register_cuda":
            await trio.to_thread.run_sync(shm.register_cuda, f["name"], decode_bytes(f["raw_handle"]),
                                          int(f["device_id"]), int(f["byte_size"]))
        elif op == "shm_unregister":
            if f["kind"] == "system":
                shm.unregister_system(f["name"])
            else:
                shm.unregister_cuda(f["name"])
        elif op == "log_settings":
            return self.server.update_log_settings(f["settings"])
        elif op == "trace_settings":
            return self.server.update_trace_settings(f["model"], f["settings"])
        else:
            raise unknown_op(op)
        return {}

    async def _prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Phase one of a load: run it up to its gate (versions ready, nothing swapped).
        Returns the final config and versions; raises the load's TritonError."""
        assert self.server is not None and self._nursery is not None
        from trident.config import config_to_json

        repo = self.server.repository
        txid, kind, name = int(msg["txid"]), str(msg["kind"]), str(msg["name"])
        staged = self._staged[txid] = _Staged()
        files = {k: decode_bytes(v) for k, v in msg["files"].items()} if msg.get("files") else None

        async def run() -> None:
            try:
                if kind == "api":
                    await repo.load(name, msg.get("config"), files, gate=staged.gate)
                elif kind == "startup":
                    await repo.load_startup_model(name, gate=staged.gate)
                elif kind == "poll":
                    await repo.poll_load(name, gate=staged.gate)
                elif kind == "remote":
                    from trident.cluster.remote import RemoteBackend
                    from trident.config import config_from_json

                    config = config_from_json(msg["config"])
                    backend = RemoteBackend(config.backend or config.platform, int(msg["owner"]))
                    await repo.load_remote(name, config, [int(v) for v in msg["versions"]], backend,
                                           gate=staged.gate)
                else:
                    raise invalid_arg(f"unknown kind of load '{kind}'")
            except BaseException as e:  # recorded for the supervisor; cancellation ends the worker anyway
                staged.error = e
                if not isinstance(e, Exception):
                    raise
            finally:
                staged.finished.set()
                staged.prepared.set()

        self._nursery.start_soon(run)
        await staged.prepared.wait()
        if staged.finished.is_set():
            self._staged.pop(txid, None)
            if isinstance(staged.error, TritonError):
                raise staged.error
            if staged.error is not None:
                raise unavailable(f"load of '{name}' failed: {type(staged.error).__name__}: {staged.error}")
            raise unavailable(f"load of '{name}' ended before it was ready")
        assert staged.config is not None
        return {"config": json.dumps(config_to_json(staged.config)), "versions": staged.versions}

    async def _decide(self, msg: dict[str, Any], commit: bool) -> dict[str, Any] | None:
        """Phase two: swap the prepared versions in (commit) or unload them (abort). A commit
        raises what the swap raised."""
        staged = self._staged.pop(int(msg["txid"]), None)
        if staged is None:
            return None
        staged.commit = commit
        staged.reason = str(msg.get("reason", ""))
        staged.decided.set()
        await staged.finished.wait()
        if commit and isinstance(staged.error, TritonError):
            raise staged.error
        return None
