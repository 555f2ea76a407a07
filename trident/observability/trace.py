"""Trace settings (the trace extension): global values and per-model overrides.

Values are kept in Triton's wire form: ``trace_level`` a list of strings, the others strings.
A per-model key set to ``None`` falls back to the global value. This module validates and
stores the settings that GET/POST ``/v2[/models/<m>]/trace/setting`` and the TraceSetting RPC
read and change.
"""

from __future__ import annotations

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


def parse_trace_config(entries: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--trace-config`` values as (trace setting changes, OpenTelemetry settings).

    ``<key>=<value>`` sets rate, level (repeatable), count or mode; ``triton,file=...`` and
    ``triton,log-frequency=...`` the trace file; ``opentelemetry,url=...`` (and resource,
    bsp_*) the exporter. Raises ValueError for a bad entry, and when the OpenTelemetry mode is
    asked for without the opentelemetry packages.
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
