"""Logging in Triton's formats, with the settings the logging extension reads and changes live.

Format ``default``: ``I1130 02:29:33.123456 4242 repository.py:123] message`` (level letter,
MMDD, time, pid, source). ``ISO8601``: ``2026-11-30T02:29:33Z I 4242 repository.py:123] message``.
Verbose messages (logged at :data:`VERBOSE` with ``extra={"verbose": n}``) show when
``log_verbose_level >= n``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from trident.errors import invalid_arg, unsupported

VERBOSE = 5
logging.addLevelName(VERBOSE, "VERBOSE")

_LETTERS = {logging.ERROR: "E", logging.WARNING: "W", logging.INFO: "I", VERBOSE: "I", logging.CRITICAL: "E"}


class TritonFormatter(logging.Formatter):
    def __init__(self, fmt: str = "default") -> None:
        super().__init__()
        self.style_name = fmt

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, "I")
        source = f"{record.filename}:{record.lineno}"
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        if self.style_name == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {letter} {record.process} {source}] {message}"
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        return f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {time.strftime('%H:%M:%S', t)}.{micros:06d} {record.process} {source}] {message}"


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
        root.addHandler(handler)
        root.setLevel(VERBOSE if self.log_verbose_level > 0 else logging.INFO)
        root.propagate = False
        self._handler = handler

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
                if value not in ("default", "ISO8601"):
                    raise invalid_arg(f"invalid log format '{value}'; expect 'default' or 'ISO8601'")
        for key, value in changes.items():
            if value is not None:
                setattr(self, key, value)
        if self._handler is not None:
            self._handler.setFormatter(TritonFormatter(self.log_format))
            logging.getLogger("trident").setLevel(VERBOSE if self.log_verbose_level > 0 else logging.INFO)
        return self.as_dict()

