"""``trident serve --workers N``: N worker processes that behave as one Triton server.

The supervisor is a trio program that serves no inference itself. It owns:

* the listening ports (:mod:`trident.cluster.sockets`): HTTP, gRPC and the OpenAI port are
  handed down to the workers, which accept and serve their connections; the metrics port is
  the supervisor's own, answering one exposition merged from every worker's
  (:mod:`trident.cluster.merge`) with the host gauges it samples itself;
* the workers (:mod:`trident.cluster.worker`), each under a task of its nursery: one that
  exits while serving is started again after a backoff (1 s, doubling to 30 s; back to 1 s once
  one has served for a minute), while the others keep serving; its connections end with it,
  and no other worker's request is touched;
* the control plane: every model load (the load API, ``--load-model`` and the start-up set,
  polling), unload, shared-memory registration and trace or log setting any worker receives
  comes here and is applied to every worker; statistics are summed over them. A load runs in
  two phases: every worker loads the model up to the point where its new versions would
  replace what serves, and only when all got there do all of them swap; on the first failure
  the others drop what they loaded, so no worker is left with a half-loaded model, and the
  caller gets that failure. What was applied is kept (the desired state) and applied again to
  a worker that is started anew, before it serves a connection.

Readiness (``/v2/health/ready``) is every worker's: true once all are up and in step. SIGTERM
or SIGINT drains every worker as a single process drains (``--exit-timeout-secs``), then the
supervisor exits 0. A start-up that fails (a port in use, a repository that cannot be served,
a worker that exits before serving) is one error line and exit status 1.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from trident.cluster.channel import ControlChannel, unknown_op
from trident.cluster.cpus import affinity_cpus, available_cpus
from trident.cluster.link import CONTROL_FD_ENV, options_to_wire
from trident.cluster.merge import merge_expositions, merge_statistics, stats_from_wire, stats_to_wire
from trident.cluster.sockets import Port
from trident.errors import Code, TritonError, unavailable
from trident.listening import LISTEN_FDS_ENV
from trident.options import ServerOptions
from trident.types import ModelStatistics

log = logging.getLogger("trident.cluster")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0  # a worker that served this long restarts with the first backoff again
STOP_GRACE_S = 10.0  # past --exit-timeout-secs, a worker still running is killed


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


class StartupFailed(Exception):
    """The cluster cannot start: one line for the log."""


def _exit_text(status: int) -> str:
    if status < 0:
        try:
            return f"killed by signal {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


class Supervisor:
    """The supervisor of ``count`` workers serving ``options`` (see the module)."""

    def __init__(self, options: ServerOptions, count: int, ports: list[Port], usable_cpus: int = 0) -> None:
        self.options = options
        self.count = count
        self.ports = ports
        self.workers: list[Worker | None] = [None] * count
        self.desired = Desired()
        self.control = trio.Lock()  # one control operation at a time, and none while a worker is brought in step
        self.started = False  # the start-up load is over
        self.stopping = False
        self.ready = False
        self.startup_failure: str | None = None
        self.startup_event = trio.Event()  # every worker attached (or start-up failed)
        self.startup_scope = trio.CancelScope()  # cancelled when the start-up fails
        self._txid = 0
        self._nursery: trio.Nursery | None = None
        # what a worker is told: serve these options as one worker, on the bound ports
        self.worker_options = ServerOptions(**{**options_to_wire(options), "workers": 1})
        if options.busy_poll_us and usable_cpus and count >= usable_cpus:
            # a worker spinning for its next request spins on a CPU another worker needs
            self.worker_options.busy_poll_us = 0
            log.info("--busy-poll-us %d is not used: %d workers share %d CPU(s), and a worker polling for its "
                     "next request would hold a CPU another one needs", options.busy_poll_us, count, usable_cpus)
        for port in ports:
            if port.name == "HTTP":
                self.worker_options.http_port = port.port
            elif port.name == "GRPC":
                self.worker_options.grpc_port = port.port
            elif port.name == "OpenAI":
                self.worker_options.openai_port = port.port

    # ---- workers ------------------------------------------------------------------------------

    def live(self) -> list[Worker]:
        """The workers attached to the control plane (serving, or being brought in step)."""
        return [w for w in self.workers if w is not None and w.attached.is_set()]

    def in_step(self) -> list[Worker]:
        return [w for w in self.live() if w.in_step]

    async def _spawn(self, index: int, restart: bool) -> Worker:
        """Start worker ``index`` with its sockets and a control channel. Raises OSError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handed: list[socket.socket] = []
        owned: list[socket.socket] = []  # per-worker sockets: closed here once the worker has them
        try:
            for port in self.ports:
                socks = port.for_worker()
                handed += socks
                if port.per_worker:
                    owned += socks
            fds = [s.fileno() for s in handed]
            env = {**os.environ, LISTEN_FDS_ENV: ",".join(map(str, fds)), CONTROL_FD_ENV: str(theirs.fileno())}
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "trident.cluster.worker"], pass_fds=[*fds, theirs.fileno()], env=env,
                start_new_session=True)  # signals from a terminal reach the supervisor only
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for sock in owned:
                sock.close()
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        return Worker(index, process, ControlChannel(stream, f"worker {index}"), restart,
                      started_at=trio.current_time())

    async def run_slot(self, index: int) -> None:
        """Keep worker ``index`` running until the supervisor stops (see the module)."""
        backoff = BACKOFF_FIRST_S
        restart = False
        while True:
            try:
                worker = await self._spawn(index, restart)
            except OSError as e:
                if not self.started:
                    self._fail_startup(f"cannot start worker {index}: {e}")
                    return
                log.error("cannot start worker %d: %s; trying again in %.0f s", index, e, backoff)
                await trio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            self.workers[index] = worker
            log.info("worker %d started (pid %d)", index, worker.process.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.channel.serve, partial(self._handle, worker))
                status = await worker.process.wait()
                nursery.cancel_scope.cancel()
            self.workers[index] = None
            await self._update_readiness()
            if self.stopping:
                return
            if not self.started:
                self._fail_startup(f"worker {index} (pid {worker.process.pid}) exited during start-up "
                                   f"({_exit_text(status)})")
                return
            served = trio.current_time() - worker.started_at
            if served >= STABLE_AFTER_S:
                backoff = BACKOFF_FIRST_S
            log.error("worker %d (pid %d) exited (%s) after %.1f s; the others keep serving; starting it again "
                      "in %.0f s", index, worker.process.pid, _exit_text(status), served, backoff)
            await trio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)
            restart = True

    def _fail_startup(self, why: str) -> None:
        """The start-up cannot go on: ``why`` is its one error line."""
        if self.startup_failure is None:
            self.startup_failure = why
        self.startup_event.set()
        self.startup_scope.cancel()

    async def _handle(self, worker: Worker, op: str, msg: dict[str, Any]) -> dict[str, Any] | None:
        """A worker's request (its server's control plane)."""
        if op == "hello":
            return {"options": options_to_wire(self.worker_options), "index": worker.index, "count": self.count,
                    "restart": worker.restart, "cluster": str(os.getpid())}
        if op == "attach":
            worker.attached.set()
            if worker.restart:
                assert self._nursery is not None
                self._nursery.start_soon(self._bring_in_step, worker)
            elif all(w is not None and w.attached.is_set() for w in self.workers):
                self.startup_event.set()
            return None
        if op == "load":
            files = msg.get("files")
            async with self.control:
                try:
                    await self._transact("api", msg["name"], msg.get("config"), files)
                except TritonError:
                    await self._remember_failure(msg["name"])
                    raise
                self.desired.set_model(msg["name"], ("api", msg.get("config"), files))
            return None
        if op == "unload":
            async with self.control:
                await self._all("unload", name=msg["name"], dependents=bool(msg.get("dependents")))
                self.desired.set_model(msg["name"], ("unloaded",))
            return None
        if op == "statistics":
            return {"stats": [stats_to_wire(s) for s in await self.statistics(str(msg["name"]),
                                                                               str(msg["version"]))]}
        if op == "broadcast":
            return {"result": await self._broadcast(str(msg["bop"]), dict(msg["fields"]))}
        raise unknown_op(op)

    # ---- the control plane --------------------------------------------------------------------

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

    async def _transact(self, kind: str, name: str, config: str | None = None, files: Any = None,
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
        async with self.control:
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

    async def _update_readiness(self) -> None:
        """Tell every worker whether all are ready (their readiness is the conjunction)."""
        ready = (self.started and not self.stopping and len(self.in_step()) == self.count)
        if ready == self.ready:
            return
        self.ready = ready
        async with trio.open_nursery() as nursery:
            for worker in self.live():
                nursery.start_soon(self._tell_ready, worker, ready)

    async def _tell_ready(self, worker: Worker, ready: bool) -> None:
        try:
            await worker.call("set_ready", ready=ready and worker.in_step)
        except TritonError:
            pass  # gone: its successor is told when it is in step

    # ---- start-up, step, polling, stop --------------------------------------------------------

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
                    await self._transact("startup", name)
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

    async def _bring_in_step(self, worker: Worker) -> None:
        """Apply the desired state to a worker started anew, then let it serve."""
        async with self.control:
            if worker.channel.closed:
                return
            try:
                phases = (await worker.call("startup_plan"))["phases"]
                touched = self.desired.models
                for name in [n for phase in phases for n in phase if n not in touched]:
                    try:
                        await self._transact("startup", name, targets=[worker])
                    except TritonError as e:
                        log.error("worker %d: %s", worker.index, e.message)
                for name, state in list(touched.items()):
                    try:
                        if state[0] == "api":
                            await self._transact("api", name, state[1], state[2], targets=[worker])
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
                return
            worker.in_step = True
            try:
                await worker.call("in_step")  # it starts its front ends now
            except TritonError:
                return
            log.info("worker %d is in step with the others and serves", worker.index)
            if self.ready:
                await self._tell_ready(worker, True)
            else:
                await self._update_readiness()

    async def serve_polling(self) -> None:
        """``--model-control-mode poll``: rescan every ``repository_poll_secs`` (worker 0 finds
        the changes; every worker applies them)."""
        while True:
            await trio.sleep(self.options.repository_poll_secs)
            async with self.control:
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
                        await self._transact("poll", name)
                    except TritonError as e:
                        if not e.message.startswith("load of"):
                            log.error("%s", e.message)
                for name in plan["removed"]:
                    try:
                        await self._all("unload", name=name, poll=True)
                    except TritonError as e:
                        log.error("%s", e.message)

    async def stop(self) -> None:
        """Drain every worker (as a single server drains on SIGTERM) and wait for them to exit;
        a worker still running ``--exit-timeout-secs`` + 10 s later is killed."""
        self.stopping = True
        self.ready = False
        running = [w for w in self.workers if w is not None]

        async def drain(worker: Worker) -> None:
            try:
                await worker.call("drain")
            except TritonError:
                pass
            with trio.move_on_after(self.options.exit_timeout_secs + STOP_GRACE_S):
                await worker.process.wait()
                return
            log.error("worker %d did not exit in time: killing it", worker.index)
            worker.process.kill()
            await worker.process.wait()

        async with trio.open_nursery() as nursery:
            for worker in running:
                nursery.start_soon(drain, worker)


def _bind_ports(options: ServerOptions) -> list[Port]:
    """The listening ports the workers share. Raises StartupFailed naming a port that cannot
    be bound."""
    wanted: list[tuple[str, str, str, int, bool]] = []
    if options.allow_http:
        wanted.append(("HTTP", "HTTP service", options.http_address, options.http_port, options.reuse_http_port))
    if options.allow_grpc:
        wanted.append(("GRPC", "GRPC service", options.grpc_address, options.grpc_port, options.reuse_grpc_port))
    if options.openai_port is not None:
        wanted.append(("OpenAI", "OpenAI frontend", options.http_address, options.openai_port,
                       options.reuse_http_port))
    ports: list[Port] = []
    try:
        for name, service, host, number, reuse in wanted:
            port = Port(name, host, number, options.worker_sockets, reuse)
            try:
                port.open()
            except OSError as e:
                why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
                raise StartupFailed(f"failed to start {service}: address {host or '0.0.0.0'}:{number} {why}") from None
            ports.append(port)
    except BaseException:
        for port in ports:
            port.close()
        raise
    return ports


async def _serve_metrics(supervisor: Supervisor, *, task_status: trio.TaskStatus[int]) -> None:
    from trident.observability.metrics import (
        host_collectors,
        host_exposition,
        make_exposition_app,
        serve_exposition,
    )

    options = supervisor.options
    collectors = host_collectors(options)

    async def render() -> bytes:
        return host_exposition(collectors) + (await supervisor.metrics_text()).encode()

    await serve_exposition(make_exposition_app(render), collectors, options.metrics_interval_ms,
                           host=options.metrics_address, port=options.metrics_port, task_status=task_status)


async def _watch_signals(stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            log.info("signal (%d) received, waiting for in-flight inferences to complete", signum)
            stop.set()
            return


async def serve_supervisor(options: ServerOptions) -> int:
    """Serve ``options`` from ``options.workers`` processes (0: one per usable CPU) until
    SIGINT/SIGTERM; returns the exit status (see the module)."""
    from trident.startup import check_start, start_logging

    if start_logging(options) is None or not check_start(options):
        return 1
    usable = available_cpus()
    count = options.workers or usable
    if options.workers and count > affinity_cpus():
        log.warning("--workers %d is more than the %d CPU(s) this process may use: the workers will share them",
                    count, affinity_cpus())
    log.info("serving from %d worker processes (%s sockets; %d CPU(s) usable here)", count,
             options.worker_sockets, usable)
    stop = trio.Event()
    try:
        ports = _bind_ports(options)
    except StartupFailed as e:
        log.error("%s", e)
        return 1
    supervisor = Supervisor(options, count, ports, usable)
    status = 0
    try:
        async with trio.open_nursery() as nursery:
            supervisor._nursery = nursery
            await nursery.start(_watch_signals, stop)
            for index in range(count):
                nursery.start_soon(supervisor.run_slot, index)
            status = await _run(supervisor, nursery, stop)
            await supervisor.stop()
            nursery.cancel_scope.cancel()
    finally:
        for port in ports:
            port.close()
    if status == 0:
        log.info("server stopped")
    return status


async def _run(supervisor: Supervisor, nursery: trio.Nursery, stop: trio.Event) -> int:
    """Start-up, then serve until ``stop``; the exit status (1: the start-up failed)."""
    options = supervisor.options
    with supervisor.startup_scope as startup:
        nursery.start_soon(_cancel_on, stop, startup)
        await supervisor.startup_event.wait()
        if supervisor.startup_failure is not None:
            log.error("%s", supervisor.startup_failure)
            return 1
        for port in supervisor.ports:
            service = {"HTTP": "HTTPService", "GRPC": "GRPCInferenceService", "OpenAI": "OpenAIFrontend"}[port.name]
            log.info("Started %s at %s:%d", service, port.host, port.port)
        if options.allow_metrics:
            try:
                bound = await nursery.start(_serve_metrics, supervisor)
            except OSError as e:
                why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
                log.error("failed to start Metrics service: address %s:%d %s", options.metrics_address,
                          options.metrics_port, why)
                return 1
            log.info("Started Metrics Service at %s:%s", options.metrics_address, bound)
        index = await supervisor.startup_load()
        failed = [row for row in index if row[2] == "UNAVAILABLE" and row[3] != "unloaded"]
        log.info("model loading complete: %d ready, %d unavailable",
                 sum(row[2] == "READY" for row in index), len(failed))
        if failed and options.exit_on_error:
            log.error("exiting: --exit-on-error is set and a model failed to load")
            return 1
        supervisor.started = True
        for worker in supervisor.live():
            worker.in_step = True
        await supervisor._update_readiness()
        if options.model_control_mode == "poll":
            nursery.start_soon(supervisor.serve_polling)
    if supervisor.startup_failure is not None:
        log.error("%s", supervisor.startup_failure)
        return 1
    await stop.wait()
    return 0


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()

