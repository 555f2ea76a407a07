"""The server side of a process-isolated Python model instance (see the package docstring).

Threads, never the event loop: ``execute`` / ``is_ready`` / ``finalize`` run in the worker
threads trident gives every instance and block on the model process's answers; one reader
thread per process delivers decoupled responses, answers the process's calls (BLS and model
management each in a thread of their own) and notices when the process dies; one watcher
thread per instance tells the process which of its requests were cancelled, and every
:data:`REGION_RELEASE_SECS` which client shared-memory regions it may unmap (those unregistered
since its last message; see :mod:`.channel`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from trident.backends.base import LoadContext, ModelInstance, OwnedThread
from trident.backends.metrics import Family, Series, custom_metrics_for
from trident.backends.python import pb_utils
from trident.backends.python._execution import ExecutionOptions, InstanceIdentity
from trident.backends.python.isolated import channel as wire
from trident.errors import Code, TritonError, internal
from trident.observability.logs import SERVING_KEY, ModelCall
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.backends.python.isolated")
model_log = logging.getLogger("trident.model")

READY_TIMEOUT_SECS = 5.0  # Triton's is_ready timeout
FINALIZE_TIMEOUT_SECS = 30.0
REGION_RELEASE_SECS = 1.0  # how soon an idle model process unmaps a client region unregistered meanwhile
_CHILD = "trident.backends.python.isolated.child"


class _Waiter:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None

    def set(self, value: Any) -> None:
        if not self.event.is_set():
            self.value = value
            self.event.set()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Process:
    """One running model process and its connection."""

    def __init__(self, popen: subprocess.Popen[bytes], channel: wire.Channel) -> None:
        self.popen = popen
        self.channel = channel
        self.alive = True
        self.started = False  # initialize succeeded: a later exit is a crash worth a restart
        self.exit_message = ""  # set once the process is gone
        self.waiters: dict[Any, _Waiter] = {}  # batch ids, call ids, "init", "finalized"...
        self.bls: dict[int, Any] = {}  # call id -> BlsCall
        self.families: dict[int, Family] = {}
        self.series: dict[int, tuple[Family, Series]] = {}
        self.reader: OwnedThread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


class _Finished(NamedTuple):
    """A request a model process logged for that is no longer in flight here: its id only."""

    id: str
    trace: Any = None


def _trace_context(trace: Any) -> tuple[str, str] | None:
    """(traceparent, tracestate) of a request's trace or trace context, None without one."""
    header = getattr(trace, "traceparent", None)
    value = header() if callable(header) else None
    if not value:
        return None
    state = getattr(trace, "tracestate", "") or getattr(getattr(trace, "context", None), "tracestate", "")
    return value, str(state or "")


def relay_log(message: tuple[Any, ...], model: tuple[str, str] | None = None,
              requests: Callable[[list[tuple[Any, str]]], list[Any]] | None = None) -> None:
    """Write a model process's log line (``("log", level, message[, (path, line, function),
    requests, exception text])``, see the child's ``_ForwardLogs``) through the ``trident.model``
    logger: with the model's source file and line, and naming ``model`` and the requests
    (``requests`` maps the child's (rid, id) pairs to the server's requests)."""
    level, text = int(message[1]), str(message[2])
    if not model_log.isEnabledFor(level):
        return
    where = message[3] if len(message) > 3 and message[3] else None
    sent = message[4] if len(message) > 4 else None
    extra: dict[str, Any] = {}
    if sent is not None and model is not None:
        found = requests(sent) if requests is not None else [_Finished(rid_id[1]) for rid_id in sent]
        extra[SERVING_KEY] = ModelCall(model[0], model[1], found)
    if where is None:
        model_log.log(level, "%s", text, extra=extra)
        return
    record = model_log.makeRecord(model_log.name, level, str(where[0]), int(where[1]), "%s", (text,), None,
                                  str(where[2]), extra)
    if len(message) > 5 and message[5]:
        record.exc_text = str(message[5])
    model_log.handle(record)


