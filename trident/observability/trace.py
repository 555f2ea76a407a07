"""Trace settings (the trace extension): global values and per-model overrides; the W3C trace
context a client sends.

Values are kept in Triton's wire form: ``trace_level`` a list of strings, the others strings.
A per-model key set to ``None`` falls back to the global value. This module validates and
stores the settings that GET/POST ``/v2[/models/<m>]/trace/setting`` and the TraceSetting RPC
read and change, and the ``--trace-config opentelemetry,...`` settings of the span exporter.

:func:`parse_traceparent` reads a ``traceparent`` / ``tracestate`` pair (HTTP headers, gRPC
metadata) as the W3C Trace Context recommendation says: a malformed value is ignored (None),
never an error.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from trident.errors import TritonError, invalid_arg

if TYPE_CHECKING:
    from trident.options import ServerOptions

_LEVELS = {"OFF", "TIMESTAMPS", "TENSORS"}
_KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


def _normalize(key: str, value: Any) -> Any:
    if key not in _KEYS:
        raise invalid_arg(f"unknown trace setting '{key}'")
    values = value if isinstance(value, list) else [value]
    values = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    if key == "trace_level":
        for v in values:
            if v not in _LEVELS:
                raise invalid_arg(f"invalid trace level '{v}'; expect one of OFF, TIMESTAMPS, TENSORS")
        if "OFF" in values and len(values) > 1:
            raise invalid_arg("trace level 'OFF' can not be combined with other levels")
        return values
    if len(values) != 1:
        raise invalid_arg(f"trace setting '{key}' takes a single value")
    v = values[0]
    if key in ("trace_rate", "log_frequency"):
        if not v.isdigit():
            raise invalid_arg(f"unable to parse '{key}', got: {v}")
    elif key == "trace_count":
        if not (v.isdigit() or v == "-1"):
            raise invalid_arg(f"unable to parse 'trace_count', got: {v}; expect -1 or a non-negative integer")
    elif key == "trace_mode" and v not in ("triton", "opentelemetry"):
        raise invalid_arg(f"invalid trace mode '{v}'")
    return v


class TraceSettings:
    def __init__(self) -> None:
        self.global_settings: dict[str, Any] = {
            "trace_file": "",
            "trace_level": ["OFF"],
            "trace_rate": "1000",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_mode": "triton",
        }
        self.model_settings: dict[str, dict[str, Any]] = {}
        #: bumped by every change (trident.observability.tracing.Tracer re-reads the settings then)
        self.generation = 0

    @classmethod
    def from_options(cls, options: ServerOptions) -> TraceSettings:
        """Settings with ``--trace-config`` applied; raises ValueError for a bad entry."""
        settings = cls()
        changes, _ = parse_trace_config(list(options.trace_config))
        if changes:
            settings.update("", changes)
        return settings

    def get(self, model: str = "") -> dict[str, Any]:
        merged = dict(self.global_settings)
        merged.update(self.model_settings.get(model, {}))
        return merged

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply changes (``None`` clears a per-model key); raises INVALID_ARG on bad input."""
        normalized = {k: (None if v is None else _normalize(k, v)) for k, v in changes.items()}
        if model:
            own = self.model_settings.setdefault(model, {})
            for k, v in normalized.items():
                if v is None:
                    own.pop(k, None)
                else:
                    own[k] = v
        else:
            for k, v in normalized.items():
                if v is None:
                    raise invalid_arg(f"global trace setting '{k}' can not be cleared")
                self.global_settings[k] = v
        self.generation += 1
        return self.get(model)


_GLOBAL_KEYS = {"rate": "trace_rate", "level": "trace_level", "count": "trace_count", "mode": "trace_mode"}
_TRITON_KEYS = {"file": "trace_file", "log-frequency": "log_frequency", "log_frequency": "log_frequency"}
_OTEL_KEYS = {"url", "resource", "bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"}
#: the batch span processor's settings: --trace-config key -> BatchSpanProcessor argument
BSP_ARGUMENTS = {"bsp_max_queue_size": "max_queue_size", "bsp_schedule_delay": "schedule_delay_millis",
                 "bsp_max_export_batch_size": "max_export_batch_size"}
_BSP_DEFAULTS = {"bsp_max_queue_size": 2048, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 512}


