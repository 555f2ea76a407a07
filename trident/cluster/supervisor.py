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
* the control plane (:mod:`trident.cluster.control`): every model load (the load API,
  ``--load-model`` and the start-up set, polling), unload, shared-memory registration and trace
  or log setting any worker receives comes here and is applied to every worker, loads in two
  phases (no worker is left with a half-loaded model); statistics are summed over them. What
  was applied is applied again to a worker that is started anew, before it serves a connection.

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
from functools import partial
from typing import Any

import trio

from trident.cluster.channel import ControlChannel
from trident.cluster.control import ControlPlane, Worker
from trident.cluster.cpus import affinity_cpus, available_cpus
from trident.cluster.link import CONTROL_FD_ENV, options_to_wire
from trident.cluster.sockets import Port
from trident.errors import TritonError
from trident.listening import LISTEN_FDS_ENV
from trident.options import ServerOptions

log = logging.getLogger("trident.cluster")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0  # a worker that served this long restarts with the first backoff again
STOP_GRACE_S = 10.0  # past --exit-timeout-secs, a worker still running is killed


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
        self.control = ControlPlane(options, self.workers)
        self.started = False  # the start-up load is over
        self.stopping = False
        self.ready = False
        self.startup_failure: str | None = None
        self.startup_event = trio.Event()  # every worker attached (or start-up failed)
        self.startup_scope = trio.CancelScope()  # cancelled when the start-up fails
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
        return self.control.live()

    def in_step(self) -> list[Worker]:
        return self.control.in_step()

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
        return await self.control.handle(op, msg)

    async def _bring_in_step(self, worker: Worker) -> None:
        """Give a worker started anew what the others have, then let it serve."""
        if not await self.control.bring_in_step(worker):
            return
        try:
            await worker.call("in_step")  # it starts its front ends now
        except TritonError:
            return
        log.info("worker %d is in step with the others and serves", worker.index)
        if self.ready:
            await self._tell_ready(worker, True)
        else:
            await self._update_readiness()

    # ---- readiness ----------------------------------------------------------------------------

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
        return host_exposition(collectors) + (await supervisor.control.metrics_text()).encode()

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
        index = await supervisor.control.startup_load()
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
            nursery.start_soon(supervisor.control.serve_polling)
    if supervisor.startup_failure is not None:
        log.error("%s", supervisor.startup_failure)
        return 1
    await stop.wait()
    return 0


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()

