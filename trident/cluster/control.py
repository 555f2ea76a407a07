"""The control plane of ``--workers``: what every worker must have, and how it gets there.

:class:`ControlPlane` answers the workers' control requests (their servers' model loads and
unloads, shared-memory registrations, trace and log settings, statistics) by applying them to
every worker, and keeps what was applied (:class:`Desired`) to apply it again to a worker started
anew. A load runs in two phases (:meth:`ControlPlane.transact`): every worker loads the model up
to the point where its new versions would replace what serves; only when all got there do all of
them swap, and on the first failure the others drop what they loaded. A model placed on one
worker (trident.cluster.placement) is loaded there first; the others load the config it ended
with. One control operation runs at a time (:attr:`ControlPlane.lock`).

The supervisor (:mod:`trident.cluster.supervisor`) owns the processes; this module only talks
to them through their channels (:class:`Worker`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from trident.cluster.channel import ControlChannel, unknown_op
from trident.cluster.merge import merge_expositions, merge_statistics, stats_from_wire, stats_to_wire
from trident.errors import Code, TritonError, unavailable
from trident.options import ServerOptions
from trident.types import ModelStatistics

log = logging.getLogger("trident.cluster")


@dataclass
class Worker:
    """One running worker process and its channel."""

    index: int
    process: trio.Process
    channel: ControlChannel
    restart: bool  # started again after an exit: it serves once brought in step
    attached: trio.Event = field(default_factory=trio.Event)
    in_step: bool = False  # has every model, region and setting of the desired state
    started_at: float = 0.0

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.channel.call(op, **fields)


@dataclass
class Desired:
    """What every worker must have: applied again to a worker started anew."""

    #: model -> ("api", config, files) for the load API's last load, ("unloaded",), or
    #: ("failed", reason) for a load that failed and left the model serving nowhere (in the
    #: order of the last change); models loaded at start-up and never touched are not here
    models: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: shared-memory region -> (operation, fields) of its registration
    regions: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    log_settings: dict[str, Any] = field(default_factory=dict)
    trace_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def set_model(self, name: str, state: tuple[Any, ...]) -> None:
        self.models.pop(name, None)
        self.models[name] = state


class ControlPlane:
    """The control plane of the ``count`` workers in ``workers`` (the supervisor's list, a slot
    per worker, None while one is not running): see the module."""

    def __init__(self, options: ServerOptions, workers: list[Worker | None]) -> None:
        self.options = options
        self.workers = workers
        self.desired = Desired()
        self.lock = trio.Lock()  # one control operation at a time, and none while a worker is brought in step
        self._txid = 0

    def live(self) -> list[Worker]:
        """The workers attached to the control plane (serving, or being brought in step)."""
        return [w for w in self.workers if w is not None and w.attached.is_set()]

    def in_step(self) -> list[Worker]:
        return [w for w in self.live() if w.in_step]

    async def handle(self, op: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """A worker's control request. Raises TritonError (the error reply)."""
        if op == "load":
            files = msg.get("files")
            async with self.lock:
                try:
                    await self.transact("api", msg["name"], msg.get("config"), files)
                except TritonError:
                    await self._remember_failure(msg["name"])
                    raise
                self.desired.set_model(msg["name"], ("api", msg.get("config"), files))
            return None
        if op == "unload":
            async with self.lock:
                await self._all("unload", name=msg["name"], dependents=bool(msg.get("dependents")))
                self.desired.set_model(msg["name"], ("unloaded",))
            return None
        if op == "statistics":
            return {"stats": [stats_to_wire(s) for s in await self.statistics(str(msg["name"]),
                                                                               str(msg["version"]))]}
        if op == "broadcast":
            return {"result": await self._broadcast(str(msg["bop"]), dict(msg["fields"]))}
        raise unknown_op(op)

    async def _gather(self, op: str, targets: list[Worker], **fields: Any
                      ) -> tuple[dict[int, dict[str, Any]], list[TritonError]]:
        """``op`` in every worker of ``targets`` at once: the replies by worker index, and the
        errors in the order they came."""
        replies: dict[int, dict[str, Any]] = {}
        errors: list[TritonError] = []

        async def one(worker: Worker) -> None:
            try:
                replies[worker.index] = await worker.call(op, **fields)
            except TritonError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for worker in targets:
                nursery.start_soon(one, worker)
        return replies, errors


    async def _all(self, op: str, targets: list[Worker] | None = None, **fields: Any) -> list[dict[str, Any]]:
        """``op`` in every worker of ``targets`` (default: all live), at once; their replies in
        worker order. Raises the first error (in time) once all have answered."""
        targets = self.live() if targets is None else targets
        replies, errors = await self._gather(op, targets, **fields)
        if errors:
            raise errors[0]
        return [replies[w.index] for w in targets]


    async def transact(self, kind: str, name: str, config: str | None = None, files: Any = None,
                        targets: list[Worker] | None = None) -> None:
        """Load ``name`` in every worker of ``targets`` (default: all live), in two phases (see
        the module); a model placed on one worker (trident.cluster.placement) is loaded there
        first, and the others load the config it ended with. Raises the first failure; nothing
        changed anywhere then."""
        targets = self.live() if targets is None else targets
        if not targets:
            raise unavailable("no worker is running")
        self._txid += 1
        txid = self._txid
        prepared: list[Worker] = []
        failures: list[TritonError] = []

        async def prepare(worker: Worker, **fields: Any) -> dict[str, Any] | None:
            try:
                reply = await worker.call("prepare", txid=txid, name=name, **fields)
            except TritonError as e:
                if e.code is Code.UNAVAILABLE and worker.channel.closed:
                    e = unavailable(f"load of '{name}' abandoned: worker {worker.index} exited during the load")
                failures.append(e)
                return None
            prepared.append(worker)
            return reply

        async def prepare_all(workers: list[Worker], **fields: Any) -> None:
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    nursery.start_soon(partial(prepare, worker, **fields))

        try:
            owner = (await targets[0].call("placement", name=name, config=config))["owner"]
        except TritonError as e:
            failures.append(e)
            owner = None
        if failures:
            pass
        elif owner is None:
            await prepare_all(targets, kind=kind, config=config, files=files)
        else:
            placed = self.workers[owner]
            final: dict[str, Any] | None = None
            if placed is None or not placed.attached.is_set():
                failures.append(unavailable(f"model '{name}' is placed on worker {owner}, which is not running"))
            elif placed in targets:
                final = await prepare(placed, kind=kind, config=config, files=files)
            else:
                try:
                    final = await placed.call("config_of", name=name)
                except TritonError as e:
                    failures.append(e)
            if final is not None:
                others = [w for w in targets if w is not placed]
                await prepare_all(others, kind="remote", config=final["config"], versions=final["versions"],
                                  owner=owner)
        decision = "commit" if not failures else "abort"
        reason = "" if not failures else failures[0].message
        commit_errors: list[TritonError] = []

        async def decide(worker: Worker) -> None:
            try:
                await worker.call(decision, txid=txid, reason=reason)
            except TritonError as e:
                commit_errors.append(e)

        async with trio.open_nursery() as nursery:
            for worker in prepared:
                nursery.start_soon(decide, worker)
        if failures:
            raise failures[0]
        if commit_errors:
            log.error("load of '%s': a worker failed to swap the loaded versions in: %s", name,
                      commit_errors[0].message)
            raise commit_errors[0]


    async def _remember_failure(self, name: str) -> None:
        """After a failed load: a model that serves nowhere now is recorded as failed, so that a
        worker started anew says so too (not ready, the same reason in the index)."""
        live = self.in_step()
        if not live:
            return
        try:
            rows = (await live[0].call("index"))["index"]
        except TritonError:
            return
        mine = [row for row in rows if row[0] == name]
        if mine and not any(row[2] == "READY" for row in mine) and mine[0][2] == "UNAVAILABLE":
            self.desired.set_model(name, ("failed", mine[0][3]))


    async def _broadcast(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """A setting or registration in every worker; the first worker's result. A registration
        that fails anywhere is undone where it succeeded. Raises the first error."""
        async with self.lock:
            targets = self.live()
            replies, errors = await self._gather("broadcast_local", targets, bop=op, fields=fields)
            if errors:
                if op.startswith("shm_register"):
                    undo = {"kind": "system" if op == "shm_register_system" else "cuda", "name": fields["name"]}
                    done = [w for w in targets if w.index in replies]
                    try:
                        await self._all("broadcast_local", done, bop="shm_unregister", fields=undo)
                    except TritonError as e:
                        log.error("undoing a failed registration of region '%s': %s", fields["name"], e.message)
                raise errors[0]
            self._remember(op, fields)
            return dict(replies[min(replies)]["result"]) if replies else {}


    def _remember(self, op: str, fields: dict[str, Any]) -> None:
        d = self.desired
        if op.startswith("shm_register"):
            d.regions[fields["name"]] = (op, fields)
        elif op == "shm_unregister":
            kind_op = "shm_register_system" if fields["kind"] == "system" else "shm_register_cuda"
            for name in [n for n, (o, _) in d.regions.items() if o == kind_op and fields["name"] in ("", n)]:
                del d.regions[name]
        elif op == "log_settings":
            d.log_settings.update({k: v for k, v in fields["settings"].items() if v is not None})
        elif op == "trace_settings":
            d.trace_settings.setdefault(fields["model"], {}).update(fields["settings"])


    async def statistics(self, name: str, version: str) -> list[ModelStatistics]:
        """Every worker's statistics, summed (see trident.cluster.merge). Raises the workers'
        error when none has the model (the same in every worker)."""
        replies = await self._all("stats_local", name=name, version=version)
        answered = [[stats_from_wire(s) for s in r["stats"]] for r in replies if "stats" in r]
        if not answered:
            problem = next((r["error_local"] for r in replies if "error_local" in r), None)
            if problem is not None:
                raise TritonError(Code(problem["code"]), problem["message"])
            raise unavailable("no worker is running")
        return merge_statistics(answered)


    async def metrics_text(self) -> str:
        """The workers' model and custom metrics, merged (a worker that does not answer within
        5 s is left out of this scrape)."""
        texts: dict[int, str] = {}

        async def one(worker: Worker) -> None:
            with trio.move_on_after(5):
                try:
                    texts[worker.index] = (await worker.call("metrics_local"))["text"]
                except TritonError as e:
                    log.debug("metrics of worker %d: %s", worker.index, e.message)

        async with trio.open_nursery() as nursery:
            for worker in self.live():
                nursery.start_soon(one, worker)
        return merge_expositions([texts[i] for i in sorted(texts)])


    async def startup_load(self) -> list[list[Any]]:
        """Load the start-up set in every worker (as a single server loads it); returns worker
        0's repository index. A model that fails is logged (its reason stays in the index)."""
        plans = await self._all("startup_plan")
        phases = plans[0]["phases"]
        if any(p["phases"] != phases for p in plans[1:]):
            log.warning("the workers see different model repositories; loading what worker 0 sees")
        limiter = trio.CapacityLimiter(max(1, self.options.model_load_thread_count))

        async def load_one(name: str) -> None:
            async with limiter:
                try:
                    await self.transact("startup", name)
                except TritonError as e:
                    if not e.message.startswith("load of"):  # each worker's own line says it
                        log.error("%s", e.message)

        for phase in phases:
            async with trio.open_nursery() as nursery:
                for name in phase:
                    nursery.start_soon(load_one, name)
        first = self.live()[0]
        for table in (await first.call("tables"))["tables"]:
            log.info("\n%s\n", table)
        return list((await first.call("index"))["index"])


    async def bring_in_step(self, worker: Worker) -> bool:
        """Apply the desired state to a worker started anew; True once it has it all (False:
        it is gone, or failed to take it; logged)."""
        async with self.lock:
            if worker.channel.closed:
                return False
            try:
                phases = (await worker.call("startup_plan"))["phases"]
                touched = self.desired.models
                for name in [n for phase in phases for n in phase if n not in touched]:
                    try:
                        await self.transact("startup", name, targets=[worker])
                    except TritonError as e:
                        log.error("worker %d: %s", worker.index, e.message)
                for name, state in list(touched.items()):
                    try:
                        if state[0] == "api":
                            await self.transact("api", name, state[1], state[2], targets=[worker])
                        elif state[0] == "failed":
                            await worker.call("mark_failed", name=name, reason=state[1])
                        else:
                            await worker.call("unload", name=name, dependents=False)
                    except TritonError as e:
                        log.error("worker %d: %s", worker.index, e.message)
                for op, fields in list(self.desired.regions.values()):
                    await worker.call("broadcast_local", bop=op, fields=fields)
                if self.desired.log_settings:
                    await worker.call("broadcast_local", bop="log_settings",
                                      fields={"settings": self.desired.log_settings})
                for model, settings in self.desired.trace_settings.items():
                    await worker.call("broadcast_local", bop="trace_settings",
                                      fields={"model": model, "settings": settings})
            except TritonError as e:
                log.error("worker %d could not be brought in step: %s", worker.index, e.message)
                return False
            worker.in_step = True
            return True


    async def serve_polling(self) -> None:
        """``--model-control-mode poll``: rescan every ``repository_poll_secs`` (worker 0 finds
        the changes; every worker applies them)."""
        while True:
            await trio.sleep(self.options.repository_poll_secs)
            async with self.lock:
                live = self.in_step()
                if not live:
                    continue
                try:
                    plan = await live[0].call("poll_plan")
                except TritonError as e:
                    log.error("polling the model repository: %s", e.message)
                    continue
                for name in plan["changed"]:
                    try:
                        await self.transact("poll", name)
                    except TritonError as e:
                        if not e.message.startswith("load of"):
                            log.error("%s", e.message)
                for name in plan["removed"]:
                    try:
                        await self._all("unload", name=name, poll=True)
                    except TritonError as e:
                        log.error("%s", e.message)