def _env_default(key: str) -> int:
    """A bsp setting's value when --trace-config does not give it: the SDK's ``OTEL_BSP_*``
    variable when it holds a number, else Triton's default."""
    raw = os.environ.get("OTEL_" + key.upper(), "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else _BSP_DEFAULTS[key]


def _check_otel(otel: dict[str, str]) -> None:
    """Raises ValueError for an OpenTelemetry setting the exporter could not take."""
    for key in BSP_ARGUMENTS:
        if key in otel:
            value = otel[key]
            if not value.isdigit() or int(value) <= 0:
                raise ValueError(f"--trace-config opentelemetry,{key} expects a positive integer, got '{value}'")
    queue, batch = (int(otel.get(key) or _env_default(key)) for key in ("bsp_max_queue_size",
                                                                         "bsp_max_export_batch_size"))
    if batch > queue:
        raise ValueError(f"--trace-config opentelemetry,bsp_max_export_batch_size ({batch}) must not exceed "
                         f"bsp_max_queue_size ({queue})")
    for item in filter(None, otel.get("resource", "").split(",")):
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--trace-config opentelemetry,resource expects <key>=<value>, got '{item}'")


def parse_trace_config(entries: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--trace-config`` values as (trace setting changes, OpenTelemetry settings).

    ``<key>=<value>`` sets rate, level (repeatable), count or mode; ``triton,file=...`` and
    ``triton,log-frequency=...`` the trace file; ``opentelemetry,url=...``,
    ``opentelemetry,resource=<key>=<value>`` (repeatable, comma-joined in the result) and the
    batch span processor's ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms) and
    ``bsp_max_export_batch_size`` the exporter. Raises ValueError for a bad entry (a bsp_*
    value that is not a positive integer, an export batch larger than the queue, a resource
    entry without ``=``), and when the OpenTelemetry mode is asked for without the
    opentelemetry packages.
    """
    changes: dict[str, Any] = {}
    otel: dict[str, str] = {}
    for entry in entries:
        head, sep, value = entry.partition("=")
        section, _, key = head.rpartition(",")
        if not sep or not key:
            raise ValueError(f"--trace-config expects [<mode>,]<setting>=<value>, got '{entry}'")
        if section == "opentelemetry":
            if key not in _OTEL_KEYS:
                raise ValueError(f"unknown --trace-config opentelemetry setting '{key}'")
            if key == "resource" and otel.get("resource"):  # repeatable: each adds attributes
                value = f"{otel['resource']},{value}"
            otel[key] = value
        elif section in ("", "triton") and key in _TRITON_KEYS:
            changes[_TRITON_KEYS[key]] = value
        elif section == "" and key in _GLOBAL_KEYS:
            name = _GLOBAL_KEYS[key]
            if name == "trace_level":
                changes.setdefault(name, [])
                if value != "OFF":
                    changes[name].append(value)
            else:
                changes[name] = value
        else:
            raise ValueError(f"unknown --trace-config setting '{entry}'")
    if changes.get("trace_level") == []:
        changes["trace_level"] = "OFF"
    _check_otel(otel)
    try:
        TraceSettings().update("", changes)
    except TritonError as e:
        raise ValueError(f"--trace-config: {e.message}") from None
    if changes.get("trace_mode") == "opentelemetry":
        try:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter  # type: ignore[import-not-found]  # noqa: F401
            import opentelemetry.sdk.trace  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            raise ValueError("--trace-config mode=opentelemetry needs the opentelemetry-sdk and "
                             "opentelemetry-exporter-otlp-proto-http packages") from None
    return changes, otel


# ---- W3C trace context ---------------------------------------------------------------------

#: version 00 (exactly), or a later version (its first four fields, then more after a dash)
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
_MAX_TRACESTATE = 512  # bytes of tracestate kept (the recommendation's propagation limit)
_MAX_TRACESTATE_MEMBERS = 32
_TRACESTATE_MEMBER = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


class TraceParent:
    """A client's W3C trace context: the trace it belongs to and its span (the parent of the
    request's span), with its ``tracestate``. What the front ends put in ``request.trace``
    when a request carries a valid ``traceparent`` (see :class:`~.tracing.Tracer.sample`)."""

    __slots__ = ("trace_id", "span_id", "flags", "tracestate")

    def __init__(self, trace_id: str, span_id: str, flags: int, tracestate: str = "") -> None:
        self.trace_id = trace_id  # 32 lowercase hex digits
        self.span_id = span_id  # 16 lowercase hex digits
        self.flags = flags
        self.tracestate = tracestate

    def traceparent(self) -> str:
        """The ``traceparent`` value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def __repr__(self) -> str:
        return f"TraceParent({self.traceparent()!r}, tracestate={self.tracestate!r})"


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value


def parse_traceparent(traceparent: bytes | str, tracestate: bytes | str | None = None) -> TraceParent | None:
    """The context of a ``traceparent`` value (and ``tracestate``), or None when it is not
    valid: a version other than two lowercase hex digits or ``ff``, ids of the wrong length,
    not lowercase hex or all zeros, flags that are not two hex digits, version 00 with trailing
    data, a later version whose extra data does not start with ``-``. A ``tracestate`` that does
    not parse is dropped (the context is kept without it). Never raises."""
    value = _text(traceparent).strip(" \t")
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "00000000000000000000000000000000" or span_id == "0000000000000000":
        return None
    state = _tracestate(_text(tracestate)) if tracestate else ""
    return TraceParent(trace_id, span_id, int(flags, 16), state)


def _tracestate(value: str) -> str:
    """``tracestate`` as kept: its list members (``key=value``, comma-separated, at most 32),
    or "" when it is malformed or over 512 characters."""
    if len(value) > _MAX_TRACESTATE:
        return ""
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if len(members) > _MAX_TRACESTATE_MEMBERS:
        return ""
    for member in members:
        if _TRACESTATE_MEMBER.fullmatch(member) is None:
            return ""
    return ",".join(members)
