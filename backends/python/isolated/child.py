"""The model process: ``python -m trident.backends.python.isolated.child SOCK IN_RING OUT_RING SIZE``.

Started by :class:`~trident.backends.python.isolated.parent.IsolatedInstance` with the socket
and both ring ``memfd`` s inherited. The main thread runs model code (``initialize``,
``execute``, ``finalize``, ``auto_complete_config``) one message at a time; a reader thread
receives messages, answers ``is_ready`` and routes replies to the model's pending calls
(BLS, model management, metrics). The process exits when the server closes the connection.

Model code sees the same ``pb_utils`` as in-process models: this process runs a
:class:`~trident.backends.python.backend.PythonInstance` whose runtime
(:class:`ChildRuntime`) forwards BLS and friends to the server. ``request.is_cancelled()`` is
a local flag the server sets by message (it polls its requests every 10 ms).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trident.backends.metrics import COUNTER, GAUGE, HISTOGRAM, MetricError
from trident.backends.python import _convert, pb_utils
from trident.backends.python.isolated import channel as wire
from trident.errors import Code, TritonError, internal
from trident.observability.logs import SERVING_KEY, ModelCall
from trident.observability.trace import parse_traceparent
from trident.types import InferenceRequest, InferenceResponse

_END = object()


class _Waiter:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class _Flag:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False


class ChildRequest(InferenceRequest):
    """A request inside the model process; ``cancelled`` is set by the server's messages."""

    rid: int = 0
    flag: _Flag | None = None  # shared with the responder (which holds no reference to the request)

    @property  # type: ignore[override]
    def cancelled(self) -> bool:
        return self.flag is not None and self.flag.value

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        if self.flag is None:
            self.flag = _Flag()
        self.flag.value = bool(value)


class ChildResponder:
    """``request.responder`` in the model process: responses go to the server by message.

    It refers to the request's rid and cancel flag, not the request: no reference cycle, so a
    finished request (and its input tensors, which may be views of a client's shared memory)
    is freed as soon as the model lets go of it, not at the next garbage collection."""

    def __init__(self, process: ModelProcess, request: ChildRequest) -> None:
        self._process = process
        self._rid = request.rid
        if request.flag is None:
            request.flag = _Flag()
        self._flag = request.flag
        self.complete = False
        self.deferred = False  # a non-decoupled request answered through the sender after execute

    def is_cancelled(self) -> bool:
        return self._flag.value

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        """Raises TritonError(INTERNAL) after the final response or when the server is gone."""
        if self.complete:
            raise internal("the request has already been completed (a final response was sent)")
        if final:
            self.complete = True
        arrays: list[np.ndarray] = []
        meta = None if response is None else wire.response_to_wire(response, arrays)
        try:
            self._process.channel.send(("response", self._rid, meta, final), arrays)
        except wire.ChannelClosed as e:
            raise internal(f"the server connection is closed: {e}") from None
        if final:
            self._process.requests.pop(self._rid, None)


class _BlsStream:
    def __init__(self, process: ModelProcess, call_id: int) -> None:
        self._process = process
        self._call_id = call_id
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = False

    def __iter__(self) -> _BlsStream:
        return self

    def __next__(self) -> pb_utils.InferenceResponse:
        if self._done:
            raise StopIteration
        item = self.queue.get()
        if item is _END:
            self._done = True
            self._process.streams.pop(self._call_id, None)
            raise StopIteration
        return _convert.to_pb_response(item)

    def cancel(self) -> None:
        if not self._done:
            self._process.notify(("bls_cancel", self._call_id))