def spawn(options: ExecutionOptions) -> _Process:
    """Start a model process (it waits for its first message). Raises OSError."""
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    to_child = wire.create_memfd("trident-ring-in", wire.RING_HEADER + options.shm_bytes)
    to_parent = wire.create_memfd("trident-ring-out", wire.RING_HEADER + options.shm_bytes)
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", _CHILD, str(child_sock.fileno()), str(to_child), str(to_parent),
             str(options.shm_bytes)],
            pass_fds=(child_sock.fileno(), to_child, to_parent), stdin=subprocess.DEVNULL,
        )
        channel = wire.Channel(parent_sock, out_ring=wire.Ring(to_child, options.shm_bytes),
                               in_ring=wire.Ring(to_parent, options.shm_bytes))
    finally:
        child_sock.close()
        os.close(to_child)
        os.close(to_parent)
    return _Process(popen, channel)


def auto_complete_in_process(model_file: Path, name: str, current: dict[str, Any]) -> dict[str, Any] | None:
    """Run a model's ``auto_complete_config`` in a throwaway model process (as Triton does).

    Raises TritonError(INTERNAL) when it fails or the process dies.
    """
    process = spawn(ExecutionOptions(mode="process", shm_bytes=1 << 16))
    try:
        process.channel.send(("auto_complete", str(model_file), name, current))
        got = process.channel.recv()
        while got is not None and got[0][0] != "completed":  # e.g. forwarded log lines
            if got[0][0] == "log":
                relay_log(got[0])
            got = process.channel.recv()
        if got is None:
            code = process.popen.wait(10)
            raise internal(f"auto_complete_config of model '{name}': the model process {_describe_exit(code)}")
        _, ok, value = got[0]
        if not ok:
            raise internal(value)
        return value
    finally:
        process.channel.close()
        _stop(process)


def _stop(process: _Process, timeout: float = 5.0) -> None:
    try:
        process.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        process.popen.kill()
        process.popen.wait()


