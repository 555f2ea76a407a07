"""Logging in Triton's formats (and JSON), with the settings the logging extension reads and
changes live, and the request context every line written while serving a request carries.

Format ``default``: ``I1130 02:29:33.123456 4242 repository.py:123] message`` (level letter,
MMDD, time, pid, source). ``ISO8601``: ``2026-11-30T02:29:33Z I 4242 repository.py:123] message``.
``json``: one JSON object per line, ``{"time": "2026-11-30T02:29:33.123456Z", "level": "INFO",
"pid": 4242, "file": "repository.py:123", "message": ...}``, an exception's traceback in its
``"exception"`` key (never on lines of its own). Verbose messages (logged at :data:`VERBOSE`
with ``extra={"verbose": n}``) show when ``log_verbose_level >= n``.

**Request context.** A line written while a request is served names it: the text formats put
``[model=add_sub:1 request=42]`` in front of the message, JSON adds ``"model"``,
``"model_version"``, ``"request_id"`` and ``"trace_id"`` keys. What is being served is read from
the context variable :data:`serving` (set per request by the front ends) or from a record's ``trident_serving`` attribute (``extra=``: the
Python backend's ``pb_utils.Logger`` passes the model call it runs, a :class:`ModelCall`).
Nothing is formatted until a line is written: serving a request costs one context-variable
set and reset.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, NamedTuple

from trident.errors import invalid_arg, unsupported

VERBOSE = 5
logging.addLevelName(VERBOSE, "VERBOSE")

_LETTERS = {logging.ERROR: "E", logging.WARNING: "W", logging.INFO: "I", VERBOSE: "I", logging.CRITICAL: "E"}
FORMATS = ("default", "ISO8601", "json")

#: what is being served in this task or thread: a :class:`Serving` (anything with
#: ``model_name``, ``model_version``, ``id`` and ``trace``), a :class:`ModelCall`, or None. trio
#: copies it into child tasks and ``trio.to_thread.run_sync`` threads (and ``trio.from_thread``
#: back into trio), so the lines a request causes anywhere below its task carry it.
serving: ContextVar[Any] = ContextVar("trident_serving", default=None)
#: the LogRecord attribute (``extra={SERVING_KEY: ...}``) that names the request(s) of a line
#: written elsewhere (a model process's line, relayed by the server), instead of :data:`serving`
SERVING_KEY = "trident_serving"
MAX_IDS = 8  # request ids a line of a batch names (then the batch size says how many there were)
_MAX_ID_CHARS = 128  # an id longer than this is cut on the line (a client chooses it)
_NONE: Any = object()


class Serving(NamedTuple):
    """What :data:`serving` holds for a request: its names, not the request itself (a context
    outlives its task in the tasks and threads started meanwhile, and must not keep a request's
    tensors, or a client's shared memory, alive)."""

    model_name: str
    model_version: str
    id: str
    trace: Any


def serving_of(request: Any) -> Serving:
    """The :data:`serving` value of ``request`` (an InferenceRequest)."""
    return Serving(request.model_name, request.model_version, request.id, request.trace)


class ModelCall(NamedTuple):
    """A model call that serves ``requests`` (a batch): the Python backend's execute."""

    model_name: str
    model_version: str
    requests: Any  # a sequence of objects with ``id`` (and ``trace``)


class _Context(NamedTuple):
    model: str
    version: str
    ids: list[str]  # the client's ids ("" for a request without one), at most MAX_IDS
    batch: int  # requests served (1: a single request; 0: a model call for none, e.g. initialize)
    trace_ids: list[str]  # W3C trace ids of the requests, distinct, at most MAX_IDS


def _trace_id(trace: Any) -> str:
    """The W3C trace id (32 hex digits) of a request's trace or trace context, "" if none."""
    if trace is None:
        return ""
    try:
        return str(trace.trace_id or "")
    except Exception:  # noqa: BLE001 - a line is never lost over its context
        return ""


def describe(value: Any) -> _Context | None:
    """The request context of ``value`` (what :data:`serving` holds), None for nothing."""
    if value is None:
        return None
    if isinstance(value, ModelCall):
        requests = list(value.requests)
        traces: list[str] = []
        for r in requests:
            t = _trace_id(getattr(r, "trace", None))
            if t and t not in traces and len(traces) < MAX_IDS:
                traces.append(t)
        return _Context(value.model_name, str(value.model_version),
                        [str(getattr(r, "id", "") or "") for r in requests[:MAX_IDS]], len(requests), traces)
    name = getattr(value, "model_name", None)
    if name is None:
        return None
    trace = _trace_id(getattr(value, "trace", None))
    return _Context(str(name), str(getattr(value, "model_version", "") or ""), [str(getattr(value, "id", "") or "")],
                    1, [trace] if trace else [])


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_ID_CHARS else text[:_MAX_ID_CHARS] + "..."


def _text_id(text: str) -> str:
    """An id as the text formats show it: as is when plain, else quoted with escapes (an id
    cannot break the line, or fake a context)."""
    text = _cut(text)
    if text and text.isprintable() and not any(c in text for c in " []\"'"):
        return text
    return json.dumps(text)


def text_prefix(ctx: _Context) -> str:
    """``[model=add_sub:1 request=42] `` (see the module docstring); a batch:
    ``[model=add_sub:1 batch=3 requests=a,b,c] ``; a request without an id names its model only."""
    model = _text_id(ctx.model) + (f":{_text_id(ctx.version)}" if ctx.version else "")
    if ctx.batch == 0:
        return f"[model={model}] "
    if ctx.batch == 1:
        rid = ctx.ids[0] if ctx.ids else ""
        return f"[model={model} request={_text_id(rid)}] " if rid else f"[model={model}] "
    ids = ",".join(_text_id(i) if i else "<id_unknown>" for i in ctx.ids)
    more = ",..." if ctx.batch > len(ctx.ids) else ""
    return f"[model={model} batch={ctx.batch} requests={ids}{more}] "


def _json_context(ctx: _Context, out: dict[str, Any]) -> None:
    out["model"] = ctx.model
    if ctx.version:
        out["model_version"] = ctx.version
    if ctx.batch == 0:
        return
    if ctx.batch == 1:
        if ctx.ids and ctx.ids[0]:
            out["request_id"] = _cut(ctx.ids[0])
        if ctx.trace_ids:
            out["trace_id"] = ctx.trace_ids[0]
        return
    out["batch_size"] = ctx.batch
    out["request_ids"] = [_cut(i) for i in ctx.ids]
    if ctx.trace_ids:
        out["trace_ids"] = ctx.trace_ids


def _level_name(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "ERROR"
    if levelno >= logging.WARNING:
        return "WARNING"
    return "INFO" if levelno >= logging.INFO else "VERBOSE"


def _record_context(record: logging.LogRecord) -> _Context | None:
    value = record.__dict__.get(SERVING_KEY, _NONE)
    if value is _NONE:
        value = serving.get()
    try:
        return describe(value)
    except Exception:  # noqa: BLE001 - a line is never lost over its context
        return None


class TritonFormatter(logging.Formatter):
    """Formats a record in one of :data:`FORMATS`, with its request context."""

    def __init__(self, fmt: str = "default") -> None:
        super().__init__()
        self.style_name = fmt

    def format(self, record: logging.LogRecord) -> str:
        if self.style_name == "json":
            return self.format_json(record)
        letter = _LETTERS.get(record.levelno, "I")
        source = f"{record.filename}:{record.lineno}"
        message = record.getMessage()
        ctx = _record_context(record)
        if ctx is not None:
            message = text_prefix(ctx) + message
        exception = self._exception(record)
        if exception:
            message = message + "\n" + exception
        if self.style_name == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {record.process} {source}] {message}"
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        return f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {time.strftime('%H:%M:%S', t)}.{micros:06d} {record.process} {source}] {message}"

    def _exception(self, record: logging.LogRecord) -> str:
        """The record's traceback text ("" without one); a relayed record (a model process's)
        brings it as ``exc_text``."""
        if record.exc_info:
            return self.formatException(record.exc_info)
        return record.exc_text or ""

    def format_json(self, record: logging.LogRecord) -> str:
        """One JSON object, one line (newlines inside values are escaped)."""
        micros = int((record.created % 1) * 1_000_000)
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{micros:06d}Z",
            "level": _level_name(record.levelno),
            "pid": record.process,
            "file": f"{record.filename}:{record.lineno}",
            "message": record.getMessage(),
        }
        ctx = _record_context(record)
        if ctx is not None:
            _json_context(ctx, out)
        exception = self._exception(record)
        if exception:
            out["exception"] = exception
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