class _SeriesProxy:
    def __init__(self, process: ModelProcess, sid: int, kind: int) -> None:
        self._process = process
        self.sid = sid
        self.kind = kind

    def _update(self, op: str, value: float, allowed: tuple[int, ...], why: str) -> None:
        if self.kind not in allowed:
            raise MetricError(why)
        if op == "increment" and self.kind == COUNTER and value < 0:
            raise MetricError("a counter metric cannot be incremented by a negative value")
        self._process.notify(("metric", self.sid, op, value))

    def increment(self, value: float) -> None:
        self._update("increment", value, (COUNTER, GAUGE),
                     "increment() is not supported for a histogram metric; use observe()")

    def set(self, value: float) -> None:
        self._update("set", value, (GAUGE,), "set() is only supported for a gauge metric")

    def observe(self, value: float) -> None:
        self._update("observe", value, (HISTOGRAM,), "observe() is only supported for a histogram metric")

    def get(self) -> float:
        if self.kind == HISTOGRAM:
            raise MetricError("value() is not supported for a histogram metric")
        return float(self._process.call_metrics("series_get", self.sid))


class _FamilyProxy:
    def __init__(self, process: ModelProcess, fid: int, kind: int) -> None:
        self._process = process
        self.fid = fid
        self.kind = kind

    def acquire_series(self, labels: dict[str, str] | None, buckets: list[float] | None = None) -> _SeriesProxy:
        sid = next(self._process.ids)
        self._process.call_metrics("series_acquire", (sid, self.fid, labels, buckets))
        return _SeriesProxy(self._process, sid, self.kind)

    def release_series(self, series: _SeriesProxy) -> None:
        self._process.notify(("release_series", series.sid))


class ChildMetrics:
    def __init__(self, process: ModelProcess) -> None:
        self._process = process

    def acquire_family(self, name: str, description: str, kind: int) -> _FamilyProxy:
        fid = next(self._process.ids)
        self._process.call_metrics("family_acquire", (fid, name, description, kind))
        return _FamilyProxy(self._process, fid, kind)

    def release_family(self, family: _FamilyProxy) -> None:
        self._process.notify(("release_family", family.fid))


class ChildRuntime(pb_utils._Runtime):
    """``pb_utils``' server side in the model process: everything goes to the server."""

    def __init__(self, process: ModelProcess) -> None:
        self._process = process
        self._metrics = ChildMetrics(process)

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool,
            parents: Sequence[Any]) -> _BlsStream:
        process = self._process
        call_id = next(process.ids)
        stream = _BlsStream(process, call_id)
        try:
            converted = _convert.to_request(request)
        except TritonError as e:
            stream.queue.put(InferenceResponse(error=e))
            stream.queue.put(_END)
            return stream
        arrays: list[np.ndarray] = []
        meta = wire.request_to_wire(converted, arrays)
        parent_ids = [p.rid for p in parents if isinstance(p, ChildRequest)]
        named = getattr(request.trace(), "_source", None)  # trace=request.trace(): whose trace it continues
        trace_rid = named.rid if isinstance(named, ChildRequest) else None
        process.streams[call_id] = stream
        try:
            process.channel.send(("bls", call_id, meta, decoupled, parent_ids, trace_rid), arrays)
        except wire.ChannelClosed:
            stream.queue.put(InferenceResponse(error=TritonError(Code.UNAVAILABLE, "the server is gone")))
            stream.queue.put(_END)
        return stream

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._process.call("load_model", model_name, config, files)

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._process.call("unload_model", model_name, unload_dependents)

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        return bool(self._process.call("is_model_ready", model_name, model_version))

    def metrics(self) -> ChildMetrics:
        return self._metrics


class _ForwardLogs(logging.Handler):
    """Sends the model's log records to the server, which writes them in its own format:
    ``("log", level, message, (path, line, function), requests, exception text)``, requests
    being the (rid, id) of the requests of the call that logged it (pb_utils.Logger), or None."""

    def __init__(self, process: ModelProcess) -> None:
        super().__init__()
        self._process = process

    def emit(self, record: logging.LogRecord) -> None:
        try:
            call = record.__dict__.get(SERVING_KEY)
            requests = None
            if isinstance(call, ModelCall):
                requests = [(getattr(r, "rid", None), str(getattr(r, "id", "") or "")) for r in call.requests]
            exc_text = logging.Formatter().formatException(record.exc_info) if record.exc_info else None
            self._process.notify(("log", record.levelno, record.getMessage(),
                                  (record.pathname, record.lineno, record.funcName), requests, exc_text))
        except Exception:  # logging must never raise into model code
            pass