class IsolatedInstance(ModelInstance):
    """A Python model instance in a process of its own (restarted when it dies)."""

    def __init__(self, ctx: LoadContext, identity: InstanceIdentity, model_file: Path,
                 args: dict[str, str], options: ExecutionOptions) -> None:
        """Start the process and run ``initialize``. Blocking (a worker thread).

        Raises TritonError(INTERNAL) when the process cannot start or ``initialize`` fails.
        """
        self.identity = identity
        self.decoupled = identity.decoupled
        self._model_file = model_file
        self._args = args
        self._options = options
        self._server = ctx.server
        self._threads = ctx.threads  # the owner of this instance's threads (its model version)
        self._runtime: Any = None
        if ctx.server is not None:
            from trident.backends.python._runtime import InProcessRuntime, current_token

            token = current_token()
            if token is not None:
                self._runtime = InProcessRuntime(ctx.server, token, ctx.threads)
        self._metrics = custom_metrics_for(ctx.server)
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # guards _process, _inflight, _closing
        self._start_lock = threading.Lock()
        self._process: _Process | None = None
        self._inflight: dict[int, InferenceRequest] = {}  # rid -> request (decoupled: until final)
        self._owner: dict[int, _Process] = {}  # rid -> the process working on it
        self._cancelled: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # rids, None: stop
        self._executing: set[int] = set()
        self._closing = False
        self.restarts = 0
        self._start_process()
        self._watcher = self._threads.start(self._watch_cancellations, name="trident-cancel-watch")

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.alive else None

    def _start_thread(self, fn: Any, *args: Any, name: str) -> None:
        """A helper thread of this instance (its owner is the model version); when the owner
        takes no more threads (the version finished unloading) the work is dropped, logged."""
        try:
            self._threads.start(fn, *args, name=name)
        except RuntimeError as e:
            log.warning("model instance '%s': %s", self.identity.instance_name, e)

    # ---- the process -----------------------------------------------------------------------

    def _start_process(self) -> _Process:
        with self._start_lock:
            current = self._process
            if current is not None and current.alive:
                return current
            if self._closing:
                raise internal(f"model instance '{self.identity.instance_name}' is unloading")
            try:
                process = spawn(self._options)
            except OSError as e:
                raise internal(f"cannot start a process for model '{self.identity.model_name}': {e}") from e
            waiter = process.waiters["init"] = _Waiter()
            process.reader = self._threads.start(self._read, process,
                                                 name=f"trident-model-{self.identity.instance_name}")
            try:
                level = model_log.getEffectiveLevel()
                process.channel.send(("init", str(self._model_file), asdict(self.identity), self._args, level))
            except wire.ChannelClosed:
                pass
            waiter.event.wait()
            ok, detail = waiter.value
            if not ok:
                process.channel.close()
                _stop(process)
                raise internal(detail)
            process.started = True
            with self._lock:
                self._process = process
            log.info("model '%s' instance '%s' runs in process %d", self.identity.model_name,
                     self.identity.instance_name, process.pid)
            return process

    def _restart_after_crash(self) -> None:
        try:
            self._start_process()
            self.restarts += 1
        except TritonError as e:
            log.error("restarting model instance '%s' failed: %s", self.identity.instance_name, e.message)

    def _on_exit(self, process: _Process) -> None:
        """The process is gone: fail what it was working on, restart it (reader thread)."""
        with self._lock:
            process.alive = False
            closing = self._closing
        process.channel.close()
        try:
            code = process.popen.wait(5)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            code = process.popen.wait()
        message = (f"model instance '{self.identity.instance_name}' process (pid {process.pid}) "
                   f"{_describe_exit(code)}")
        process.exit_message = message
        for key, waiter in list(process.waiters.items()):
            if key == "init":
                waiter.set((False, message))
            elif isinstance(key, int):  # a batch
                waiter.set(("died", message, []))
            else:  # is_ready, finalize
                waiter.set(None)
        for call in list(process.bls.values()):
            call.cancel()
        for family, series in process.series.values():
            family.release_series(series)
        for family in process.families.values():
            self._metrics.release_family(family)
        process.series.clear()
        process.families.clear()
        if closing:
            return
        self._fail_orphans(process)
        if process.started:
            log.error("%s; restarting it", message)
            self._start_thread(self._restart_after_crash, name="trident-model-restart")

    def _fail_orphans(self, process: _Process) -> None:
        """Fail the decoupled requests a dead process still owed responses to."""
        with self._lock:
            orphans = [(rid, r) for rid, r in self._inflight.items()
                       if rid not in self._executing and self._owner.get(rid) is process]
            for rid, _ in orphans:
                self._inflight.pop(rid, None)
                self._owner.pop(rid, None)
        for _, request in orphans:
            self._fail(request, internal(f"{process.exit_message}; the request was lost"))

    @staticmethod
    def _fail(request: InferenceRequest, error: TritonError) -> None:
        responder = request.responder
        if responder is not None and not responder.complete:
            with contextlib.suppress(TritonError):
                responder.send(InferenceResponse(error=error), final=True)

    # ---- reading (one thread per process) ----------------------------------------------------

    def _read(self, process: _Process) -> None:
        try:
            while True:
                try:
                    got = process.channel.recv()
                except wire.UnreadableTensors as e:  # the model process sends no region references
                    self._unreadable(process, e.message, e.reason)
                    continue
                if got is None:
                    break
                try:
                    self._dispatch(process, *got)
                except Exception:
                    log.exception("model process message handling failed")
        finally:
            self._on_exit(process)

    def _unreadable(self, process: _Process, message: Any, reason: str) -> None:
        kind = message[0] if isinstance(message, tuple) and message else None
        if kind == "executed":
            waiter = process.waiters.pop(message[1], None)
            if waiter is not None:
                waiter.set(("error", ("INTERNAL", reason), []))
        elif kind == "response":
            self._deliver(message[1], InferenceResponse(error=internal(reason)), message[3], [])
        else:
            log.error("a '%s' message from model process %d was dropped: %s", kind, process.pid, reason)

    def _dispatch(self, process: _Process, message: Any, arrays: list[np.ndarray]) -> None:
        kind = message[0]
        if kind == "executed":
            waiter = process.waiters.pop(message[1], None)
            if waiter is not None:
                waiter.set((message[2], message[3], arrays))
        elif kind == "response":
            self._deliver(message[1], message[2], message[3], arrays)
        elif kind == "reply":
            waiter = process.waiters.pop(("ready", message[1]), None)
            if waiter is not None:
                waiter.set(message[3])
        elif kind == "ready":
            process.waiters.pop("init").set((True, ""))
        elif kind == "init_failed":
            process.waiters.pop("init").set((False, message[1]))
        elif kind == "finalized":
            waiter = process.waiters.pop("finalized", None)
            if waiter is not None:
                waiter.set(message[1])
        elif kind == "log":
            relay_log(message, (self.identity.model_name, str(self.identity.version)), self._logged_requests)
        elif kind == "metric":
            entry = process.series.get(message[1])
            if entry is not None:
                with contextlib.suppress(ValueError):
                    getattr(entry[1], message[2])(message[3])
        elif kind == "release_series":
            entry = process.series.pop(message[1], None)
            if entry is not None:
                entry[0].release_series(entry[1])
        elif kind == "release_family":
            family = process.families.pop(message[1], None)
            if family is not None:
                self._metrics.release_family(family)
        elif kind == "call":
            self._call(process, message[1], message[2], message[3])
        elif kind == "bls":
            self._start_thread(self._serve_bls, process, message, arrays, name="trident-bls")
        elif kind == "bls_cancel":
            call = process.bls.get(message[1])
            if call is not None:
                call.cancel()

    def _deliver(self, rid: int, meta: Any, final: bool, arrays: list[np.ndarray]) -> None:
        with self._lock:
            request = self._inflight.get(rid)
            if request is not None and final and rid not in self._executing:
                self._inflight.pop(rid, None)
                self._owner.pop(rid, None)
        if request is None or request.responder is None:
            return
        if isinstance(meta, InferenceResponse):
            response: InferenceResponse | None = meta
        else:
            response = None if meta is None else wire.response_from_wire(meta, arrays)
        with contextlib.suppress(TritonError):
            request.responder.send(response, final, blocking=False)  # the reader thread serves every request

    def _reply(self, process: _Process, call_id: int, ok: bool, value: Any) -> None:
        with contextlib.suppress(wire.ChannelClosed):
            process.channel.send(("reply", call_id, ok, value))

    def _call(self, process: _Process, call_id: int, op: str, args: tuple[Any, ...]) -> None:
        if op in ("load_model", "unload_model", "is_model_ready"):
            self._start_thread(self._manage, process, call_id, op, args, name="trident-model-control")
            return
        try:
            if op == "family_acquire":
                fid, name, description, kind = args
                process.families[fid] = self._metrics.acquire_family(name, description, kind)
                value: Any = None
            elif op == "series_acquire":
                sid, fid, labels, buckets = args
                family = process.families[fid]
                process.series[sid] = (family, family.acquire_series(labels, buckets))
                value = None
            elif op == "series_get":
                value = process.series[args[0]][1].get()
            else:
                raise ValueError(f"unknown call '{op}'")
        except (ValueError, KeyError) as e:
            self._reply(process, call_id, False, str(e))
            return
        self._reply(process, call_id, True, value)

    def _manage(self, process: _Process, call_id: int, op: str, args: tuple[Any, ...]) -> None:
        if self._runtime is None:
            self._reply(process, call_id, False, f"{op} is only available to models loaded by a trident server")
            return
        try:
            value = getattr(self._runtime, op)(*args)
        except pb_utils.TritonModelException as e:
            self._reply(process, call_id, False, str(e))
            return
        self._reply(process, call_id, True, value)

    def _logged_requests(self, sent: list[tuple[Any, str]]) -> list[Any]:
        """The requests a model process's log line names ((rid, id) pairs): those in flight
        here (with their traces), else their ids."""
        with self._lock:
            return [self._inflight.get(rid) or _Finished(rid_id) for rid, rid_id in sent]

    def _serve_bls(self, process: _Process, message: Any, arrays: list[np.ndarray]) -> None:
        _, call_id, meta, decoupled, parent_ids, *rest = message
        try:
            if self._runtime is None or self._server is None:
                raise TritonError(Code.UNSUPPORTED, "BLS is only available to models loaded by a trident server")
            from trident.backends.python._runtime import BlsCall, bls_trace

            with self._lock:
                parents = [self._inflight[rid] for rid in parent_ids if rid in self._inflight]
                named = self._inflight.get(rest[0]) if rest and rest[0] is not None else None
            request = wire.request_from_wire(meta, arrays)
            request.trace = bls_trace(parents, named)
            call = BlsCall(self._server, self._runtime.token, request, decoupled, parents, convert=lambda r: r,
                           threads=self._threads)
            process.bls[call_id] = call
            for response in call.start():
                out: list[np.ndarray] = []
                process.channel.send(("bls_response", call_id, wire.response_to_wire(response, out)), out)
            process.channel.send(("bls_end", call_id))
        except TritonError as e:
            with contextlib.suppress(wire.ChannelClosed):
                out = []
                error = wire.response_to_wire(InferenceResponse(error=e), out)
                process.channel.send(("bls_response", call_id, error), out)
                process.channel.send(("bls_end", call_id))
        except wire.ChannelClosed:
            pass
        finally:
            process.bls.pop(call_id, None)

    # ---- cancellation watcher ----------------------------------------------------------------

    def _watch_cancellations(self) -> None:
        """Tell the model process about each request cancelled while it works on it (the
        requests' ``on_cancel`` queue their ids; the send happens here, off the thread that
        cancelled, which is often the event loop). Ends at :meth:`finalize`."""
        while True:
            try:
                rid = self._cancelled.get(timeout=REGION_RELEASE_SECS)
            except queue.Empty:
                self._release_regions()
                continue
            if rid is None:
                return
            with self._lock:
                process = self._owner.get(rid) if rid in self._inflight else None
            if process is not None and process.alive:
                with contextlib.suppress(wire.ChannelClosed):
                    process.channel.send(("cancelled", rid))

    def _release_regions(self) -> None:
        """Let the model process unmap the client regions unregistered since its last message."""
        process = self._process
        if process is not None and process.alive:
            with contextlib.suppress(wire.ChannelClosed):
                process.channel.release_regions()

    # ---- ModelInstance ---------------------------------------------------------------------

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        """Run a batch in the model process and wait for its answer.

        Raises TritonError: the model's error (INTERNAL, ...) as the in-process backend does;
        INTERNAL when the process dies while executing or exceeds the execute timeout (then it
        is killed); either way the process is restarted for the next batch.
        """
        process = self._process
        if process is None or not process.alive:
            process = self._start_process()
        batch = next(self._ids)
        arrays: list[np.ndarray] = []
        metas = []
        rids = []
        for request in requests:
            rid = next(self._ids)
            meta = wire.request_to_wire(request, arrays)
            meta["rid"] = rid
            if request.trace is not None:  # its W3C context, for request.trace().get_context()
                meta["trace"] = _trace_context(request.trace)
            metas.append(meta)
            rids.append(rid)
        waiter = process.waiters[batch] = _Waiter()
        with self._lock:
            for rid, request in zip(rids, requests, strict=True):
                self._inflight[rid] = request
                self._owner[rid] = process
                self._executing.add(rid)
        for rid, request in zip(rids, requests, strict=True):
            request.on_cancel(functools.partial(self._cancelled.put, rid))
        try:
            try:
                if not process.alive:
                    raise wire.ChannelClosed("the process is gone")
                process.channel.send(("execute", batch, metas), arrays)
            except wire.ChannelClosed:
                if not waiter.event.wait(2):  # the reader reports the exit, unless it already has
                    waiter.set(("died", f"model instance '{self.identity.instance_name}' process "
                                        f"(pid {process.pid}) is gone", []))
            timeout = self._options.execute_timeout or None
            if not waiter.event.wait(timeout):
                process.waiters.pop(batch, None)
                process.alive = False  # the next batch waits for the restarted process
                log.error("model instance '%s' did not finish execute within %s s; killing process %d",
                          self.identity.instance_name, timeout, process.pid)
                process.popen.kill()
                raise internal(
                    f"model instance '{self.identity.instance_name}' did not finish execute within {timeout} s "
                    f"(TRIDENT_EXECUTE_TIMEOUT_SECS); its process was killed and is being restarted"
                )
            kind, payload, out = waiter.value
            if kind == "responses":  # the requests the model answers later through its sender
                payload, deferred = payload
                for rid, request in zip(rids, requests, strict=True):
                    if rid in deferred and request.responder is not None:
                        request.responder.deferred = True
        finally:
            with self._lock:
                for rid, request in zip(rids, requests, strict=True):
                    self._executing.discard(rid)
                    done = request.responder is None or request.responder.complete
                    answered_later = self.decoupled or bool(request.responder is not None
                                                            and getattr(request.responder, "deferred", False))
                    returned = waiter.value is not None and waiter.value[0] in ("none", "responses")
                    if not answered_later or done or not returned:
                        self._inflight.pop(rid, None)
                        self._owner.pop(rid, None)
        if kind == "died":
            raise internal(f"{payload} while executing the request(s); it is being restarted")
        if kind == "error":
            raise TritonError(Code[payload[0]], payload[1])
        if not process.alive and process.exit_message:  # it died right after execute returned
            self._fail_orphans(process)
        if kind == "none":
            return None
        return [wire.response_from_wire(meta, out) for meta in payload]

    def is_ready(self) -> bool:
        """Asks the process (the model's ``is_ready``); False while it is down or after 5 s."""
        process = self._process
        if process is None or not process.alive:
            return False
        call_id = next(self._ids)
        waiter = process.waiters[("ready", call_id)] = _Waiter()
        try:
            process.channel.send(("is_ready", call_id))
        except wire.ChannelClosed:
            return False
        if not waiter.event.wait(READY_TIMEOUT_SECS):
            process.waiters.pop(("ready", call_id), None)
            return False
        return waiter.value is True

    def finalize(self) -> None:
        """Run the model's ``finalize`` in the process, then stop it (killed after 30 s).

        Raises TritonError(INTERNAL) when ``finalize`` raised.
        """
        with self._lock:
            self._closing = True
        self._cancelled.put(None)
        with self._start_lock:  # a restart in progress finishes first (and none starts after)
            process = self._process
        error = None
        if process is not None and process.alive:
            waiter = process.waiters["finalized"] = _Waiter()
            try:
                process.channel.send(("finalize",))
                if waiter.event.wait(FINALIZE_TIMEOUT_SECS):
                    value = waiter.value
                    error = value if isinstance(value, str) else None
            except wire.ChannelClosed:
                pass
            process.channel.close()
            _stop(process)
            if process.reader is not None:
                process.reader.join(10)
        if error:
            raise internal(f"finalize of model '{self.identity.model_name}' failed: {error}")