class _LevelFilter(logging.Filter):
    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        if record.levelno >= logging.ERROR:
            return s.log_error
        if record.levelno >= logging.WARNING:
            return s.log_warning
        if record.levelno >= logging.INFO:
            return s.log_info
        return s.log_verbose_level >= int(getattr(record, "verbose", 1))


class LogSettings:
    """The live logging settings of one server (GET/POST /v2/logging, LogSettings RPC)."""

    KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")

    def __init__(self, *, log_info: bool = True, log_warning: bool = True, log_error: bool = True,
                 log_verbose_level: int = 0, log_format: str = "default", log_file: str = "") -> None:
        self.log_info = log_info
        self.log_warning = log_warning
        self.log_error = log_error
        self.log_verbose_level = log_verbose_level
        self.log_format = log_format
        self.log_file = log_file
        self._handler: logging.Handler | None = None
        self._before: tuple[int, bool] | None = None  # the trident logger's level and propagation

    @classmethod
    def from_options(cls, options: Any) -> LogSettings:
        return cls(log_info=options.log_info, log_warning=options.log_warning, log_error=options.log_error,
                   log_verbose_level=options.log_verbose, log_format=options.log_format, log_file=options.log_file)

    def install(self) -> None:
        """Route the ``trident`` loggers through one handler with these settings."""
        handler: logging.Handler
        if self.log_file:
            handler = logging.FileHandler(self.log_file)
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TritonFormatter(self.log_format))
        handler.addFilter(_LevelFilter(self))
        root = logging.getLogger("trident")
        if self._handler is not None:
            root.removeHandler(self._handler)
        if self._before is None:
            self._before = (root.level, root.propagate)
        root.addHandler(handler)
        root.setLevel(VERBOSE if self.log_verbose_level > 0 else logging.INFO)
        root.propagate = False
        self._handler = handler

    def uninstall(self) -> None:
        """Undo :meth:`install` (an in-process server that stops): remove the handler, closing
        its log file, and give the ``trident`` loggers back their level and propagation."""
        root = logging.getLogger("trident")
        if self._handler is not None:
            root.removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        if self._before is not None:
            root.setLevel(self._before[0])
            root.propagate = self._before[1]
            self._before = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.KEYS}

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply changes; raises INVALID_ARG for a bad key or value, UNSUPPORTED for log_file."""
        for key, value in changes.items():
            if key not in self.KEYS:
                raise invalid_arg(f"unknown logging setting '{key}'")
            if value is None:
                continue
            if key == "log_file":
                raise unsupported("log file location can not be updated through network protocol")
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise invalid_arg(f"expect boolean for '{key}'")
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise invalid_arg("expect non-negative integer for 'log_verbose_level'")
            elif key == "log_format":
                if value not in FORMATS:
                    raise invalid_arg(f"invalid log format '{value}'; expect 'default', 'ISO8601' or 'json'")
        for key, value in changes.items():
            if value is not None:
                setattr(self, key, value)
        if self._handler is not None:
            self._handler.setFormatter(TritonFormatter(self.log_format))
            logging.getLogger("trident").setLevel(VERBOSE if self.log_verbose_level > 0 else logging.INFO)
        return self.as_dict()