class ModelProcess:
    """The model side of one instance (see the module docstring)."""

    def __init__(self, channel: wire.Channel) -> None:
        self.channel = channel
        self.ids = itertools.count(1)
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiters: dict[int, _Waiter] = {}
        self.streams: dict[int, _BlsStream] = {}
        self.requests: dict[int, ChildRequest] = {}
        self.runtime = ChildRuntime(self)
        self.instance: Any = None

    # ---- calls to the server ----

    def notify(self, message: Any) -> None:
        try:
            self.channel.send(message)
        except wire.ChannelClosed:
            pass

    def call(self, op: str, *args: Any) -> Any:
        """A round trip to the server; raises TritonModelException with its error message."""
        call_id = next(self.ids)
        waiter = self.waiters[call_id] = _Waiter()
        try:
            self.channel.send(("call", call_id, op, args))
        except wire.ChannelClosed:
            self.waiters.pop(call_id, None)
            raise pb_utils.TritonModelException("the server connection is closed") from None
        waiter.event.wait()
        ok, value = waiter.value
        if not ok:
            raise pb_utils.TritonModelException(value)
        return value

    def call_metrics(self, op: str, args: Any) -> Any:
        try:
            return self.call(op, *(args if isinstance(args, tuple) else (args,)))
        except pb_utils.TritonModelException as e:
            raise MetricError(str(e)) from None

    # ---- reading ----

    def read_forever(self) -> None:
        while True:
            try:
                got = self.channel.recv()
            except wire.UnreadableTensors as e:
                self._unreadable(e.message, e.reason)
                continue
            if got is None:  # the server closed the connection (or died): nothing left to do
                os._exit(0)
            self._route(*got)
            del got  # hold no tensors while waiting (a view would keep a region mapped)

    def _route(self, message: Any, arrays: list[np.ndarray]) -> None:
        """One message from the server (reader thread): model work is queued for the main
        thread, the rest is handled here."""
        kind = message[0]
        if kind in ("init", "execute", "finalize", "auto_complete"):
            self.work.put((message, arrays))
        elif kind == "reply":
            waiter = self.waiters.pop(message[1], None)
            if waiter is not None:
                waiter.value = (message[2], message[3])
                waiter.event.set()
        elif kind == "bls_response":
            stream = self.streams.get(message[1])
            if stream is not None:
                stream.queue.put(wire.response_from_wire(message[2], arrays))
        elif kind == "bls_end":
            stream = self.streams.get(message[1])
            if stream is not None:
                stream.queue.put(_END)
        elif kind == "cancelled":
            request = self.requests.get(message[1])
            if request is not None:
                request.cancel()
        elif kind == "is_ready":
            threading.Thread(target=self._answer_ready, args=(message[1],), daemon=True).start()

    def _unreadable(self, message: Any, reason: str) -> None:
        """A message whose tensors cannot be read (a bad shared-memory reference): fail what it
        carried rather than run the model on it."""
        kind = message[0] if isinstance(message, tuple) and message else None
        if kind == "execute":
            self.notify(("executed", message[1], "error", ("INTERNAL", reason)))
        elif kind == "bls_response":
            stream = self.streams.get(message[1])
            if stream is not None:
                stream.queue.put(InferenceResponse(error=internal(reason)))
        else:
            self.notify(("log", logging.ERROR, f"model process: a '{kind}' message was dropped: {reason}"))

    def _answer_ready(self, call_id: int) -> None:
        instance = self.instance
        ready = bool(instance is not None and instance.is_ready())
        self.notify(("reply", call_id, True, ready))

    # ---- model code, on the main thread ----

    def serve(self) -> None:
        threading.Thread(target=self.read_forever, name="trident-child-reader", daemon=True).start()
        while True:
            message, arrays = self.work.get()
            kind = message[0]
            if kind == "init":
                self._init(*message[1:])
            elif kind == "auto_complete":
                self._auto_complete(*message[1:])
            elif kind == "execute":
                self._execute(message[1], message[2], arrays)
            elif kind == "finalize":
                self._finalize()
                return
            del message, arrays  # hold no tensors while waiting (a view would keep a region mapped)

    def _init(self, model_file: str, identity: dict[str, Any], args: dict[str, str], level: int) -> None:
        from trident.backends.python._execution import InstanceIdentity
        from trident.backends.python.backend import load_in_this_process

        logging.getLogger("trident.model").setLevel(level)  # forward only what the server logs

        pb_utils._set_default_runtime(self.runtime)
        try:
            ident = InstanceIdentity(**identity)
            self.instance = load_in_this_process(Path(model_file), ident, args, self.runtime)
        except TritonError as e:
            self.notify(("init_failed", e.message))
            return
        except BaseException as e:  # a bug of ours: report it rather than hang the server
            self.notify(("init_failed", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
            return
        self.notify(("ready", os.getpid()))

    def _auto_complete(self, model_file: str, name: str, current: dict[str, Any]) -> None:
        from trident.backends.python.backend import complete_config

        try:
            self.notify(("completed", True, complete_config(Path(model_file), name, current)))
        except TritonError as e:
            self.notify(("completed", False, e.message))

    def _execute(self, batch: int, metas: list[dict[str, Any]], arrays: list[np.ndarray]) -> None:
        requests = []
        for meta in metas:
            request = wire.request_from_wire(meta, arrays, ChildRequest)
            assert isinstance(request, ChildRequest)
            request.rid = meta["rid"]
            if meta.get("trace"):  # the server's request's W3C context (request.trace().get_context())
                request.trace = parse_traceparent(*meta["trace"])
            request.responder = ChildResponder(self, request)
            self.requests[request.rid] = request
            requests.append(request)
        decoupled = self.instance.decoupled
        try:
            responses = self.instance.execute(requests)
        except TritonError as e:
            self._forget(requests, decoupled, failed=True)
            self.notify(("executed", batch, "error", (e.code.name, e.message)))
            return
        except BaseException as e:
            self._forget(requests, decoupled, failed=True)
            self.notify(("executed", batch, "error", ("INTERNAL", f"{type(e).__name__}: {e}")))
            return
        self._forget(requests, decoupled, failed=False)
        if responses is None:
            self.notify(("executed", batch, "none", None))
            return
        out: list[np.ndarray] = []
        wired = [wire.response_to_wire(r, out) for r in responses]
        deferred = [r.rid for r in requests if r.responder.deferred]
        try:
            self.channel.send(("executed", batch, "responses", (wired, deferred)), out)
        except wire.ChannelClosed:
            pass

    def _forget(self, requests: list[ChildRequest], decoupled: bool, failed: bool) -> None:
        for request in requests:
            open_ = decoupled or request.responder.deferred
            if failed or not open_ or request.responder.complete:
                self.requests.pop(request.rid, None)

    def _finalize(self) -> None:
        error = None
        if self.instance is not None:
            try:
                self.instance.finalize()
            except TritonError as e:
                error = e.message
        self.notify(("finalized", error))


def main(argv: list[str]) -> None:
    sock_fd, in_fd, out_fd, size = (int(a) for a in argv[:4])
    # Ctrl-C reaches the whole process group: the server finalizes this process itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [model process] %(name)s: %(message)s")
    sock = socket.socket(fileno=sock_fd)
    channel = wire.Channel(sock, out_ring=wire.Ring(out_fd, size), in_ring=wire.Ring(in_fd, size))
    process = ModelProcess(channel)
    model_log = logging.getLogger("trident.model")
    model_log.addHandler(_ForwardLogs(process))
    model_log.propagate = False
    process.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
